package eventlog

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/event"
)

// mountTmpfs mounts a tmpfs of size bytes on a fresh directory for the test
// and unmounts it at the end. It skips the test when it cannot (not root, no
// CAP_SYS_ADMIN, a container without mount).
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a real full file system needs root to mount a small tmpfs; skipped (not root)")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.Itoa(size)+",mode=0700"); err != nil {
		t.Skipf("a real full file system needs a small tmpfs; mount failed: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fill creates a file that takes all the free space of dir's file system
// (but keep bytes) and returns its path.
func fill(t *testing.T, dir string, keep int64) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail)*st.Bsize - keep
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if free > 0 {
		if err := unix.Fallocate(int(f.Fd()), 0, 0, free); err != nil {
			t.Fatalf("fill %s with %d bytes: %v", dir, free, err)
		}
	}
	return path
}

// lostInReport sums the events the audit reports lost ("N events lost
// between seq A and B") and returns the sum and the violations of other rules.
func lostInReport(t *testing.T, rep Report) (lost uint64, other []Violation) {
	t.Helper()
	for _, v := range rep.Violations {
		if v.Rule != "events-lost" {
			other = append(other, v)
			continue
		}
		i := strings.Index(v.Detail, " events lost between seq ")
		if i < 0 {
			continue // a request-level note of the same loss
		}
		start := strings.LastIndexByte(v.Detail[:i], ' ') + 1
		n, err := strconv.ParseUint(v.Detail[start:i], 10, 64)
		if err != nil {
			t.Fatalf("violation %q: %v", v, err)
		}
		lost += n
	}
	return lost, other
}

// TestFullDiskLosesNoEventSilently is issue 10's finding on a real full file
// system: with the log on a 256 KiB tmpfs, 1 000 requests (6 000 events)
// kept about 1 000 events, and replay saw one seq gap and nothing of the
// missing requests. Every lost event must be counted, logged, and named by
// replay ("N events lost between seq A and B"), whether the disk stays full
// until Close or comes back while the log is open.
func TestFullDiskLosesNoEventSilently(t *testing.T) {
	tests := []struct {
		name     string
		policy   SyncPolicy
		comeBack bool // a filler file fills the disk, then is removed halfway
	}{
		{"stays full batch", SyncBatch, false},
		{"stays full always", SyncAlways, false},
		{"comes back batch", SyncBatch, true},
		{"comes back always", SyncAlways, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := mountTmpfs(t, 256<<10)
			logger, logs := testLogger(t)
			path := filepath.Join(dir, "events.jsonl")
			w, _, err := Open(path, tt.policy, logger)
			if err != nil {
				t.Fatal(err)
			}
			var filler string
			if tt.comeBack {
				filler = fill(t, dir, 8<<10)
			}
			rec := event.NewRecorder("n1", w)
			const requests = 1000
			emitted := 0
			for i := range requests {
				if tt.comeBack && i == requests/2 {
					if err := w.Sync(); err == nil {
						t.Log("sync before the disk came back did not fail")
					}
					if err := os.Remove(filler); err != nil {
						t.Fatal(err)
					}
				}
				emitted += emitWalk(rec, "r-"+strconv.Itoa(i), i%4, int64(i), t0, 6)
			}
			rec.Shutdown(0)
			emitted++
			if err := w.Close(); err != nil {
				t.Logf("Close: %v", err) // a full disk may fail the last fsync
			}
			st := w.Stats()
			if st.Lost == 0 {
				t.Fatalf("no event lost on a full disk? stats %+v", st)
			}
			if st.Events+st.Lost != uint64(emitted) {
				t.Fatalf("stats %+v do not account for %d events", st, emitted)
			}
			rep, err := Replay(Files([]string{path}, nil), NewAuditor())
			if err != nil {
				t.Fatal(err)
			}
			lost, other := lostInReport(t, rep)
			for _, v := range other {
				if v.Rule == RuleSeqGap {
					t.Errorf("silent hole: %s", v)
				}
			}
			if markerLines(t, path) == 0 || uint64(rep.Events) != st.Events || lost != st.Lost {
				t.Fatalf("replay: %d lines, %d events named lost; writer kept %d, lost %d; violations %v",
					rep.Events, lost, st.Events, st.Lost, rep.Violations)
			}
			t.Logf("%d events emitted: %d kept, %d lost, named by %d markers (%v); in flight %d, incomplete %d, interrupted %d",
				emitted, st.Events, st.Lost, st.Markers, rep.Lost, len(rep.InFlight), len(rep.Incomplete), len(rep.Interrupted))
			if tt.comeBack && !strings.Contains(logs.String(), "recovered") {
				t.Errorf("no recovery logged: %s", logs)
			}
			want := fmt.Sprintf("lost_total=%d", st.Lost)
			if !strings.Contains(logs.String(), want) {
				t.Errorf("the final count %s is not in the log:\n%s", want, logs)
			}
			if n := strings.Count(logs.String(), "level=ERROR"); n > 5 {
				t.Errorf("%d error lines: at most one a second, and this test takes less", n)
			}
		})
	}
}

// markerLines counts the loss markers in the log at path.
func markerLines(t *testing.T, path string) uint64 {
	t.Helper()
	var n uint64
	if _, err := ReadFile(path, func(_ int, e event.Event) error {
		if e.Event == event.LostEvent {
			n++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTornTailOnFullDisk: a torn tail that cannot be saved aside (the disk
// is full) is truncated in place, loudly, and Open succeeds (issue 10: the
// daemon refused to start).
func TestTornTailOnFullDisk(t *testing.T) {
	dir := mountTmpfs(t, 256<<10)
	path := filepath.Join(dir, "events.jsonl")
	var good []byte
	rec := event.NewRecorder("n1", event.SinkFunc(func(e *event.Event) { good = append(e.AppendJSON(good), '\n') }))
	for i := range 10 {
		rec.Emit(sampleEvent(i))
	}
	tail := strings.Repeat("x", 9000) // more than the free space left
	if err := os.WriteFile(path, append(append([]byte(nil), good...), tail...), 0o600); err != nil {
		t.Fatal(err)
	}
	fill(t, dir, 0)
	logger, logs := testLogger(t)
	w, torn, err := Open(path, SyncBatch, logger)
	if err != nil {
		t.Fatalf("Open on a full disk with a torn tail: %v", err)
	}
	defer w.Close()
	if torn.Offset != int64(len(good)) || torn.Bytes != int64(len(tail)) || torn.SavedTo != "" {
		t.Fatalf("torn %+v", torn)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != int64(len(good)) {
		t.Fatalf("log not truncated to %d: %v %v", len(good), fi.Size(), err)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "truncated in place") {
		t.Fatalf("not said loudly: %s", logs)
	}
	if m, _ := filepath.Glob(path + ".torn-*"); len(m) != 0 {
		t.Fatalf("partial copies left: %v", m)
	}
}
