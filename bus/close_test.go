package bus

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestEmitRacingCloseIsAccounted: events emitted while Close runs are either
// published or counted as dropped, never lost between the two (issue 9).
// Every emitter keeps going until it has seen Close take effect, so each
// round has Emit calls on both sides of Close and in its window.
func TestEmitRacingCloseIsAccounted(t *testing.T) {
	tests := []struct {
		name     string
		emitters int
		publish  bool // Publish instead of Emit
	}{
		{"emit 1 goroutine", 1, false},
		{"emit 4 goroutines", 4, false},
		{"publish 4 goroutines", 4, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for round := range 20 {
				b := openBus(t, Config{Listen: ListenOff, QueueSize: 4096})
				var emitted atomic.Uint64
				var wg sync.WaitGroup
				start := make(chan struct{})
				running := make(chan struct{}, tt.emitters)
				for g := range tt.emitters {
					wg.Add(1)
					go func() {
						defer wg.Done()
						e := testEvent("node-a", "race", g)
						// A long reason makes encoding, between Emit's closed
						// check and its enqueue, the widest part of the call.
						e.Reason = strings.Repeat("the provider said no. ", 2000)
						<-start
						for i := 0; ; i++ {
							closedBefore := b.closed.Load()
							if tt.publish {
								b.Publish("onebit.node-a.custom", []byte(`{}`))
							} else {
								e.Seq = uint64(i)
								b.Emit(e)
							}
							emitted.Add(1)
							if i == 1 {
								running <- struct{}{}
							}
							if closedBefore && i > 0 {
								return
							}
						}
					}()
				}
				close(start)
				for range tt.emitters {
					<-running // Close while every emitter is mid-stream
				}
				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
				wg.Wait()
				s := b.Stats()
				if s.Published+s.Dropped != emitted.Load() {
					t.Fatalf("round %d: published %d + dropped %d = %d, emitted %d (queued %d): %d events neither published nor counted",
						round, s.Published, s.Dropped, s.Published+s.Dropped, emitted.Load(), s.Queued,
						int64(emitted.Load())-int64(s.Published+s.Dropped))
				}
			}
		})
	}
}
