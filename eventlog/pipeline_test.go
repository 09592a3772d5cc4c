package eventlog

import (
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
)

// busLike stands in for the NATS bus as a sink: it keeps each event's JSON
// bytes (the bus queues them for its publisher) and does no I/O. As an
// event.LineSink it keeps the Recorder's line instead of encoding again
// (what bus.Bus does once it implements EmitLine).
type busLike struct {
	mu    sync.Mutex
	lines int
	last  []byte
}

func (s *busLike) EmitLine(e *event.Event, line []byte) {
	s.mu.Lock()
	s.lines++
	s.last = line[:len(line)-1]
	s.mu.Unlock()
}

func (s *busLike) Emit(e *event.Event) {
	data := e.AppendJSON(make([]byte, 0, 512)) // what bus.Emit does
	s.mu.Lock()
	s.lines++
	s.last = data
	s.mu.Unlock()
}

// BenchmarkPipelineAlways is the per-transition cost of the daemon's event
// pipeline (Recorder → event log under --event-log-sync always → a bus-like
// sink) with 8 goroutines emitting at once, on the file system of
// t.TempDir(). ns/op is wall time per transition across all goroutines;
// fsyncs/event shows the group commit (1 when every event pays its own).
func BenchmarkPipelineAlways(b *testing.B) {
	const concurrency = 8
	w, _, err := Open(filepath.Join(b.TempDir(), "events.jsonl"), SyncAlways, nil)
	if err != nil {
		b.Fatal(err)
	}
	bus := new(busLike)
	rec := event.NewRecorder("n1", w, bus)
	e := sampleEvent(7)
	b.SetParallelism(max(1, (concurrency+runtime.GOMAXPROCS(0)-1)/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ev := *e
			rec.Emit(&ev)
		}
	})
	b.StopTimer()
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	st := w.Stats()
	if st.Lost != 0 {
		b.Fatalf("dropped %d events", st.Lost)
	}
	b.ReportMetric(float64(st.Syncs)/float64(max(st.Events, 1)), "fsyncs/event")
	if bus.lines != b.N {
		b.Fatalf("the bus got %d of %d events", bus.lines, b.N)
	}
}

// TestAlwaysGroupCommit: under SyncAlways, while one emitter's write hangs,
// seven others still append (no lock is held across the write or the
// fsync), none of them returns and the bus-like sink after the log sees
// nothing (persist before publish); when the disk answers, one more write
// and fsync makes all seven durable, and the sink gets all eight in seq
// order.
func TestAlwaysGroupCommit(t *testing.T) {
	w, _, err := Open(filepath.Join(t.TempDir(), "events.jsonl"), SyncAlways, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := inject(w)
	hold := make(chan struct{})
	f.mu.Lock()
	f.hold = hold
	f.mu.Unlock()
	bus := new(seqSink)
	rec := event.NewRecorder("n1", w, bus)
	var wg sync.WaitGroup
	var returned atomic.Int64
	emit := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec.Emit(sampleEvent(i))
			returned.Add(1)
		}()
	}
	emit(0)
	obtest.WaitFor(t, 5*time.Second, "the first write to hang", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.flushing
	})
	for i := 1; i < 8; i++ {
		emit(i)
	}
	obtest.WaitFor(t, 5*time.Second, "seven appends while the write hangs", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.appended == 8
	})
	if n := returned.Load(); n != 0 || len(bus.get()) != 0 {
		t.Fatalf("%d emitters returned, the bus has %d events before anything was durable", n, len(bus.get()))
	}
	f.mu.Lock()
	f.hold = nil
	f.mu.Unlock()
	close(hold)
	wg.Wait()
	st := w.Stats()
	if st.Events != 8 || st.Syncs != 2 {
		t.Fatalf("stats %+v: want 8 events in 2 fsyncs", st)
	}
	if got := bus.get(); !slices.Equal(got, []uint64{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Fatalf("the bus saw %v", got)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// seqSink records the seq of each line it gets.
type seqSink struct {
	mu   sync.Mutex
	seqs []uint64
}

func (s *seqSink) Emit(e *event.Event) { s.EmitLine(e, nil) }

func (s *seqSink) EmitLine(e *event.Event, _ []byte) {
	s.mu.Lock()
	s.seqs = append(s.seqs, e.Seq)
	s.mu.Unlock()
}

func (s *seqSink) get() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seqs)
}
