package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func openBus(t testing.TB, cfg Config) *Bus {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	if cfg.Node == "" {
		cfg.Node = "node-a"
	}
	if cfg.URLs == "" && cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	b, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// readerClient connects to b's embedded server as its reader.
func readerClient(b *Bus) Client {
	return Client{URLs: b.ClientURL(), CredsFile: b.ReaderCreds(), Name: "test reader"}
}

// startNATS runs a standalone nats-server in this process, standing for an
// external server or cluster.
func startNATS(t testing.TB, port int, js bool) *server.Server {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true}
	if js {
		opts.JetStream = true
		opts.StoreDir = t.TempDir()
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// collector subscribes to subject and keeps what it receives.
type collector struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func (c *collector) handle(m *nats.Msg) {
	c.mu.Lock()
	c.msgs = append(c.msgs, m)
	c.mu.Unlock()
}

func (c *collector) snapshot() []*nats.Msg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*nats.Msg(nil), c.msgs...)
}

func (c *collector) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

func subscribe(t testing.TB, nc *nats.Conn, subject string) *collector {
	t.Helper()
	c := &collector{}
	sub, err := nc.Subscribe(subject, c.handle)
	if err != nil {
		t.Fatalf("subscribe %s: %v", subject, err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	return c
}

var states = []string{"listening", "shared", "prefilled", "adopted", "forwarding", "done"}

// testEvent is the i-th event of a run, stamped like a Recorder would.
func testEvent(node, boot string, i int) *event.Event {
	sid := int64(i)
	e := &event.Event{
		V: event.Version, Boot: boot, Seq: uint64(i + 1),
		Time:      time.Date(2025, 3, 1, 12, 0, 0, i*1000, time.UTC),
		Node:      node,
		RequestID: fmt.Sprintf("%s-%04d", boot, i/len(states)), // unique across boots, as the daemon's are
		Route:     "shared",
		Event:     "e",
		To:        states[i%len(states)],
		ElapsedUS: int64(i),
		NTokens:   512,
	}
	if e.To == "adopted" {
		e.ShareID = &sid
		e.Cleanup = &event.Cleanup{FDsClosed: 56, FilesRemoved: 3}
	}
	return e
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestEmitDeliveredInOrder(t *testing.T) {
	tests := []struct {
		name   string
		listen string
	}{
		{"tcp listener", "127.0.0.1:0"},
		{"random port -1", "127.0.0.1:-1"},
		{"in-process only", "off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := openBus(t, Config{Listen: tt.listen, QueueSize: 4096})
			var nc *nats.Conn
			var err error
			if tt.listen == ListenOff {
				if got := b.ClientURL(); got != "" {
					t.Fatalf("ClientURL with listen off = %q, want empty", got)
				}
				nc, err = b.InProcessConn()
			} else {
				if !strings.HasPrefix(b.ClientURL(), "nats://127.0.0.1:") {
					t.Fatalf("ClientURL = %q", b.ClientURL())
				}
				nc, err = readerClient(b).Connect()
			}
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			c := subscribe(t, nc, "onebit.>")

			const n = 3000
			want := make([]*event.Event, n)
			for i := range n {
				want[i] = testEvent("node-a", "boot1", i)
				b.Emit(want[i])
			}
			obtest.WaitFor(t, 10*time.Second, "all events", func() bool { return c.len() >= n })
			got := c.snapshot()
			if len(got) != n {
				t.Fatalf("received %d events, want %d", len(got), n)
			}
			for i, m := range got {
				if wantSubj := "onebit.node-a.handoff." + want[i].To; m.Subject != wantSubj {
					t.Fatalf("message %d subject %q, want %q", i, m.Subject, wantSubj)
				}
				if g, w := string(m.Data), mustJSON(t, want[i]); g != w {
					t.Fatalf("message %d:\n got %s\nwant %s", i, g, w)
				}
			}
			if s := b.Stats(); s.Published != n || s.Dropped != 0 {
				t.Fatalf("stats %+v, want %d published, none dropped", s, n)
			}
		})
	}
}

func TestEventSubjects(t *testing.T) {
	b := openBus(t, Config{Listen: ListenOff})
	nc, err := b.InProcessConn()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := subscribe(t, nc, "onebit.>")
	evs := []struct {
		e    event.Event
		want string
	}{
		{event.Event{Node: "node-a", Event: "fallback", To: "fallback"}, "onebit.node-a.handoff.fallback"},
		{event.Event{Event: "finish", To: "done"}, "onebit.node-a.handoff.done"}, // Node from Config
		{event.Event{Node: "gpu.box", Event: "finish", To: "done"}, "onebit.gpu_box.handoff.done"},
		{event.Event{Node: "node-a", Event: "decoder.ready"}, "onebit.node-a.decoder.ready"},
		{event.Event{Node: "node-a", Event: "provider.exited"}, "onebit.node-a.provider.exited"},
		{event.Event{Node: "node-a", Event: "eventlog.shutdown"}, "onebit.node-a.eventlog.shutdown"},
		{event.Event{Node: "node-a", Event: "odd one"}, "onebit.node-a.event.odd_one"},
	}
	for _, ev := range evs {
		b.Emit(&ev.e)
	}
	b.Publish("onebit.node-a.custom", []byte(`{}`))
	obtest.WaitFor(t, 5*time.Second, "events", func() bool { return c.len() >= len(evs)+1 })
	got := c.snapshot()
	for i, ev := range evs {
		if got[i].Subject != ev.want {
			t.Errorf("event %d (%q→%q): subject %q, want %q", i, ev.e.Event, ev.e.To, got[i].Subject, ev.want)
		}
	}
	if got[len(evs)].Subject != "onebit.node-a.custom" {
		t.Errorf("Publish subject %q", got[len(evs)].Subject)
	}
}

func TestEmitNeverBlocksWhenQueueFull(t *testing.T) {
	logs := &obtest.Buffer{}
	const qsize = 1024
	b := openBus(t, Config{
		Listen: ListenOff, QueueSize: qsize, noPublisher: true,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	const n = 100_000
	e := testEvent("node-a", "boot1", 1)
	start := time.Now()
	for i := range n {
		e.Seq = uint64(i + 1)
		b.Emit(e)
	}
	elapsed := time.Since(start)
	s := b.Stats()
	if s.Queued != qsize || s.Dropped != n-qsize || s.Published != 0 {
		t.Fatalf("stats %+v, want queued %d, dropped %d", s, qsize, n-qsize)
	}
	// Dropped events are logged (rate-limited) with the running total.
	obtest.WaitFor(t, 5*time.Second, "drop log line", func() bool {
		return strings.Contains(logs.String(), "nats events dropped")
	})
	if lines, most := strings.Count(logs.String(), "nats events dropped"), 2+int(elapsed/dropLogInterval); lines > most {
		t.Errorf("drop logged %d times for one burst, want rate-limited:\n%s", lines, logs)
	}
}

func TestEmitAfterCloseDrops(t *testing.T) {
	b := openBus(t, Config{Listen: ListenOff})
	for i := range 100 {
		b.Emit(testEvent("node-a", "boot1", i))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if s := b.Stats(); s.Published != 100 || s.Queued != 0 {
		t.Fatalf("after Close: %+v, want the queue drained and 100 published", s)
	}
	b.Emit(testEvent("node-a", "boot1", 100))
	b.Publish("onebit.x", nil)
	if s := b.Stats(); s.Dropped != 2 {
		t.Fatalf("emit after Close: dropped %d, want 2", s.Dropped)
	}
	if _, err := b.InProcessConn(); err == nil {
		t.Fatal("InProcessConn after Close succeeded")
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestExternalServerDiesAndComesBack(t *testing.T) {
	ext := startNATS(t, -1, false)
	url := ext.ClientURL()
	logs := &obtest.Buffer{}
	b := openBus(t, Config{
		URLs: url, QueueSize: 1 << 16, ReconnectBufSize: 32 << 10,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})

	sub, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c := subscribe(t, sub, "onebit.>")

	// Phase 1: server up.
	for i := range 10 {
		b.Emit(testEvent("node-a", "before", i))
	}
	obtest.WaitFor(t, 5*time.Second, "events before the outage", func() bool { return c.len() >= 10 })

	// Phase 2: the server dies; Emit keeps returning, events are buffered by
	// nats.go up to ReconnectBufSize, then dropped and counted.
	extPort := ext.Addr().(*net.TCPAddr).Port
	ext.Shutdown()
	ext.WaitForShutdown()
	obtest.WaitFor(t, 5*time.Second, "bus to notice the outage", func() bool { return !b.nc.IsConnected() })
	const during = 2000 // ~300 bytes each: far beyond the 32 KiB reconnect buffer
	for i := range during {
		b.Emit(testEvent("node-a", "during", i))
	}
	obtest.WaitFor(t, 5*time.Second, "publisher to take the queue", func() bool { return b.Stats().Queued == 0 })
	s := b.Stats()
	if s.Dropped == 0 || s.Buffered == 0 {
		t.Fatalf("during the outage: %+v, want drops and buffered bytes", s)
	}
	if s.Published+s.Dropped != 10+during {
		t.Fatalf("during the outage: published %d + dropped %d != %d emitted", s.Published, s.Dropped, 10+during)
	}

	// Phase 3: the server comes back on the same port; publishing resumes.
	startNATS(t, extPort, false)
	obtest.WaitFor(t, 15*time.Second, "bus to reconnect", func() bool { return b.Stats().Reconnects >= 1 && b.nc.IsConnected() })
	obtest.WaitFor(t, 15*time.Second, "subscriber to reconnect", func() bool { return sub.IsConnected() })
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	const after = 50
	for i := range after {
		b.Emit(testEvent("node-a", "after", i))
	}
	countBoot := func(boot string) int {
		n := 0
		for _, m := range c.snapshot() {
			if strings.Contains(string(m.Data), `"boot":"`+boot+`"`) {
				n++
			}
		}
		return n
	}
	obtest.WaitFor(t, 10*time.Second, "events after the reconnect", func() bool { return countBoot("after") == after })
	for _, want := range []string{"nats disconnected", "nats reconnected", "nats events dropped"} {
		obtest.WaitFor(t, 5*time.Second, "log "+want, func() bool { return strings.Contains(logs.String(), want) })
	}
}

func TestOpenWithExternalServerDown(t *testing.T) {
	// Nothing listens there: Open must still succeed, and events queue up.
	ext := startNATS(t, -1, false)
	url := ext.ClientURL()
	port := ext.Addr().(*net.TCPAddr).Port
	ext.Shutdown()
	ext.WaitForShutdown()

	b := openBus(t, Config{URLs: url})
	if b.nc.IsConnected() {
		t.Fatal("connected to a server that is down")
	}
	b.Emit(testEvent("node-a", "early", 0))
	obtest.WaitFor(t, 5*time.Second, "publisher to buffer the event", func() bool { return b.Stats().Buffered > 0 })

	startNATS(t, port, false)
	sub, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c := subscribe(t, sub, "onebit.>")
	obtest.WaitFor(t, 15*time.Second, "bus to connect late", func() bool { return b.nc.IsConnected() })
	b.Emit(testEvent("node-a", "late", 1))
	obtest.WaitFor(t, 10*time.Second, "event after a late connect", func() bool {
		for _, m := range c.snapshot() {
			if strings.Contains(string(m.Data), `"boot":"late"`) {
				return true
			}
		}
		return false
	})
}

func TestOpenErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want error
	}{
		{"bad listen", Config{Listen: "nonsense"}, ErrBadListen},
		{"bad port", Config{Listen: "127.0.0.1:99999"}, ErrBadListen},
		{"jetstream without store", Config{Listen: ListenOff, JetStream: true}, ErrNoStoreDir},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Logger = discardLogger()
			b, err := Open(context.Background(), tt.cfg)
			if err == nil {
				_ = b.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Open: %v, want %v", err, tt.want)
			}
		})
	}
}

func TestListenPortInUse(t *testing.T) {
	first := openBus(t, Config{Listen: "127.0.0.1:0"})
	addr := strings.TrimPrefix(first.ClientURL(), "nats://")
	b, err := Open(context.Background(), Config{Listen: addr, Logger: discardLogger()})
	if err == nil {
		_ = b.Close()
		t.Fatalf("second server on %s started", addr)
	}
	if !errors.Is(err, ErrServerNotReady) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Open on a port in use: %v, want ErrServerNotReady naming %s", err, addr)
	}
	t.Log(err)
}

func TestParseListen(t *testing.T) {
	tests := []struct {
		in       string
		host     string
		port     int
		dont, ok bool
	}{
		{"", "127.0.0.1", 4222, false, true},
		{"off", "", 0, true, true},
		{"127.0.0.1:0", "127.0.0.1", -1, false, true},
		{"127.0.0.1:-1", "127.0.0.1", -1, false, true},
		{"0.0.0.0:4333", "0.0.0.0", 4333, false, true},
		{":4333", "127.0.0.1", 4333, false, true},
		{"[::1]:4222", "::1", 4222, false, true},
		{"localhost", "", 0, false, false},
		{"h:port", "", 0, false, false},
		{"h:70000", "", 0, false, false},
	}
	for _, tt := range tests {
		host, port, dont, err := parseListen(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("parseListen(%q) error %v, want ok=%v", tt.in, err, tt.ok)
			continue
		}
		if tt.ok && (host != tt.host || port != tt.port || dont != tt.dont) {
			t.Errorf("parseListen(%q) = %q, %d, %v; want %q, %d, %v", tt.in, host, port, dont, tt.host, tt.port, tt.dont)
		}
	}
}

func TestServerLogAdapterLevels(t *testing.T) {
	var buf obtest.Buffer
	lg := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a := slogAdapter{l: lg, fatal: new(atomic.Pointer[string])}
	a.Noticef("n %d", 1)
	a.Warnf("w %d", 2)
	a.Errorf("e %d", 3)
	a.Fatalf("f %d", 4)
	a.Debugf("d %d", 5)
	a.Tracef("t %d", 6)
	want := []struct{ level, msg string }{
		{"INFO", "n 1"}, {"WARN", "w 2"}, {"ERROR", "e 3"}, {"ERROR", "f 4"}, {"DEBUG", "d 5"}, {"DEBUG", "t 6"},
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	for i, l := range lines {
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Log   string `json:"nats_log"`
		}
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Level != want[i].level || rec.Log != want[i].msg || rec.Msg != "nats server" {
			t.Errorf("line %d = %+v, want %+v", i, rec, want[i])
		}
	}
	if got := a.fatal.Load(); got == nil || *got != "f 4" {
		t.Errorf("fatal message not kept: %v", got)
	}
}

// TestEmitLineSendsTheRecordersBytes: through a Recorder, the bus publishes
// the log's line without its newline, in seq order.
func TestEmitLineSendsTheRecordersBytes(t *testing.T) {
	b := openBus(t, Config{Listen: ListenOff})
	nc, err := b.InProcessConn()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := subscribe(t, nc, "onebit.>")
	var lines [][]byte
	logSink := event.SinkFunc(func(e *event.Event) { lines = append(lines, append(e.AppendJSON(nil), '\n')) })
	r := event.NewRecorder("node-a", logSink, b)
	const n = 50
	for i := range n {
		e := testEvent("", "", i)
		e.Node, e.Boot, e.Seq = "", "", 0
		r.Emit(e)
	}
	obtest.WaitFor(t, 5*time.Second, "events", func() bool { return c.len() == n })
	for i, m := range c.snapshot() {
		if want := strings.TrimSuffix(string(lines[i]), "\n"); string(m.Data) != want {
			t.Fatalf("message %d:\n got %s\nwant %s", i, m.Data, want)
		}
	}
}
