package eventlog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/schemas"
)

const childEnv = "EVENTLOG_TEST_CHILD_LOG"

func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		childWriter(path)
		return
	}
	goleak.VerifyTestMain(m)
}

// childWriter is the re-exec'd process of TestKill9: it appends events as
// fast as it can until killed, printing "ready" once the first batch is on
// disk.
func childWriter(path string) {
	w, _, err := Open(path, SyncBatch, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	rec := event.NewRecorder("child", w)
	for i := 0; ; i++ {
		rec.Emit(sampleEvent(i))
		if i == 1000 {
			if err := w.Sync(); err != nil {
				os.Exit(4)
			}
			fmt.Println("ready")
		}
	}
}

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

// sampleEvent is a plausible event for request i/10's step i%10.
func sampleEvent(i int) *event.Event {
	sid := int64(i)
	return &event.Event{Time: t0.Add(time.Duration(i) * time.Microsecond), RequestID: "r-" + strconv.Itoa(i/10),
		Slot: i % 4, Route: "shared", Event: "adopt", From: "prefilled", To: "adopted", ElapsedUS: int64(i % 5000),
		ShareID: &sid, NTokens: 512, NFDs: 56, BytesMapped: 1 << 30, Cleanup: &event.Cleanup{FDsClosed: 56, FilesRemoved: 3}}
}

func testLogger(t testing.TB) (*slog.Logger, *bytes.Buffer) {
	var buf bytes.Buffer
	var mu sync.Mutex
	h := slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug})
	return slog.New(h), &buf
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// readAll reads path with ReadFile and fails the test on error.
func readAll(t *testing.T, path string) ([]event.Event, TornTail) {
	t.Helper()
	var evs []event.Event
	torn, err := ReadFile(path, func(line int, e event.Event) error {
		if line != len(evs)+1 {
			return fmt.Errorf("line %d after %d events", line, len(evs))
		}
		evs = append(evs, e)
		return nil
	})
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	return evs, torn
}

func TestParseSyncPolicy(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want SyncPolicy
		err  error
	}{
		{"always", SyncAlways, nil}, {"batch", SyncBatch, nil}, {"off", SyncOff, nil},
		{"", 0, ErrSyncPolicy}, {"Always", 0, ErrSyncPolicy}, {"fsync", 0, ErrSyncPolicy},
	} {
		got, err := ParseSyncPolicy(tt.in)
		if got != tt.want || !errors.Is(err, tt.err) {
			t.Errorf("ParseSyncPolicy(%q) = %v, %v; want %v, %v", tt.in, got, err, tt.want, tt.err)
		}
		if err == nil && got.String() != tt.in {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncBatch, SyncOff} {
		t.Run(policy.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state", "events.jsonl")
			w, torn, err := Open(path, policy, nil)
			if err != nil || !torn.IsZero() {
				t.Fatalf("Open: %v, %+v", err, torn)
			}
			mem := new(event.Mem)
			rec := event.NewRecorder("n1", w, mem)
			for i := range 500 {
				rec.Emit(sampleEvent(i))
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			got, torn := readAll(t, path)
			want := mem.Events()
			if !torn.IsZero() || len(got) != len(want) {
				t.Fatalf("read %d events (torn %+v), want %d", len(got), torn, len(want))
			}
			for i := range want {
				if string(got[i].AppendJSON(nil)) != string(want[i].AppendJSON(nil)) {
					t.Fatalf("event %d:\n got %s\nwant %s", i, got[i].AppendJSON(nil), want[i].AppendJSON(nil))
				}
			}
			st := w.Stats()
			if st.Events != 500 || st.Dropped != 0 || st.WriteErrors != 0 || st.Syncs == 0 {
				t.Fatalf("stats %+v", st)
			}
			fi, _ := os.Stat(path)
			di, _ := os.Stat(filepath.Dir(path))
			if fi.Mode().Perm() != 0o600 || di.Mode().Perm() != 0o700 || uint64(fi.Size()) != st.Bytes {
				t.Fatalf("file %v %d bytes, dir %v, stats %d bytes", fi.Mode(), fi.Size(), di.Mode(), st.Bytes)
			}
		})
	}
}

