package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/obtest"
)

// TestPrefillServer: --decoder-bin S --prefill-bin S (the simulator takes
// llama-server's flags): the file route through onebit-prefill gives the
// plain text with prompt_n 1; kill -9 of the prefill server means fallbacks
// with one reason until it is back, then the file route again.
func TestPrefillServer(t *testing.T) {
	for _, mode := range []string{ProviderModeExec, ProviderModeServe} {
		t.Run(mode, func(t *testing.T) { testPrefillServer(t, mode) })
	}
}

func testPrefillServer(t *testing.T, mode string) {
	state := t.TempDir()
	model := filepath.Join(state, "m.gguf")
	if err := os.WriteFile(model, []byte("GGUF-SIM prefill\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := Options{Listen: "127.0.0.1:0", DecoderBin: simBin, DecoderArgs: []string{"-c", "4096"},
		Model: model, NATSListen: NATSOff, Node: "t", EventLogSync: "always"}

	plainOpts := base
	plainOpts.StateDir = filepath.Join(state, "plain")
	plain := runDaemon(t, plainOpts)
	want := complete(t, plain.d.URL(), testPrompt)
	plain.stop(t)

	o := base
	o.StateDir = filepath.Join(state, "hybrid")
	o.PrefillBin = simBin
	o.PrefillProvider = prefillBin
	o.ProviderMode = mode // serve: onebit-prefill --serve, one warm provider
	s := runDaemon(t, o)
	got := complete(t, s.d.URL(), testPrompt)
	if got.status != 200 || got.route != "file" || got.content != want.content || got.promptN != 1 {
		t.Fatalf("file route through the prefill server: %+v, want %q with prompt_n 1", got, want.content)
	}

	pid := s.d.prefill.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	obtest.WaitFor(t, 10*time.Second, "the prefill server gone", func() bool { return obtest.Gone(pid) })
	fb := complete(t, s.d.URL(), testPrompt)
	if fb.status != 200 || fb.content != want.content {
		t.Fatalf("while the prefill server is down: %+v", fb)
	}
	if fb.route == "fallback" {
		var reasons []string
		for _, e := range readLog(t, s.d) {
			if e.RequestID == fb.id && e.Event == "fallback" {
				reasons = append(reasons, e.Reason)
			}
		}
		if len(reasons) != 1 || reasons[0] == "" {
			t.Fatalf("fallback reasons %q", reasons)
		}
	}
	obtest.WaitFor(t, 30*time.Second, "the file route again after the restart", func() bool {
		a := complete(t, s.d.URL(), testPrompt)
		return a.route == "file" && a.content == want.content && a.promptN == 1
	})
	const wantLife = "prefill.starting,prefill.ready,prefill.exited,prefill.starting,prefill.ready"
	var lifecycle []string
	obtest.WaitFor(t, 10*time.Second, "the prefill server's lifecycle events", func() bool {
		lifecycle = lifecycle[:0]
		for _, e := range readLog(t, s.d) {
			if strings.HasPrefix(e.Event, "prefill.") {
				lifecycle = append(lifecycle, e.Event)
			}
		}
		return strings.Join(lifecycle, ",") == wantLife
	})
}

// runDaemon runs a daemon built from o until the test ends.
func runDaemon(t *testing.T, o Options) *stack {
	t.Helper()
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
	s := &stack{d: d, slotDir: d.Options().SlotDir, cancel: cancel, served: make(chan error, 1)}
	go func() { s.served <- d.Serve(ctx) }()
	t.Cleanup(func() { s.stop(t) })
	return s
}

// TestRelativeStateDir: the default state dir is relative (./onebitd-state);
// a launched decoder's unix:// address and key file are built from it, so
// it is made absolute (a relative one failed at startup: bad decoder URL
// "unix://onebitd-state/run/decoder/decoder.sock").
func TestRelativeStateDir(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile("m.gguf", []byte("GGUF-SIM relative\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := runDaemon(t, Options{Listen: "127.0.0.1:0", DecoderBin: simBin, DecoderArgs: []string{"-c", "2048"},
		Model: "m.gguf", StateDir: "./onebitd-state", NATSListen: NATSOff, Node: "t"})
	if a := complete(t, s.d.URL(), testPrompt); a.status != 200 {
		t.Fatalf("%+v", a)
	}
}
