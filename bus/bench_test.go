package bus

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/obtest"
)

// BenchmarkEmit is the request path's cost: encode and enqueue. A goroutine
// empties the queue so that Emit never takes the drop path.
func BenchmarkEmit(b *testing.B) {
	bus := openBus(b, Config{Listen: ListenOff, noPublisher: true, QueueSize: 1 << 16})
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-bus.q:
			case <-stop:
				return
			}
		}
	}()
	e := testEvent("node-a", "boot1", 3)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		e.Seq = uint64(i)
		bus.Emit(e)
	}
	b.StopTimer()
	close(stop)
	<-drained
	b.ReportMetric(float64(bus.Stats().Dropped), "dropped")
}

// BenchmarkEmitPublishing emits into a bus publishing to its embedded
// server, a subscriber attached, and reports how many events were dropped.
func BenchmarkEmitPublishing(b *testing.B) {
	bus := openBus(b, Config{Listen: ListenOff})
	nc, err := bus.InProcessConn()
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	c := subscribe(b, nc, "onebit.>")
	e := testEvent("node-a", "boot1", 3)
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		n++
		e.Seq = uint64(n)
		bus.Emit(e)
	}
	b.StopTimer()
	s := bus.Stats()
	obtest.WaitFor(b, 30*time.Second, "queue drained", func() bool {
		s = bus.Stats()
		return s.Queued == 0 && uint64(c.len())+s.Dropped >= uint64(n)
	})
	b.ReportMetric(float64(s.Dropped)/float64(n), "dropped/op")
}

func FuzzToken(f *testing.F) {
	for _, s := range []string{"", "node-a", "gpu.box", "a*b>c", "ünï", " x\ty\n", "$SYS"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok := Token(s)
		if tok == "" {
			t.Fatalf("Token(%q) is empty", s)
		}
		for i := 0; i < len(tok); i++ {
			if !tokenByte(tok[i]) {
				t.Fatalf("Token(%q) = %q has byte %q", s, tok, tok[i])
			}
		}
		if len(tok) != max(len(s), 1) {
			t.Fatalf("Token(%q) = %q changed length", s, tok)
		}
		if Token(tok) != tok {
			t.Fatalf("Token not idempotent on %q", tok)
		}
	})
}

func TestSubject(t *testing.T) {
	tests := []struct{ node, to, want string }{
		{"node-a", "fallback", "onebit.node-a.handoff.fallback"},
		{"gpu.box", "done", "onebit.gpu_box.handoff.done"},
		{"", "", "onebit._.handoff._"},
		{"a*b", "x>y", "onebit.a_b.handoff.x_y"},
		{"host name", "adopted", "onebit.host_name.handoff.adopted"},
	}
	for _, tt := range tests {
		if got := Subject(tt.node, tt.to); got != tt.want {
			t.Errorf("Subject(%q, %q) = %q, want %q", tt.node, tt.to, got, tt.want)
		}
	}
}

func TestRedactURLs(t *testing.T) {
	tests := []struct{ in, want string }{
		{"nats://a:4222", "nats://a:4222"},
		{"nats://u:secret@a:4222, nats://b:4222", "nats://u:xxxxx@a:4222,nats://b:4222"},
		{"nats://token@a:4222", "nats://xxxxx@a:4222"},
	}
	for _, tt := range tests {
		if got := redactURLs(tt.in); got != tt.want {
			t.Errorf("redactURLs(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// BenchmarkEmitLine is Emit with the line the Recorder already encoded.
func BenchmarkEmitLine(b *testing.B) {
	bus := openBus(b, Config{Listen: ListenOff, noPublisher: true, QueueSize: 1 << 16})
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-bus.q:
			case <-stop:
				return
			}
		}
	}()
	e := testEvent("node-a", "boot1", 3)
	line := append(e.AppendJSON(nil), '\n')
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		bus.EmitLine(e, line)
	}
	b.StopTimer()
	close(stop)
	<-drained
}

// BenchmarkCatchUp republishes a log of 20 000 events into an
// empty stream on the embedded server, acknowledgements awaited, and
// reports events/s.
func BenchmarkCatchUp(b *testing.B) {
	const n = 20_000
	state := b.TempDir()
	logPath := filepath.Join(state, "events.jsonl")
	writeLog := func(boot string) {
		var buf []byte
		for i := range n {
			e := testEvent("node-a", boot, i)
			buf = append(e.AppendJSON(buf), '\n')
		}
		if err := os.WriteFile(logPath, buf, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	bus := openBus(b, Config{Listen: ListenOff, JetStream: true, StoreDir: b.TempDir(), StateDir: state,
		EventLog: logPath, noCatchUp: true})
	var elapsed time.Duration
	iter := 0
	for b.Loop() {
		b.StopTimer()
		iter++
		writeLog(fmt.Sprintf("boot%d", iter)) // a new boot: new ids, no duplicate window
		before := bus.Stats().Republished
		b.StartTimer()
		start := time.Now()
		got, err := bus.catchUpPass()
		if err != nil || got != n {
			b.Fatalf("catchUpPass: %d, %v", got, err)
		}
		for bus.Stats().Republished-before != n {
			<-bus.js.PublishAsyncComplete()
			runtime.Gosched() // the ack handler runs after the last pending one is removed
		}
		elapsed += time.Since(start)
	}
	b.ReportMetric(float64(n)*float64(iter)/elapsed.Seconds(), "events/s")
}