func TestTornTail(t *testing.T) {
	good := func(n int) []byte {
		var b []byte
		rec := event.NewRecorder("n1", event.SinkFunc(func(e *event.Event) {
			b = append(e.AppendJSON(b), '\n')
		}))
		for i := range n {
			rec.Emit(sampleEvent(i))
		}
		return b
	}
	tests := []struct {
		name   string
		good   []byte
		tail   string
		reason string
	}{
		{"empty file", nil, "", ""},
		{"clean", good(3), "", ""},
		{"partial line", good(3), `{"v":1,"boot":"ab`, "no final newline"},
		{"complete event without newline", good(2), strings.TrimSuffix(string(good(1)), "\n"), "no final newline"},
		{"garbage last line", good(3), "garbage\n", "not an event"},
		{"zero-filled tail", good(3), strings.Repeat("\x00", 5000), "no final newline"},
		{"only a torn line", nil, `{"v":1,`, "no final newline"},
		{"blank last line", good(1), "\n", "not an event"},
		{"unknown version last line", good(2), `{"v":9}` + "\n", "not an event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger, logs := testLogger(t)
			path := filepath.Join(t.TempDir(), "events.jsonl")
			content := append(append([]byte(nil), tt.good...), tt.tail...)
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
			// ReadFile sees the torn line as a warning, not an error.
			before, rtorn := readAll(t, path)
			w, torn, err := Open(path, SyncBatch, logger)
			if err != nil {
				t.Fatal(err)
			}
			if tt.tail == "" {
				if !torn.IsZero() || !rtorn.IsZero() {
					t.Fatalf("torn tail reported on a clean log: %+v %+v", torn, rtorn)
				}
			} else {
				if torn.Offset != int64(len(tt.good)) || torn.Bytes != int64(len(tt.tail)) ||
					!strings.Contains(torn.Reason, tt.reason) || torn.Path != path {
					t.Fatalf("Open torn = %+v, want offset %d bytes %d reason %q", torn, len(tt.good), len(tt.tail), tt.reason)
				}
				if rtorn.Offset != torn.Offset || rtorn.Bytes != torn.Bytes || rtorn.Line != len(before)+1 {
					t.Fatalf("ReadFile torn = %+v, Open torn = %+v", rtorn, torn)
				}
				saved, err := os.ReadFile(torn.SavedTo)
				if err != nil || string(saved) != tt.tail || !strings.HasPrefix(torn.SavedTo, path+".torn-") {
					t.Fatalf("saved aside to %q: %q, %v", torn.SavedTo, saved, err)
				}
				if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), torn.SavedTo) {
					t.Fatalf("no warning logged: %s", logs)
				}
			}
			// Appends go on after the last good line.
			rec := event.NewRecorder("n2", w)
			for i := range 3 {
				rec.Emit(sampleEvent(i))
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			after, torn2 := readAll(t, path)
			if !torn2.IsZero() || len(after) != len(before)+3 {
				t.Fatalf("after reopen: %d events (torn %+v), want %d", len(after), torn2, len(before)+3)
			}
			// A second open finds nothing torn.
			w, torn, err = Open(path, SyncOff, nil)
			if err != nil || !torn.IsZero() {
				t.Fatalf("reopen: %v %+v", err, torn)
			}
			w.Close()
		})
	}
}

func TestTornTailTwiceSameSecond(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.jsonl")
	var saved []string
	for range 3 {
		if err := os.WriteFile(path, []byte(`{"v":1`), 0o600); err != nil {
			t.Fatal(err)
		}
		w, torn, err := Open(path, SyncOff, nil)
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		saved = append(saved, torn.SavedTo)
	}
	if saved[0] == saved[1] || saved[1] == saved[2] || saved[0] == saved[2] {
		t.Fatalf("torn tails overwrote each other: %q", saved)
	}
}

func TestReadFileBadLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.jsonl")
	line := string(sampleEvent(0).AppendJSON(nil))
	line = strings.Replace(line, `"v":0`, `"v":1`, 1)
	tests := []struct {
		name    string
		content string
		err     error
		errLine string
		events  int
	}{
		{"bad middle line", line + "\n" + "nope\n" + line + "\n", ErrBadLine, "line 2", 0},
		{"blank middle line", line + "\n\n" + line + "\n", ErrBadLine, "line 2", 0},
		{"too long", line + "\n" + strings.Repeat("x", MaxLineBytes+10) + "\n", ErrLineTooLong, "line 2", 0},
		{"good", line + "\n" + line + "\n", nil, "", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			n := 0
			_, err := ReadFile(path, func(int, event.Event) error { n++; return nil })
			if !errors.Is(err, tt.err) || (err != nil && !strings.Contains(err.Error(), tt.errLine)) {
				t.Fatalf("err = %v, want %v naming %q", err, tt.err, tt.errLine)
			}
			if tt.err == nil && n != tt.events {
				t.Fatalf("%d events, want %d", n, tt.events)
			}
		})
	}
	stop := errors.New("stop")
	if _, err := ReadFile(path, func(int, event.Event) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("callback error not returned: %v", err)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "missing"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// fileLines counts the complete lines in path.
func fileLines(t *testing.T, path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte{'\n'})
}

func TestSyncPolicies(t *testing.T) {
	for _, tt := range []struct {
		policy      SyncPolicy
		immediate   bool // the line is in the file when Emit returns
		syncsBefore bool // fsyncs happen before Sync/Close
	}{
		{SyncAlways, true, true},
		{SyncBatch, false, true},
		{SyncOff, false, false},
	} {
		t.Run(tt.policy.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "events.jsonl")
			w, _, err := Open(path, tt.policy, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			rec := event.NewRecorder("n1", w)
			rec.Emit(sampleEvent(0))
			if tt.immediate {
				if n := fileLines(t, path); n != 1 {
					t.Fatalf("%d lines right after Emit, want 1", n)
				}
			}
			// Every policy gets the line to the file within FlushInterval (+ slack).
			obtest.WaitFor(t, 5*time.Second, "the line in the file", func() bool { return fileLines(t, path) == 1 })
			obtest.WaitFor(t, 5*time.Second, "stats", func() bool {
				st := w.Stats()
				return st.Events == 1 && (st.Syncs > 0 || !tt.syncsBefore)
			})
			if got := w.Stats().Syncs > 0; got != tt.syncsBefore {
				t.Fatalf("syncs before Sync = %d", w.Stats().Syncs)
			}
			syncs := w.Stats().Syncs
			if err := w.Sync(); err != nil {
				t.Fatal(err)
			}
			if w.Stats().Syncs != syncs+1 {
				t.Fatalf("Sync did not fsync: %+v", w.Stats())
			}
		})
	}
}

func TestConcurrentEmitKeepsSeqOrder(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncBatch, SyncOff} {
		t.Run(policy.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "events.jsonl")
			w, _, err := Open(path, policy, nil)
			if err != nil {
				t.Fatal(err)
			}
			rec := event.NewRecorder("n1", w)
			goroutines, each := 16, 300
			if policy == SyncAlways { // one fsync per event
				goroutines, each = 8, 40
			}
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := range each {
						rec.Emit(sampleEvent(g*each + i))
					}
				})
			}
			wg.Wait()
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			evs, _ := readAll(t, path)
			if len(evs) != goroutines*each {
				t.Fatalf("%d events, want %d", len(evs), goroutines*each)
			}
			for i, e := range evs {
				if e.Seq != uint64(i+1) || e.Boot != rec.Boot {
					t.Fatalf("line %d has seq %d boot %s", i+1, e.Seq, e.Boot)
				}
			}
		})
	}
}

func TestSecondWriterRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.jsonl")
	w, _, err := Open(path, SyncBatch, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, _, err := Open(path, SyncBatch, nil); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := Open(filepath.Join(dir, "x.jsonl"), SyncPolicy(9), nil); !errors.Is(err, ErrSyncPolicy) {
		t.Fatalf("bad policy: %v", err)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	if _, _, err := Open(filepath.Join(file, "x.jsonl"), SyncBatch, nil); err == nil {
		t.Fatal("Open under a regular file succeeded")
	}
	if _, _, err := Open(dir, SyncBatch, nil); err == nil {
		t.Fatal("Open of a directory succeeded")
	}
}

func TestEmitAfterClose(t *testing.T) {
	logger, logs := testLogger(t)
	path := filepath.Join(t.TempDir(), "events.jsonl")
	w, _, err := Open(path, SyncBatch, logger)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w.Emit(sampleEvent(0))
	w.Emit(sampleEvent(1))
	if st := w.Stats(); st.Lost != 2 {
		t.Fatalf("stats %+v", st)
	}
	if !errors.Is(w.Close(), ErrClosed) || !errors.Is(w.Sync(), ErrClosed) {
		t.Fatal("second Close / Sync after Close not ErrClosed")
	}
	if strings.Count(logs.String(), "level=ERROR") != 1 {
		t.Fatalf("want one error line: %s", logs)
	}
}

// faultFile is the log file with injected faults: while err is set, Write
// and Allocate fail with it (after writing partial bytes of a Write, like a
// disk filling mid-write); while hold is not nil, Write blocks on it (a hung
// disk).
type faultFile struct {
	osFile
	mu      sync.Mutex
	err     error
	partial int
	hold    chan struct{}
}

func (f *faultFile) set(err error, partial int) {
	f.mu.Lock()
	f.err, f.partial = err, partial
	f.mu.Unlock()
}

func (f *faultFile) Write(p []byte) (int, error) {
	f.mu.Lock()
	err, partial, hold := f.err, f.partial, f.hold
	f.mu.Unlock()
	if hold != nil {
		<-hold
	}
	if err != nil {
		n, _ := f.osFile.Write(p[:min(partial, len(p))])
		return n, err
	}
	return f.osFile.Write(p)
}

func (f *faultFile) Allocate(off, n int64) error {
	f.mu.Lock()
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.osFile.Allocate(off, n)
}

// inject wraps w's file in a faultFile; call before w writes anything.
func inject(w *Writer) *faultFile {
	w.mu.Lock()
	defer w.mu.Unlock()
	f := &faultFile{osFile: w.f.(osFile)}
	w.f = f
	return f
}

// TestWriteErrorsCountedNotFatal injects write failures (EIO with a partial
// line written, ENOSPC): Emit goes on, every lost event is counted and
// reported through OnLoss with the running count, and once writes succeed a
// marker line names the loss, so that replay says "N events lost between
// seq A and B" instead of a silent seq gap.
func TestWriteErrorsCountedNotFatal(t *testing.T) {
	for _, tt := range []struct {
		policy SyncPolicy
		err    error
	}{
		{SyncAlways, syscall.EIO}, {SyncBatch, syscall.EIO}, {SyncAlways, syscall.ENOSPC}, {SyncBatch, syscall.ENOSPC},
	} {
		t.Run(tt.policy.String()+" "+tt.err.Error(), func(t *testing.T) {
			logger, logs := testLogger(t)
			path := filepath.Join(t.TempDir(), "events.jsonl")
			w, _, err := Open(path, tt.policy, logger)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var reports []Loss
			w.SetOnLoss(func(l Loss) { mu.Lock(); reports = append(reports, l); mu.Unlock() })
			f := inject(w)
			rec := event.NewRecorder("n1", w)
			rec.Emit(sampleEvent(0))
			_ = w.Sync()
			f.set(tt.err, 40) // the disk fails, mid-line
			for i := range 5 {
				rec.Emit(sampleEvent(1 + i))
			}
			_ = w.Sync()
			st := w.Stats()
			if st.WriteErrors == 0 || st.Lost != 5 || st.Events != 1 || w.Lost() != 5 {
				t.Fatalf("stats %+v", st)
			}
			obtest.WaitFor(t, 5*time.Second, "a loss report", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(reports) > 0
			})
			f.set(nil, 0) // the disk is back
			rec.Emit(sampleEvent(6))
			rec.Shutdown(0)
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			evs, _ := readAll(t, path)
			if len(evs) != 4 || evs[0].Seq != 1 || evs[1].Event != event.LostEvent || evs[2].Seq != 7 ||
				evs[3].Event != event.Shutdown {
				t.Fatalf("after recovery: %+v", evs)
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range bytes.SplitAfter(bytes.TrimSuffix(raw, []byte("\n")), []byte("\n")) {
				if err := schemas.Validate(schemas.KindEvent, line); err != nil {
					t.Fatalf("%s: %v", line, err)
				}
			}
			if l := evs[1].Lost; l == nil || *l != (event.Lost{Events: 5, FirstSeq: 2, LastSeq: 6}) || evs[1].Seq != 0 ||
				evs[1].Boot != rec.Boot || !strings.Contains(evs[1].Reason, tt.err.Error()) {
				t.Fatalf("marker %+v lost %+v", evs[1], evs[1].Lost)
			}
			mu.Lock()
			last := reports[len(reports)-1]
			mu.Unlock()
			if !last.Recovered || last.Events != 5 || last.FirstSeq != 2 || last.LastSeq != 6 || last.Total != 5 {
				t.Fatalf("reports %+v", reports)
			}
			rep, err := Replay(Files([]string{path}, nil), NewAuditor())
			if err != nil {
				t.Fatal(err)
			}
			named := 0
			for _, v := range rep.Violations { // sampleEvent is no legal walk: other rules fire too
				if v.Rule == RuleSeqGap {
					t.Fatalf("silent hole: %v", v)
				}
				if v.Rule == RuleEventsLost && strings.Contains(v.Detail, "5 events lost between seq 2 and 6") {
					named++
				}
			}
			if named != 1 || len(rep.Lost) != 1 || rep.Lost[0].Events != 5 {
				t.Fatalf("violations %v, lost %v", rep.Violations, rep.Lost)
			}
			for _, want := range []string{"lost_total=5", "writing again", "recovered"} {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("no %q in the log: %s", want, logs)
				}
			}
		})
	}
}

