package bus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
)

func streamInfo(t *testing.T, nc *nats.Conn) *jetstream.StreamInfo {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), StreamName)
	if err != nil {
		t.Fatalf("stream %s: %v", StreamName, err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func readAll(t *testing.T, c Client, stream string) ([]event.Event, []error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var evs []event.Event
	var errs []error
	for e, err := range StreamEvents(ctx, c, stream) {
		if err != nil {
			errs = append(errs, err)
			continue
		}
		evs = append(evs, e)
	}
	return evs, errs
}

func TestJetStreamEmbedded(t *testing.T) {
	b := openBus(t, Config{Listen: "127.0.0.1:0", JetStream: true, StoreDir: t.TempDir()})
	nc, err := b.InProcessConn()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	info := streamInfo(t, nc)
	if info.Config.Storage != jetstream.FileStorage || len(info.Config.Subjects) != 1 || info.Config.Subjects[0] != StreamSubjects {
		t.Fatalf("stream config %+v", info.Config)
	}

	const n = 300
	want := make([]*event.Event, n)
	for i := range n {
		want[i] = testEvent("node-a", "boot1", i)
		b.Emit(want[i])
	}
	obtest.WaitFor(t, 10*time.Second, "acks", func() bool { return b.Stats().Published == n })

	// Each message carries Nats-Msg-Id <node>/<boot>/<seq> (issue 14).
	js, _ := jetstream.New(nc)
	s, _ := js.Stream(context.Background(), StreamName)
	for _, seq := range []uint64{1, 7, n} {
		m, err := s.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		e := want[seq-1]
		if got, w := m.Header.Get(nats.MsgIdHdr), fmt.Sprintf("node-a/%s/%d", e.Boot, e.Seq); got != w {
			t.Errorf("message %d Nats-Msg-Id %q, want %q", seq, got, w)
		}
	}

	// Re-sending the same events (same ids) stores nothing new.
	for i := range 10 {
		b.Emit(want[i])
	}
	obtest.WaitFor(t, 10*time.Second, "duplicate acks", func() bool { return b.Stats().Duplicates == 10 })
	if got := streamInfo(t, nc).State.Msgs; got != n {
		t.Fatalf("stream holds %d messages after duplicates, want %d", got, n)
	}

	got, errs := readAll(t, readerClient(b), StreamName)
	if len(errs) != 0 {
		t.Fatalf("StreamEvents errors: %v", errs)
	}
	if len(got) != n {
		t.Fatalf("StreamEvents read %d events, want %d", len(got), n)
	}
	for i := range got {
		if g, w := mustJSON(t, &got[i]), mustJSON(t, want[i]); g != w {
			t.Fatalf("event %d:\n got %s\nwant %s", i, g, w)
		}
	}
	if s := b.Stats(); s.Dropped != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestJetStreamSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	b := openBus(t, Config{Listen: ListenOff, JetStream: true, StoreDir: dir})
	for i := range 20 {
		b.Emit(testEvent("node-a", "boot1", i))
	}
	obtest.WaitFor(t, 10*time.Second, "acks", func() bool { return b.Stats().Published == 20 })
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Same store: the stream is bound, not recreated.
	b2 := openBus(t, Config{Listen: "127.0.0.1:0", JetStream: true, StoreDir: dir})
	for i := range 5 {
		b2.Emit(testEvent("node-a", "boot2", i))
	}
	obtest.WaitFor(t, 10*time.Second, "acks", func() bool { return b2.Stats().Published == 5 })
	got, errs := readAll(t, readerClient(b2), StreamName)
	if len(errs) != 0 || len(got) != 25 {
		t.Fatalf("read %d events (errors %v), want 25", len(got), errs)
	}
	if got[0].Boot != "boot1" || got[24].Boot != "boot2" {
		t.Fatalf("order: first boot %q, last boot %q", got[0].Boot, got[24].Boot)
	}
}

func TestStreamEventsEdges(t *testing.T) {
	b := openBus(t, Config{Listen: "127.0.0.1:0", JetStream: true, StoreDir: t.TempDir()})

	// Empty stream: nothing, no error.
	if got, errs := readAll(t, readerClient(b), StreamName); len(got) != 0 || len(errs) != 0 {
		t.Fatalf("empty stream: %d events, errors %v", len(got), errs)
	}
	// Unknown stream: one error.
	_, errs := readAll(t, readerClient(b), "NOPE")
	if len(errs) != 1 || !errors.Is(errs[0], jetstream.ErrStreamNotFound) {
		t.Fatalf("unknown stream: errors %v", errs)
	}
	// A payload that is not an event is reported, the rest still read.
	b.Emit(testEvent("node-a", "boot1", 0))
	b.Publish("onebit.node-a.junk", []byte("not json"))
	b.Emit(testEvent("node-a", "boot1", 1))
	obtest.WaitFor(t, 10*time.Second, "acks", func() bool { return b.Stats().Published == 3 })
	got, errs := readAll(t, readerClient(b), StreamName)
	if len(got) != 2 || len(errs) != 1 {
		t.Fatalf("mixed stream: %d events, errors %v; want 2 and 1", len(got), errs)
	}
	// Stopping early works and leaves nothing behind.
	for range StreamEvents(context.Background(), readerClient(b), StreamName) {
		break
	}
	// Unreachable server: one error.
	_, errs = readAll(t, Client{URLs: "nats://127.0.0.1:1"}, StreamName)
	if len(errs) != 1 {
		t.Fatalf("unreachable: errors %v", errs)
	}
}

func TestJetStreamExternalDownAtStart(t *testing.T) {
	ext := startNATS(t, -1, true)
	url := ext.ClientURL()
	port := ext.Addr().(*net.TCPAddr).Port
	ext.Shutdown()
	ext.WaitForShutdown()

	b := openBus(t, Config{URLs: url, JetStream: true})
	if b.streamReady.Load() {
		t.Fatal("stream ready while the server is down")
	}
	startNATS(t, port, true)
	obtest.WaitFor(t, 20*time.Second, "stream set up in the background", b.streamReady.Load)
	for i := range 10 {
		b.Emit(testEvent("node-a", "boot1", i))
	}
	obtest.WaitFor(t, 10*time.Second, "acks", func() bool { return b.Stats().Published == 10 })
	got, errs := readAll(t, Client{URLs: url}, StreamName)
	if len(got) != 10 || len(errs) != 0 {
		t.Fatalf("read %d events, errors %v", len(got), errs)
	}
}

func TestJetStreamExternalDiesAndComesBack(t *testing.T) {
	tests := []struct {
		name      string
		keepStore bool // false: the server comes back without the stream
	}{
		{"same store", true},
		{"store lost", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := t.TempDir()
			ext := startNATSStore(t, -1, store)
			url := ext.ClientURL()
			port := ext.Addr().(*net.TCPAddr).Port
			b := openBus(t, Config{URLs: url, JetStream: true})
			if !b.streamReady.Load() {
				t.Fatal("stream not ready with the server up")
			}
			for i := range 10 {
				b.Emit(testEvent("node-a", "before", i))
			}
			obtest.WaitFor(t, 10*time.Second, "acks before", func() bool { return b.Stats().Published == 10 })

			ext.Shutdown()
			ext.WaitForShutdown()
			obtest.WaitFor(t, 5*time.Second, "bus to notice the outage", func() bool { return !b.nc.IsConnected() })
			for i := range 20 {
				b.Emit(testEvent("node-a", "during", i))
			}
			if !tt.keepStore {
				store = t.TempDir()
			}
			startNATSStore(t, port, store)
			obtest.WaitFor(t, 15*time.Second, "reconnect", func() bool { return b.nc.IsConnected() })
			// After the reconnect the stream is checked (and recreated if
			// the server lost it); events published then are stored.
			obtest.WaitFor(t, 15*time.Second, "events after the reconnect stored", func() bool {
				b.Emit(testEvent("node-a", "after", 0))
				js, _ := jetstream.New(b.nc)
				s, err := js.Stream(context.Background(), StreamName)
				if err != nil {
					return false
				}
				m, err := s.GetLastMsgForSubject(context.Background(), StreamSubjects)
				return err == nil && strings.Contains(string(m.Data), `"boot":"after"`)
			})
			got, errs := readAll(t, Client{URLs: url}, StreamName)
			if len(errs) != 0 {
				t.Fatalf("read back: %v", errs)
			}
			boots := map[string]int{}
			for _, e := range got {
				boots[e.Boot]++
			}
			if tt.keepStore && boots["before"] != 10 {
				t.Fatalf("events before the outage in the stream: %d, want 10 (%v)", boots["before"], boots)
			}
			if boots["after"] != 1 { // one Nats-Msg-Id: the retries were duplicates
				t.Fatalf("events after the outage in the stream: %d, want 1 (%v)", boots["after"], boots)
			}
		})
	}
}

func startNATSStore(t *testing.T, port int, store string) *server.Server {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true, JetStream: true, StoreDir: store,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// TestStreamLimits: --stream-replicas, --stream-max-age and
// --stream-max-bytes shape the stream onebitd creates, and are applied to
// a stream it binds when they differ.
func TestStreamLimits(t *testing.T) {
	store := t.TempDir()
	b := openBus(t, Config{Listen: ListenOff, JetStream: true, StoreDir: store,
		StreamReplicas: 1, StreamMaxAge: time.Hour, StreamMaxBytes: 1 << 20})
	nc, err := b.InProcessConn()
	if err != nil {
		t.Fatal(err)
	}
	info := streamInfo(t, nc)
	nc.Close()
	if c := info.Config; c.Replicas != 1 || c.MaxAge != time.Hour || c.MaxBytes != 1<<20 {
		t.Fatalf("created stream: replicas %d, max age %v, max bytes %d", c.Replicas, c.MaxAge, c.MaxBytes)
	}
	_ = b.Close()

	// A restart with other limits updates the stream it binds.
	b2 := openBus(t, Config{Listen: ListenOff, JetStream: true, StoreDir: store, StreamMaxAge: 2 * time.Hour})
	nc2, err := b2.InProcessConn()
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	if c := streamInfo(t, nc2).Config; c.MaxAge != 2*time.Hour || c.MaxBytes != 1<<20 {
		t.Fatalf("bound stream: max age %v (want 2h), max bytes %d (want kept)", c.MaxAge, c.MaxBytes)
	}

	// Three replicas need a cluster: a single server says so at Open.
	_, err = Open(context.Background(), Config{Listen: ListenOff, JetStream: true, StoreDir: t.TempDir(),
		StreamReplicas: 3, Node: "n", StateDir: t.TempDir(), Logger: discardLogger()})
	if err == nil || !strings.Contains(err.Error(), "replicas") {
		t.Fatalf("Open with 3 replicas on one server: %v, want an error about replicas", err)
	}
}

func TestInSeqOrder(t *testing.T) {
	ev := func(boot string, seq uint64) event.Event { return event.Event{Node: "n", Boot: boot, Seq: seq} }
	tests := []struct {
		name string
		in   []event.Event
		want string
	}{
		{"in order", []event.Event{ev("a", 1), ev("a", 2), ev("a", 3)}, "a1 a2 a3"},
		{"republished after later ones", []event.Event{ev("a", 1), ev("a", 4), ev("a", 5), ev("a", 2), ev("a", 3), ev("a", 6)}, "a1 a2 a3 a4 a5 a6"},
		{"two boots interleaved", []event.Event{ev("a", 1), ev("b", 1), ev("a", 3), ev("b", 2), ev("a", 2)}, "a1 b1 b2 a2 a3"},
		{"a gap never filled", []event.Event{ev("a", 1), ev("a", 3), ev("a", 5)}, "a1 a3 a5"},
		{"late duplicate passes", []event.Event{ev("a", 1), ev("a", 2), ev("a", 1)}, "a1 a2 a1"},
		{"seq 0 at once", []event.Event{ev("a", 1), ev("a", 3), ev("a", 0), ev("a", 2)}, "a1 a0 a2 a3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := func(yield func(event.Event, error) bool) {
				for _, e := range tt.in {
					if !yield(e, nil) {
						return
					}
				}
			}
			var got []string
			for e, err := range inSeqOrder(raw) {
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, fmt.Sprintf("%s%d", e.Boot, e.Seq))
			}
			if s := strings.Join(got, " "); s != tt.want {
				t.Fatalf("got %s, want %s", s, tt.want)
			}
		})
	}
}
