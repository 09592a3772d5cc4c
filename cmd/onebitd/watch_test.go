package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
)

// watchSession runs watchRun in a goroutine until stop is called.
type watchSession struct {
	stdout, stderr obtest.Buffer
	cancel         context.CancelFunc
	code           chan int
}

func startWatch(t *testing.T, tty bool, args ...string) *watchSession {
	t.Helper()
	s := &watchSession{code: make(chan int, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	ready := make(chan struct{})
	go func() {
		s.code <- watchRun(ctx, args, &s.stdout, &s.stderr, tty, func(string) { close(ready) })
	}()
	select {
	case <-ready:
	case code := <-s.code:
		cancel()
		t.Fatalf("watch %v exited %d before subscribing: %s", args, code, s.stderr.String())
	}
	t.Cleanup(func() { s.stop(t) })
	return s
}

// stop is Ctrl-C: watch exits 0.
func (s *watchSession) stop(t *testing.T) {
	t.Helper()
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	if code := <-s.code; code != 0 {
		t.Errorf("watch exited %d after cancel; stderr:\n%s", code, s.stderr.String())
	}
}

func watchEvents(node string) []*event.Event {
	t0 := time.Date(2025, 3, 1, 9, 30, 0, 0, time.UTC)
	sid := int64(4)
	exit := 1
	evs := []*event.Event{
		{RequestID: "r1", Route: "shared", Event: "listen", From: "received", To: "listening", ElapsedUS: 10},
		{RequestID: "r1", Route: "shared", Event: "share", From: "listening", To: "shared", ShareID: &sid, NFDs: 56, ElapsedUS: 900},
		{RequestID: "r1", Route: "shared", Event: "prefill", From: "shared", To: "prefilled", NTokens: 512, ElapsedUS: 50_000},
		{RequestID: "r1", Route: "shared", Event: "adopt", From: "prefilled", To: "adopted", ShareID: &sid, NTokens: 512, Cleanup: &event.Cleanup{FDsClosed: 56, FilesRemoved: 3}, ElapsedUS: 51_000},
		{RequestID: "r2", Route: "shared", Event: "fallback", From: "prefilled", To: "fallback", Step: "prefill", Reason: "the provider exited with status 1", ProviderExit: &exit, Cleanup: &event.Cleanup{}, ElapsedUS: 700},
		{RequestID: "r1", Route: "shared", Event: "forward", From: "adopted", To: "forwarding", ElapsedUS: 52_000},
		{RequestID: "r1", Route: "shared", Event: "finish", From: "forwarding", To: "done", HTTPStatus: 200, ElapsedUS: 90_000},
	}
	for i, e := range evs {
		e.V, e.Boot, e.Seq, e.Node = event.Version, "b00t", uint64(i+1), node
		e.Time = t0.Add(time.Duration(i) * time.Millisecond)
	}
	return evs
}

// openTestBus runs a daemon's bus: the embedded server, its credentials in
// a temporary state dir.
func openTestBus(t *testing.T, cfg bus.Config) *bus.Bus {
	t.Helper()
	if cfg.StateDir == "" && cfg.URLs == "" {
		cfg.StateDir = t.TempDir()
	}
	if cfg.Node == "" {
		cfg.Node = "node-a"
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := bus.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestWatchCommandEndToEnd(t *testing.T) {
	b := openTestBus(t, bus.Config{Listen: "127.0.0.1:0"})
	url, creds := b.ClientURL(), b.ReaderCreds()
	evs := watchEvents("node-a")
	local := func(e *event.Event) string { return e.Time.In(time.Local).Format("15:04:05.000") }

	tests := []struct {
		name string
		tty  bool
		args []string
		want []string // lines, in order
	}{
		{"all", false, []string{"--nats-url", url, "--nats-creds", creds}, []string{
			local(evs[0]) + " node-a r1 shared received→listening elapsed=10µs",
			local(evs[1]) + " node-a r1 shared listening→shared share_id=4 n_fds=56 elapsed=900µs",
			local(evs[2]) + " node-a r1 shared shared→prefilled n_tokens=512 elapsed=50ms",
			local(evs[3]) + " node-a r1 shared prefilled→adopted share_id=4 n_tokens=512 elapsed=51ms",
			local(evs[4]) + ` node-a r2 shared prefilled→fallback step=prefill reason="the provider exited with status 1" provider_exit=1 elapsed=700µs`,
			local(evs[5]) + " node-a r1 shared adopted→forwarding elapsed=52ms",
			local(evs[6]) + " node-a r1 shared forwarding→done http_status=200 elapsed=90ms",
		}},
		{"failed", false, []string{"--nats-url", url, "--nats-creds", creds, "--failed"}, []string{
			local(evs[4]) + ` node-a r2 shared prefilled→fallback step=prefill reason="the provider exited with status 1" provider_exit=1 elapsed=700µs`,
		}},
		{"tty colours", true, []string{"--nats-url", url, "--nats-nkey", creds, "--subject", "onebit.*.handoff.adopted", "--lines"}, []string{
			local(evs[3]) + " node-a r1 shared \x1b[32mprefilled→adopted\x1b[0m share_id=4 n_tokens=512 elapsed=51ms",
		}},
		{"json", true, []string{"--nats-url", url, "--nats-creds", creds, "--json", "--failed"}, []string{
			string(evs[4].AppendJSON(nil)),
		}},
	}
	// The sentinel is printed in every mode (it lands in adopted and
	// carries a reason); once it is out, everything before it is too.
	sentinel := *evs[3]
	sentinel.RequestID, sentinel.Reason, sentinel.Seq = "sentinel", "end of test", 99
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startWatch(t, tt.tty, tt.args...)
			if !strings.Contains(s.stderr.String(), "watching ") {
				t.Errorf("no 'watching' line on stderr: %q", s.stderr.String())
			}
			for _, e := range append(evs, &sentinel) {
				c := *e
				b.Emit(&c)
			}
			obtest.WaitFor(t, 10*time.Second, "the sentinel", func() bool { return strings.Contains(s.stdout.String(), "sentinel") })
			s.stop(t)
			lines := strings.SplitAfter(s.stdout.String(), "\n")
			got := strings.Join(lines[:len(lines)-2], "") // drop the sentinel line and the empty tail
			if want := strings.Join(tt.want, "\n") + "\n"; got != want {
				t.Fatalf("stdout:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func TestWatchCommandReconnects(t *testing.T) {
	start := func(port int) *server.Server {
		srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true})
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
	srv := start(-1)
	url := srv.ClientURL()
	port := srv.Addr().(*net.TCPAddr).Port
	s := startWatch(t, false, "--nats-url", url)

	srv.Shutdown()
	srv.WaitForShutdown()
	obtest.WaitFor(t, 10*time.Second, "disconnected line", func() bool { return strings.Contains(s.stderr.String(), "disconnected") })
	start(port)
	obtest.WaitFor(t, 15*time.Second, "reconnected line", func() bool { return strings.Contains(s.stderr.String(), "reconnected to") })

	b, err := bus.Open(context.Background(), bus.Config{URLs: url, Node: "node-b", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	e := watchEvents("node-b")[6]
	b.Emit(e)
	obtest.WaitFor(t, 10*time.Second, "event after reconnect", func() bool {
		return strings.Contains(s.stdout.String(), "node-b r1 shared forwarding→done")
	})
}

func TestWatchCommandErrors(t *testing.T) {
	b := openTestBus(t, bus.Config{Listen: "127.0.0.1:0"})
	creds := b.ReaderCreds()
	stranger := filepath.Join(t.TempDir(), "stranger.nk")
	other := openTestBus(t, bus.Config{Listen: bus.ListenOff, StateDir: filepath.Dir(stranger)})
	_ = other // its reader seed is a valid identity that b's server does not know
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"unknown flag", []string{"--nope"}, 2, "flag provided but not defined"},
		{"stray argument", []string{"extra"}, 2, `unexpected argument "extra"`},
		{"unreachable", []string{"--nats-url", "nats://127.0.0.1:1"}, 1, "cannot reach NATS at nats://127.0.0.1:1"},
		{"bad subject", []string{"--nats-url", b.ClientURL(), "--nats-creds", creds, "--subject", "a b"}, 1, "invalid subject"},
		{"no credentials", []string{"--nats-url", b.ClientURL()}, 1, "the server wants credentials: --nats-creds FILE"},
		{"unknown identity", []string{"--nats-url", b.ClientURL(), "--nats-creds", filepath.Join(filepath.Dir(stranger), bus.ReaderCredsFile)}, 1, "the server refused the credentials of"},
		{"creds file missing", []string{"--nats-url", b.ClientURL(), "--nats-creds", stranger}, 1, "cannot use NATS credentials"},
		{"creds and nkey", []string{"--nats-url", b.ClientURL(), "--nats-creds", creds, "--nats-nkey", creds}, 1, "not both"},
		{"help", []string{"-h"}, 0, "-failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := watchRun(context.Background(), tt.args, &stdout, &stderr, false, nil)
			if code != tt.code || !strings.Contains(stderr.String(), tt.msg) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, stderr.String(), tt.code, tt.msg)
			}
			if stdout.Len() != 0 && tt.code != 0 {
				t.Fatalf("stdout on error: %q", stdout.String())
			}
		})
	}
}

// TestWatchShowsNoForgedEvent: a process that connects to the embedded
// server without the daemon's credentials cannot make `onebitd watch` show
// a fallback that never happened (issue 10 item 2).
func TestWatchShowsNoForgedEvent(t *testing.T) {
	b := openTestBus(t, bus.Config{Listen: "127.0.0.1:0"})
	url := b.ClientURL()
	s := startWatch(t, false, "--nats-url", url, "--nats-creds", b.ReaderCreds())

	forged := *watchEvents("node-a")[4]
	forged.RequestID, forged.Reason = "forged", "forged by an intruder"
	for _, who := range []struct {
		name string
		opts []nats.Option
	}{
		{"anonymous", nil},
		{"reader", []nats.Option{nkeyOption(t, b.ReaderCreds())}},
	} {
		nc, err := nats.Connect(url, who.opts...)
		if err != nil {
			t.Logf("%s: connection refused: %v", who.name, err)
			continue
		}
		if err := nc.Publish("onebit.node-a.handoff.fallback", forged.AppendJSON(nil)); err != nil {
			t.Logf("%s: forged publish: %v", who.name, err)
		}
		_ = nc.Flush()
		nc.Close()
	}
	sentinel := *watchEvents("node-a")[6]
	sentinel.RequestID = "sentinel"
	b.Emit(&sentinel)
	obtest.WaitFor(t, 10*time.Second, "the daemon's own event", func() bool { return strings.Contains(s.stdout.String(), "sentinel") })
	s.stop(t)
	if out := s.stdout.String(); strings.Contains(out, "forged") {
		t.Fatalf("watch shows a forged event:\n%s", out)
	}
}

func nkeyOption(t *testing.T, seedFile string) nats.Option {
	t.Helper()
	o, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	return o
}
