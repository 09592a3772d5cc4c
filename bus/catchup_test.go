package bus

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
)

func TestAcks(t *testing.T) {
	type op struct {
		add      []uint64
		from, to uint64 // addRange when to > 0
	}
	tests := []struct {
		name    string
		ops     []op
		through uint64
		above   []uint64
	}{
		{"in order", []op{{add: []uint64{1, 2, 3}}}, 3, nil},
		{"hole", []op{{add: []uint64{1, 2, 4, 5}}}, 2, []uint64{4, 5}},
		{"hole filled", []op{{add: []uint64{1, 2, 4, 5, 3}}}, 5, nil},
		{"first missing", []op{{add: []uint64{2, 3}}}, 0, []uint64{2, 3}},
		{"repeat", []op{{add: []uint64{1, 1, 2, 2}}}, 2, nil},
		{"range closes a hole", []op{{add: []uint64{1, 5, 6}}, {from: 2, to: 4}}, 6, nil},
		{"range past above", []op{{add: []uint64{1, 3, 9}}, {from: 2, to: 5}}, 5, []uint64{9}},
		{"range above a hole", []op{{add: []uint64{1}}, {from: 4, to: 5}}, 1, []uint64{4, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAcks("n")
			for _, o := range tt.ops {
				for _, s := range o.add {
					a.add("b", s)
				}
				if o.to > 0 {
					a.addRange("b", o.from, o.to)
				}
			}
			// Round trip through the file.
			path := filepath.Join(t.TempDir(), AckedFile)
			data, changed := a.snapshot()
			if !changed {
				t.Fatal("snapshot: nothing changed")
			}
			if err := writeFileAtomic(path, data); err != nil {
				t.Fatal(err)
			}
			if _, again := a.snapshot(); again {
				t.Error("snapshot dirty right after a snapshot")
			}
			got, err := loadAcks(path, "n")
			if err != nil {
				t.Fatal(err)
			}
			ba := got.boots["b"]
			var above []uint64
			for s := range ba.above {
				above = append(above, s)
			}
			if ba.through != tt.through || len(above) != len(tt.above) {
				t.Fatalf("through %d above %v, want %d %v", ba.through, above, tt.through, tt.above)
			}
			for _, s := range tt.above {
				if !got.has("b", s) {
					t.Errorf("seq %d not held after reload", s)
				}
			}
			if got.has("b", tt.through+1) && !contains(tt.above, tt.through+1) {
				t.Errorf("seq %d held", tt.through+1)
			}
			if other, _ := loadAcks(path, "other-node"); len(other.boots) != 0 {
				t.Error("another node's record was taken")
			}
			if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*")); len(left) != 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
	bad := filepath.Join(t.TempDir(), AckedFile)
	if err := os.WriteFile(bad, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadAcks(bad, "n"); err == nil {
		t.Error("a torn record loaded")
	}
}

func contains(s []uint64, v uint64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestParseMsgID(t *testing.T) {
	tests := []struct {
		id         string
		node, boot string
		seq        uint64
		ok         bool
	}{
		{"node-a/00ff/12", "node-a", "00ff", 12, true},
		{"a/b/c/7", "a/b", "c", 7, true},
		{"x/y", "", "", 0, false},
		{"x/y/z", "", "", 0, false},
		{"", "", "", 0, false},
	}
	for _, tt := range tests {
		node, boot, seq, ok := parseMsgID(tt.id)
		if node != tt.node || boot != tt.boot || seq != tt.seq || ok != tt.ok {
			t.Errorf("parseMsgID(%q) = %q %q %d %v", tt.id, node, boot, seq, ok)
		}
	}
}

// daemonLog stands for the daemon's event pipeline: a Recorder that writes
// each event to the log file, then hands it to the bus while live is true.
type daemonLog struct {
	rec  *event.Recorder
	live atomic.Bool
	mu   sync.Mutex
	f    *os.File
}

func newDaemonLog(t *testing.T, path string, b *Bus) *daemonLog {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	d := &daemonLog{f: f}
	d.live.Store(true)
	logSink := event.SinkFunc(func(e *event.Event) {
		d.mu.Lock()
		defer d.mu.Unlock()
		if _, err := f.Write(append(e.AppendJSON(nil), '\n')); err != nil {
			t.Error(err)
		}
	})
	busSink := event.SinkFunc(func(e *event.Event) {
		if d.live.Load() {
			b.Emit(e)
		}
	})
	d.rec = event.NewRecorder("node-a", logSink, busSink)
	return d
}

func (d *daemonLog) emit(n int) {
	for i := range n {
		d.rec.Emit(&event.Event{RequestID: fmt.Sprintf("r%d", i), Route: "plain", Event: "forward", From: "received", To: "forwarding"})
	}
}

// streamKeys reads the stream and checks that it holds each (boot, seq) at
// most once and every boot's seqs in ascending order; it returns the count
// per boot.
func streamKeys(t *testing.T, b *Bus) map[string]int {
	t.Helper()
	evs, errs := readAll(t, readerClient(b), StreamName)
	if len(errs) != 0 {
		t.Fatalf("read the stream: %v", errs)
	}
	seen := map[string]bool{}
	per := map[string]int{}
	for _, e := range evs {
		k := fmt.Sprintf("%s/%d", e.Boot, e.Seq)
		if seen[k] {
			t.Errorf("stream holds %s twice", k)
		}
		seen[k] = true
		per[e.Boot]++
	}
	return per
}

// TestCatchUpAfterRestart: events that reached the log but not the stream
// before the process died are republished by the next process, and only
// those (the acknowledgement record says which).
func TestCatchUpAfterRestart(t *testing.T) {
	state, store := t.TempDir(), t.TempDir()
	logPath := filepath.Join(state, "events.jsonl")
	cfg := Config{Listen: "127.0.0.1:0", JetStream: true, StoreDir: store, StateDir: state, EventLog: logPath}

	b1 := openBus(t, cfg)
	d1 := newDaemonLog(t, logPath, b1)
	d1.emit(50)
	obtest.WaitFor(t, 10*time.Second, "first boot acked", func() bool { return b1.Stats().Published == 50 })
	d1.live.Store(false) // the process dies between the log and the bus
	d1.emit(30)
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}
	rec, err := loadAcks(filepath.Join(state, AckedFile), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if ba := rec.boots[d1.rec.Boot]; ba == nil || ba.through != 50 || len(ba.above) != 0 {
		t.Fatalf("acknowledgement record after the first boot: %+v, want through 50", ba)
	}

	b2 := openBus(t, cfg)
	d2 := newDaemonLog(t, logPath, b2)
	d2.emit(20)
	obtest.WaitFor(t, 15*time.Second, "catch-up", func() bool {
		s := b2.Stats()
		return s.Republished == 30 && s.Published == 20
	})
	per := streamKeys(t, b2)
	if per[d1.rec.Boot] != 80 || per[d2.rec.Boot] != 20 {
		t.Fatalf("stream holds %v, want 80 of boot 1 and 20 of boot 2", per)
	}
	// "Only those": the catch-up republished the 30 unacknowledged events
	// (Republished is exactly 30 above) and the stream holds every event
	// once. Stats.Duplicates is not asserted: a boot starts behind, so when
	// its first catch-up pass reads the log after this boot's own events
	// reached it, those are sent by the pass and again by the live path,
	// and JetStream reports the second copy as a duplicate: harmless by
	// design (seen as 20 duplicates in a loaded make test).
}

// TestCatchUpAfterOutage: an external server goes away for longer than the
// reconnect buffer lasts; once it is back, the stream ends equal to the
// log, each event once.
func TestCatchUpAfterOutage(t *testing.T) {
	store, state := t.TempDir(), t.TempDir()
	ext := startNATSStore(t, -1, store)
	url := ext.ClientURL()
	port := ext.Addr().(*net.TCPAddr).Port
	logPath := filepath.Join(state, "events.jsonl")
	b := openBus(t, Config{URLs: url, JetStream: true, StateDir: state, EventLog: logPath,
		ReconnectBufSize: 16 << 10, QueueSize: 1 << 16})
	d := newDaemonLog(t, logPath, b)
	d.emit(100)
	obtest.WaitFor(t, 10*time.Second, "acks before", func() bool { return b.Stats().Published == 100 })

	ext.Shutdown()
	ext.WaitForShutdown()
	obtest.WaitFor(t, 5*time.Second, "bus to notice the outage", func() bool { return !b.nc.IsConnected() })
	const during = 2000 // ~250 bytes each: far beyond the 16 KiB buffer
	d.emit(during)
	obtest.WaitFor(t, 10*time.Second, "publisher to take the queue", func() bool { return b.Stats().Queued == 0 })
	if s := b.Stats(); s.Dropped == 0 {
		t.Fatalf("no drop during the outage: %+v", s)
	}

	startNATSStore(t, port, store)
	obtest.WaitFor(t, 15*time.Second, "reconnect", func() bool { return b.nc.IsConnected() })
	d.emit(50) // live traffic while the catch-up runs
	total := 100 + during + 50
	obtest.WaitFor(t, 30*time.Second, "the stream to hold the whole log", func() bool {
		nc, err := b.InProcessConn()
		if err != nil {
			return false
		}
		defer nc.Close()
		return streamInfo(t, nc).State.Msgs == uint64(total)
	})
	per := streamKeys(t, b)
	if per[d.rec.Boot] != total {
		t.Fatalf("stream holds %v, want %d events", per, total)
	}
	t.Logf("stats %+v", b.Stats())
}

// TestCatchUpResumes: a pass starts where the last one found the first
// event the stream did not hold, so a long log is not read again and again;
// a line being written at the end is picked up once complete.
func TestCatchUpResumes(t *testing.T) {
	state := t.TempDir()
	logPath := filepath.Join(state, "events.jsonl")
	b := openBus(t, Config{Listen: ListenOff, JetStream: true, StoreDir: t.TempDir(), StateDir: state,
		EventLog: logPath, noCatchUp: true})
	line := func(i int) []byte { return append(testEvent("node-a", "boot1", i).AppendJSON(nil), '\n') }
	var log []byte
	for i := range 100 {
		log = append(log, line(i)...)
	}
	partial := line(100)
	log = append(log, partial[:20]...) // the writer is mid-line
	if err := os.WriteFile(logPath, log, 0o600); err != nil {
		t.Fatal(err)
	}
	pass := func(want int, held uint64) {
		t.Helper()
		before := b.Stats().Republished
		n, err := b.catchUpPass()
		if err != nil || n != want {
			t.Fatalf("catchUpPass = %d, %v; want %d", n, err, want)
		}
		obtest.WaitFor(t, 10*time.Second, "acks", func() bool { return b.Stats().Republished-before == uint64(want) })
		if !b.acks.has("boot1", held) || b.acks.has("boot1", held+1) {
			t.Fatalf("after the pass: seq %d held %v, seq %d held %v", held, b.acks.has("boot1", held), held+1, b.acks.has("boot1", held+1))
		}
	}
	pass(100, 100)
	if b.resumeAt != 0 {
		t.Fatalf("resume at %d after republishing from line 1, want 0", b.resumeAt)
	}
	pass(0, 100) // everything acknowledged now: nothing to do
	// Everything up to the partial line is held: the next pass starts at
	// that line. Spoil what comes before it; a pass that read it would fail.
	if b.resumeAt != int64(len(log)-20) {
		t.Fatalf("resume at %d, want %d (the partial line)", b.resumeAt, len(log)-20)
	}
	f, err := os.OpenFile(logPath, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("garbage"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(partial[20:], int64(len(log))); err != nil { // the line completes
		t.Fatal(err)
	}
	f.Close()
	pass(1, 101)
}
