package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/decodersim"
	"github.com/onebitd/onebitd/internal/obtest"
)

// The binaries a test runs as real processes, built once for the package:
// the provider is a real process even when the rest of the daemon is
// in-process, and --decoder-bin/--prefill-bin launch the simulator.
var providerBin, simBin, prefillBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "onebit-daemon-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	providerBin = filepath.Join(dir, "onebit-provider-sim")
	simBin = filepath.Join(dir, "onebit-decoder-sim")
	prefillBin = filepath.Join(dir, "onebit-prefill")
	cmd := exec.Command("go", "build", "-o", dir, "../cmd/onebit-provider-sim", "../cmd/onebit-decoder-sim", "../cmd/onebit-prefill")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build test binaries:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// stack is one in-process decoder simulator and one daemon in front of it.
type stack struct {
	d       *Daemon
	sim     *httptest.Server
	slotDir string
	cancel  context.CancelFunc
	served  chan error
}

type stackOpts struct {
	provider     bool
	share        bool
	providerArgs []string
	drain        time.Duration
	provTimeout  time.Duration
	mode         string
}

func newStack(t *testing.T, so stackOpts) *stack {
	t.Helper()
	state, slotDir, model := testDirs(t)
	cfg := decodersim.DefaultConfig()
	cfg.ModelPath = model
	cfg.NCtx = 4096
	cfg.NParallel = 1
	cfg.SlotSavePath = slotDir
	sim, err := decodersim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim.Handler())
	t.Cleanup(func() { ts.Close(); sim.Close() })

	o := Options{
		Listen:       "127.0.0.1:0",
		DecoderURL:   ts.URL,
		Model:        model,
		StateDir:     state,
		SlotDir:      slotDir,
		NATSListen:   NATSOff,
		Node:         "test",
		EventLogSync: "always",
		DrainTimeout: so.drain,
	}
	if so.provider {
		o.Provider = providerBin
		o.ProviderArgs = so.providerArgs
		o.KVShare = so.share
		o.ProviderTimeout = so.provTimeout
		o.ProviderMode = so.mode
	}
	d, err := New(o, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := d.Start(ctx); err != nil {
		cancel()
		d.Close()
		t.Fatal(err)
	}
	s := &stack{d: d, sim: ts, slotDir: slotDir, cancel: cancel, served: make(chan error, 1)}
	go func() { s.served <- d.Serve(ctx) }()
	t.Cleanup(func() { s.stop(t) })
	return s
}

