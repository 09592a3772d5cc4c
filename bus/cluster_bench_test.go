package bus

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onebitd/onebitd/internal/obtest"
)

// clusterReady opens a three-node embedded cluster (loopback) and waits
// until stream ONEBIT (3 replicas) is ready on every node.
func clusterReady(b *testing.B, cfg Config) []*Bus {
	b.Helper()
	cfg.StreamReplicas = 3
	buses := openCluster(b, 3, cfg)
	obtest.WaitFor(b, 60*time.Second, "stream ONEBIT ready on every node", func() bool {
		for _, x := range buses {
			if !x.streamReady.Load() {
				return false
			}
		}
		return true
	})
	return buses
}

// BenchmarkClusterPublish: one node emits into the R3 stream of a
// three-server cluster, acknowledgements awaited asynchronously. ns/op is
// Emit's cost (the request path); events/s is the rate at which the stream
// acknowledged them, from the first Emit to the last ack.
func BenchmarkClusterPublish(b *testing.B) {
	buses := clusterReady(b, Config{QueueSize: 1 << 20})
	x := buses[0]
	e := testEvent("node-a", "bench", 3)
	before := x.Stats().Published
	n := 0
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		n++
		e.Seq = uint64(n)
		x.Emit(e)
	}
	b.StopTimer()
	obtest.WaitFor(b, 120*time.Second, "every event acknowledged or dropped", func() bool {
		s := x.Stats()
		return s.Published-before+s.Dropped >= uint64(n)
	})
	elapsed := time.Since(start)
	s := x.Stats()
	b.ReportMetric(float64(s.Published-before)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(s.Dropped), "dropped")
}

// BenchmarkClusterAckLatency: publish-to-acknowledgement latency of one
// event into the R3 stream while a window of 256 async publishes is in
// flight (the bus's steady state under load); p50 and p99 in µs.
func BenchmarkClusterAckLatency(b *testing.B) {
	buses := clusterReady(b, Config{})
	nc, err := nats.Connect("", nats.InProcessServer(buses[0].srv), buses[0].creds.daemon.option())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(jsMaxPending))
	if err != nil {
		b.Fatal(err)
	}
	data := testEvent("node-a", "lat", 1).AppendJSON(nil)
	const window = 256
	type sent struct {
		at time.Time
		f  jetstream.PubAckFuture
	}
	inflight := make([]sent, 0, window)
	var lat []time.Duration
	collect := func(s sent) {
		select {
		case <-s.f.Ok():
			lat = append(lat, time.Since(s.at))
		case err := <-s.f.Err():
			b.Fatalf("publish: %v", err)
		}
	}
	i := 0
	for b.Loop() {
		i++
		if len(inflight) == window {
			collect(inflight[0])
			inflight = inflight[1:]
		}
		m := &nats.Msg{Subject: "onebit.node-a.handoff.done", Data: data}
		f, err := js.PublishMsgAsync(m, jetstream.WithMsgID(fmt.Sprintf("lat/%d/%d", b.N, i)))
		if err != nil {
			b.Fatal(err)
		}
		inflight = append(inflight, sent{time.Now(), f})
	}
	for _, s := range inflight {
		collect(s)
	}
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}

// BenchmarkClusterCatchUp: a catch-up pass republishes 20 000 events of a
// log into the R3 stream, acknowledgements awaited; events/s.
func BenchmarkClusterCatchUp(b *testing.B) {
	const n = 20_000
	logPath := filepath.Join(b.TempDir(), "events.jsonl")
	buses := clusterReady(b, Config{EventLog: logPath, noCatchUp: true})
	x := buses[0]
	var elapsed time.Duration
	iter := 0
	for b.Loop() {
		b.StopTimer()
		iter++
		var buf []byte
		for i := range n {
			buf = append(testEvent("node-a", fmt.Sprintf("boot%d", iter), i).AppendJSON(buf), '\n')
		}
		if err := os.WriteFile(logPath, buf, 0o600); err != nil {
			b.Fatal(err)
		}
		before := x.Stats().Republished
		b.StartTimer()
		start := time.Now()
		got, err := x.catchUpPass()
		if err != nil || got != n {
			b.Fatalf("catchUpPass: %d, %v", got, err)
		}
		for x.Stats().Republished-before != n {
			select {
			case <-x.js.PublishAsyncComplete():
			case <-time.After(30 * time.Second):
				b.Fatalf("catch-up: %d of %d acknowledged", x.Stats().Republished-before, n)
			}
			runtime.Gosched() // the ack handler runs after the last pending one is removed
		}
		elapsed += time.Since(start)
	}
	b.ReportMetric(float64(n)*float64(iter)/elapsed.Seconds(), "events/s")
}