// TestKill9 kills a child writing in a loop, then reopens its log: Open
// repairs whatever tail the kill left, and every remaining line is an event
// of one boot with contiguous seq.
func TestKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("re-execs the test binary")
	}
	path := filepath.Join(t.TempDir(), "events.jsonl")
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+path)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ready := make([]byte, 6)
		if _, err := io.ReadFull(out, ready); err != nil || string(ready) != "ready\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child: %q %v", ready, err)
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()

		w, torn, err := Open(path, SyncBatch, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: torn tail %+v", round, torn)
		evs, rt := readAll(t, path)
		if !rt.IsZero() {
			t.Fatalf("torn tail after Open repaired it: %+v", rt)
		}
		boots := map[string]uint64{}
		for i, e := range evs {
			if last, ok := boots[e.Boot]; ok && e.Seq != last+1 || !ok && e.Seq != 1 {
				t.Fatalf("line %d: boot %s seq %d after %d", i+1, e.Boot, e.Seq, last)
			}
			boots[e.Boot] = e.Seq
		}
		if len(boots) != round+1 || len(evs) < 1000*(round+1) {
			t.Fatalf("%d boots, %d events after round %d", len(boots), len(evs), round)
		}
	}
}

func FuzzReader(f *testing.F) {
	line := sampleEvent(1).AppendJSON(nil)
	f.Add(append(append(line, '\n'), line...))
	f.Add([]byte("{\"v\":1}\n\n{\"v\":1}\n"))
	f.Add([]byte("{\"v\":1}\n{\"v\":"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data), "fuzz")
		n := 0
		for {
			_, err := r.Next()
			if errors.Is(err, io.EOF) {
				torn := r.Torn()
				if r.Offset() != int64(len(data)) || (!torn.IsZero() && torn.Offset+torn.Bytes != int64(len(data))) {
					t.Fatalf("EOF at offset %d of %d, torn %+v", r.Offset(), len(data), torn)
				}
				break
			}
			if err != nil {
				if !errors.Is(err, ErrBadLine) && !errors.Is(err, ErrLineTooLong) {
					t.Fatalf("unexpected error %v", err)
				}
				break
			}
			n++
			if r.Line() != n {
				t.Fatalf("line %d after %d events", r.Line(), n)
			}
		}
	})
}

