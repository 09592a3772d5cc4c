package eventlog

import (
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/onebitd/onebitd/event"
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