// testDirs makes a state dir with its slot dir (0700) and a model file.
func testDirs(t testing.TB) (state, slotDir, model string) {
	t.Helper()
	state = t.TempDir()
	slotDir = filepath.Join(state, "slots")
	if err := os.MkdirAll(slotDir, 0o700); err != nil {
		t.Fatal(err)
	}
	model = filepath.Join(state, "m.gguf")
	if err := os.WriteFile(model, []byte("GGUF-SIM daemon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return state, slotDir, model
}

// stop drains and closes; it is idempotent.
func (s *stack) stop(t *testing.T) error {
	t.Helper()
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	s.cancel = nil
	err := <-s.served
	s.d.Close()
	return err
}

type answer struct {
	status  int
	route   string
	id      string
	content string
	promptN int
}

func complete(t *testing.T, url, prompt string) answer {
	t.Helper()
	return completeWith(t, url, map[string]any{"prompt": prompt, "n_predict": 8})
}

// completeWith posts req to /completion and reads the answer.
func completeWith(t *testing.T, url string, req map[string]any) answer {
	t.Helper()
	body, _ := json.Marshal(req)
	resp, err := http.Post(url+"/completion", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, route: resp.Header.Get("X-Onebit-Route"), id: resp.Header.Get("X-Onebit-Request-Id")}
	var o struct {
		Content string `json:"content"`
		Timings struct {
			PromptN int `json:"prompt_n"`
		} `json:"timings"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatalf("answer %d %q: %v", resp.StatusCode, raw, err)
	}
	a.content, a.promptN = o.Content, o.Timings.PromptN
	return a
}

const testPrompt = "the cache of the decoder slot is the token prefill and the water of the slot cache"

// readLog returns the events of the daemon's log.
func readLog(t *testing.T, d *Daemon) []event.Event {
	t.Helper()
	raw, err := os.ReadFile(d.Options().EventLog)
	if err != nil {
		t.Fatal(err)
	}
	var out []event.Event
	for _, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		e, err := event.Parse(line)
		if err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

// TestDaemonRoutes starts the whole daemon in-process on every route,
// serves a request, drains and closes, and leaves no goroutine behind.
func TestDaemonRoutes(t *testing.T) {
	// Registered first, so it runs after every other cleanup (the
	// simulators' servers included).
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections() // the test's own client
		goleak.VerifyNone(t, ignore)
	})
	plain := newStack(t, stackOpts{})
	want := complete(t, plain.d.URL(), testPrompt)
	if want.status != 200 || want.route != "plain" || want.content == "" {
		t.Fatalf("plain: %+v", want)
	}
	if err := plain.stop(t); err != nil {
		t.Fatalf("plain drain: %v", err)
	}
	for _, tc := range []struct {
		name, route string
		share       bool
		mode        string
	}{
		{"file", "file", false, ProviderModeExec},
		{"shared", "shared", true, ProviderModeExec},
		{"file, warm provider", "file", false, ProviderModeServe},
		{"shared, warm provider", "shared", true, ProviderModeServe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t, stackOpts{provider: true, share: tc.share, mode: tc.mode})
			if string(s.d.Route()) != tc.route {
				t.Fatalf("route %s", s.d.Route())
			}
			got := complete(t, s.d.URL(), testPrompt)
			if got.status != 200 || got.route != tc.route || got.content != want.content || got.promptN != 1 {
				t.Fatalf("%s: %+v, want text %q with prompt_n 1", tc.name, got, want.content)
			}
			// The finish event follows the answer: poll for it.
			obtest.WaitFor(t, 5*time.Second, "the request out of flight", func() bool { return s.d.HealthDetails().InFlight == 0 })
			if det := s.d.HealthDetails(); det.Route != tc.route || tc.mode == ProviderModeServe && det.Provider != "ok" {
				t.Fatalf("health details %+v", det)
			}
			if err := s.stop(t); err != nil {
				t.Fatalf("drain: %v", err)
			}
			var last event.Event
			evs := readLog(t, s.d)
			for _, e := range evs {
				if e.RequestID == got.id {
					last = e
				}
			}
			if last.To != "done" {
				t.Fatalf("request %s ended in %q", got.id, last.To)
			}
			// A clean stop's last line says how many were in flight.
			end := evs[len(evs)-1]
			if end.Event != event.Shutdown || end.InFlight == nil || *end.InFlight != 0 {
				t.Fatalf("last log line %+v, want the shutdown line with in_flight 0", end)
			}
			if left, _ := os.ReadDir(s.slotDir); len(left) != 0 {
				t.Fatalf("slot dir not empty after close: %v", left)
			}
		})
	}
}

// TestDaemonEventsOnNATS: the in-process bus carries the same transitions
// as the log.
func TestDaemonEventsOnNATS(t *testing.T) {
	s := newStack(t, stackOpts{})
	nc, err := s.d.Bus().InProcessConn()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("onebit.test.handoff.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	a := complete(t, s.d.URL(), testPrompt)
	var tos []string
	for len(tos) < 2 {
		msg, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("after %v: %v", tos, err)
		}
		e, err := event.Parse(msg.Data)
		if err != nil || e.RequestID != a.id {
			t.Fatalf("event %q: %v", msg.Data, err)
		}
		tos = append(tos, e.To)
	}
	if strings.Join(tos, ",") != "forwarding,done" {
		t.Fatalf("transitions %v", tos)
	}
}

// TestDaemonDrainCutsHandoff: SIGTERM (ctx cancelled) while a provider
// hangs: the handoff falls back before the drain limit, the client gets the
// plain answer, and Serve returns nil (exit 0).
func TestDaemonDrainCutsHandoff(t *testing.T) {
	s := newStack(t, stackOpts{provider: true, share: true, providerArgs: []string{"--hang"},
		drain: drainMargin + time.Second, provTimeout: time.Minute})
	done := make(chan answer, 1)
	go func() { done <- complete(t, s.d.URL(), testPrompt) }()
	obtest.WaitFor(t, 10*time.Second, "the provider is running", func() bool {
		for _, e := range readLogQuiet(s.d) {
			if e.To == "shared" {
				return true
			}
		}
		return false
	})
	start := time.Now()
	if err := s.stop(t); err != nil {
		t.Fatalf("drain: %v", err)
	}
	a := <-done
	if a.status != 200 || a.route != "fallback" {
		t.Fatalf("answer %+v", a)
	}
	if el := time.Since(start); el > drainMargin+time.Second+2*time.Second {
		t.Fatalf("drain took %s", el)
	}
	var fb *event.Event
	for _, e := range readLog(t, s.d) {
		if e.RequestID == a.id && e.Event == "fallback" {
			fb = &e
		}
	}
	if fb == nil || !strings.Contains(fb.Reason, "shutting down") {
		t.Fatalf("fallback event %+v", fb)
	}
	if left, _ := os.ReadDir(s.slotDir); len(left) != 0 {
		t.Fatalf("slot dir not empty: %v", left)
	}
}

func readLogQuiet(d *Daemon) []event.Event {
	raw, _ := os.ReadFile(d.Options().EventLog)
	var out []event.Event
	for _, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		if e, err := event.Parse(line); err == nil {
			out = append(out, e)
		}
	}
	return out
}

// TestStartDecoderNeverAnswers: a decoder that accepts connections and
// never answers must not hang startup (serve.go waited forever on /props).
func TestStartDecoderNeverAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan []net.Conn, 1)
	go func() {
		var conns []net.Conn // held open, never answered
		for {
			c, err := ln.Accept()
			if err != nil {
				held <- conns
				return
			}
			conns = append(conns, c)
		}
	}()
	defer func() {
		ln.Close()
		for _, c := range <-held {
			c.Close()
		}
	}()
	d, err := New(Options{Listen: "127.0.0.1:0", DecoderURL: "http://" + ln.Addr().String(), StateDir: t.TempDir(),
		NATSListen: NATSOff, Node: "t", DecoderWait: 1500 * time.Millisecond}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	errc := make(chan error, 1)
	go func() { errc <- d.Start(context.Background()) }()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Start succeeded against a decoder that never answers")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Start hangs on a decoder that never answers")
	}
}

func TestOptions(t *testing.T) {
	long := "/" + strings.Repeat("d", 120)
	cases := []struct {
		name string
		o    Options
		want error
	}{
		{"no decoder", Options{}, ErrDecoderChoice},
		{"both decoders", Options{DecoderURL: "http://x", DecoderBin: "x"}, ErrDecoderChoice},
		{"provider without model", Options{DecoderURL: "http://x", Provider: "p"}, ErrNoModel},
		{"slot dir too long", Options{DecoderURL: "http://x", KVShare: true, SlotDir: long}, ErrSlotDirLong},
		{"drain too short", Options{DecoderURL: "http://x", DrainTimeout: time.Second}, ErrDrainTooShort},
		{"ok", Options{DecoderURL: "http://x"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(tc.o, nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if err != nil {
				return
			}
			o := d.Options()
			if o.Listen != DefaultListen || o.Queue != DefaultQueue || o.DrainTimeout != DefaultDrainTimeout ||
				o.NATSListen != DefaultNATSListen || !filepath.IsAbs(o.SlotDir) || !filepath.IsAbs(o.StateDir) ||
				o.EventLog != filepath.Join(o.StateDir, "events.jsonl") {
				t.Fatalf("defaults not filled: %+v", o)
			}
		})
	}
}

// testLogger sends the daemon's log to the test's log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