func BenchmarkEmit(b *testing.B) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncBatch, SyncOff} {
		b.Run(policy.String(), func(b *testing.B) {
			w, _, err := Open(filepath.Join(b.TempDir(), "events.jsonl"), policy, nil)
			if err != nil {
				b.Fatal(err)
			}
			rec := event.NewRecorder("n1", w)
			e := sampleEvent(7)
			b.ReportAllocs()
			for b.Loop() {
				ev := *e
				rec.Emit(&ev)
			}
			b.StopTimer()
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
			// A benchmark can outrun the disk: drops past MaxPendingBytes are
			// the policy working, reported rather than failed.
			b.ReportMetric(float64(w.Stats().Dropped), "dropped")
		})
	}
}

// writeLog writes n plausible events (a legal shared-route walk per
// request) to path and returns its size.
func writeLog(tb testing.TB, path string, n int) int64 {
	tb.Helper()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var buf []byte
	rec := event.NewRecorder("n1", event.SinkFunc(func(e *event.Event) {
		buf = append(e.AppendJSON(buf), '\n')
		if len(buf) > 1<<20 {
			f.Write(buf)
			buf = buf[:0]
		}
	}))
	for i := 0; i < n; {
		i += emitWalk(rec, "r-"+strconv.Itoa(i), i%4, int64(i), t0.Add(time.Duration(i)*time.Microsecond), n-i)
	}
	if _, err := f.Write(buf); err != nil {
		tb.Fatal(err)
	}
	fi, _ := f.Stat()
	return fi.Size()
}

func BenchmarkReplay(b *testing.B) {
	path := filepath.Join(b.TempDir(), "events.jsonl")
	const n = 200_000
	size := writeLog(b, path, n)
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		count := 0
		if _, err := ReadFile(path, func(int, event.Event) error { count++; return nil }); err != nil || count != n {
			b.Fatal(count, err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "events/s")
}

// TestStalledDiskDropsInsteadOfBlocking hangs the file's writes (as a hung
// disk would): Emit keeps returning, memory stops at MaxPendingBytes, the
// excess is lost and counted, and when the disk is back the log catches up
// and a marker names the loss.
func TestStalledDiskDropsInsteadOfBlocking(t *testing.T) {
	if testing.Short() {
		t.Skip("fills MaxPendingBytes")
	}
	logger, logs := testLogger(t)
	path := filepath.Join(t.TempDir(), "events.jsonl")
	w, _, err := Open(path, SyncBatch, logger)
	if err != nil {
		t.Fatal(err)
	}
	f := inject(w)
	hold := make(chan struct{})
	f.mu.Lock()
	f.hold = hold // the disk hangs
	f.mu.Unlock()
	rec := event.NewRecorder("n1", w)
	n := 0
	for ; w.Stats().Lost == 0; n++ {
		if n > MaxPendingBytes/100 {
			t.Fatalf("no drop after %d events", n)
		}
		rec.Emit(sampleEvent(n))
	}
	for range 1000 {
		rec.Emit(sampleEvent(n))
		n++
	}
	if lost := w.Stats().Lost; lost != 1001 {
		t.Fatalf("lost %d, want 1001", lost)
	}
	f.mu.Lock()
	f.hold = nil
	f.mu.Unlock()
	close(hold) // the disk is back
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	rec.Emit(sampleEvent(n))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	st := w.Stats()
	if st.Events+st.Lost != uint64(n+1) || st.WriteErrors != 0 || st.Markers != 1 {
		t.Fatalf("stats %+v for %d events", st, n+1)
	}
	if !strings.Contains(logs.String(), "not keeping up") || !strings.Contains(logs.String(), "writing again") {
		t.Fatalf("logs: %s", logs)
	}
	evs, _ := readAll(t, path)
	if uint64(len(evs)) != st.Events+st.Markers {
		t.Fatalf("%d lines in the file, stats say %d events + %d markers", len(evs), st.Events, st.Markers)
	}
	rep, err := Replay(Files([]string{path}, nil), NewAuditor())
	if err != nil || len(rep.Lost) != 1 || rep.Lost[0].Events != 1001 {
		t.Fatalf("replay: %v %v %v", rep.Lost, rep.Violations, err)
	}
	for _, v := range rep.Violations {
		if v.Rule == RuleSeqGap {
			t.Fatalf("silent hole: %v", v)
		}
	}
}
