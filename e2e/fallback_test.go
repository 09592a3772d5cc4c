package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/obtest"
)

func init() {
	// reshare: prefill like the sim provider, then share the slot again
	// behind onebitd's back, so that the share_id onebitd holds is no longer
	// the slot's last one and the decoder must refuse the adopt.
	providerModes["reshare"] = func(args []string) int {
		if err := innerProvider(args); err != nil {
			fmt.Fprintln(os.Stderr, "inner provider:", err)
			return 1
		}
		dir, err := os.MkdirTemp("", "reshare")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		l, err := fdpass.Listen(dir, "x")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer l.Close()
		go func() {
			c, err := l.Accept(time.Now().Add(5 * time.Second))
			if err != nil {
				return
			}
			defer c.Close()
			if m, err := c.Receive(time.Now().Add(5*time.Second), 256); err == nil {
				m.Close()
			}
		}()
		body, _ := json.Marshal(map[string]string{"socket": l.Path()})
		resp, err := http.Post(os.Getenv("E2E_SIM_URL")+"/slots/0?action=share", "application/json", bytes.NewReader(body))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		resp.Body.Close()
		return 0
	}
}

// TestFallbacks: a smoke case per route, and the faults only real
// processes show (a provider's layout check, a decoder's restore of another
// model's state, its single-use share_id), give the plain route's text,
// X-Onebit-Route: fallback, exactly one reason naming the failure, and
// leave nothing behind. Every step × fault is handoff's in-process
// TestFallbackMatrix; the decoder's faults under load are the soak's.
func TestFallbacks(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	plains := map[string]*env{}
	plainFor := func(model string) *env { // the plain route on a decoder with the same model
		if plains[model] == nil {
			plains[model] = newEnv(t, envOpts{simModel: model})
		}
		return plains[model]
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		opts   envOpts
		step   string
		reason string
	}{
		{"provider exits 1", envOpts{share: true, provider: true, onebitArgs: []string{"--provider-arg=--fail"}}, "provider", "simulated failure"},
		{"provider exits 1 (file route)", envOpts{provider: true, onebitArgs: []string{"--provider-arg=--fail"}}, "provider", "simulated failure"},
		{"layout mismatch", envOpts{share: true, provider: true, simModel: modelFile(t, "b")}, "provider", "layout hash mismatch"},
		{"state for another model (file route)", envOpts{provider: true, simModel: modelFile(t, "b")}, "restore", "Unable to restore"},
		{"share_id refused", envOpts{share: true, providerBin: self, env: []string{"GO_WANT_HELPER_PROCESS=1", "E2E_PROVIDER_MODE=reshare", "E2E_PROVIDER_BIN=" + bins.prov}}, "adopt", "share_id"},
	}
	text := prompt(11, 300)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.onebitArgs = append(tc.opts.onebitArgs, "--log-level=debug")
			e := newEnv(t, tc.opts)
			plain := plainFor(tc.opts.simModel)
			base, _ := fdSnapshot(t, e.onebit.PID())
			for _, ep := range entries {
				for _, stream := range []bool{false, true} {
					want := complete(t, plain.onebitURL, ep, stream, text, nPredict)
					got := complete(t, e.onebitURL, ep, stream, text, nPredict)
					if got.status != 200 || got.route != "fallback" {
						t.Fatalf("%s stream=%v: status %d route %q body %s\nlog:\n%s", ep, stream, got.status, got.route, tail(got.body), tail(e.onebit.Logs()))
					}
					if got.text != want.text {
						t.Fatalf("%s: fallback text %q, plain %q", ep, got.text, want.text)
					}
					checkOneReason(t, e, got.reqID, tc.step, tc.reason)
				}
			}
			assertClean(t, e, base)
		})
	}
}

// checkOneReason: the request fell back exactly once, at step, with a reason
// containing reason, and its events in the event log end in done.
func checkOneReason(t *testing.T, e *env, reqID, step, reason string) {
	t.Helper()
	var evs []event.Event
	obtest.WaitFor(t, 5*time.Second, "the request's done event in the log", func() bool {
		evs = requestEvents(t, e, reqID)
		return len(evs) > 0 && evs[len(evs)-1].To == "done"
	})
	var reasons []string
	for _, ev := range evs {
		if ev.Reason != "" {
			reasons = append(reasons, ev.Reason)
		}
		if ev.Event == "fallback" && ev.Step != step {
			t.Errorf("step %q, want %q (reason %q)", ev.Step, step, ev.Reason)
		}
	}
	if len(reasons) != 1 || !strings.Contains(reasons[0], reason) {
		t.Fatalf("request %s: reasons %q, want exactly one containing %q", reqID, reasons, reason)
	}
}

// TestFallbackPeerAndSilence: the two failures of the share socket itself.
// A decoder launched through a wrapper that forks (the process that connects
// is not the one onebitd launched) is refused as the wrong peer; a decoder
// that answers share but never connects times out at the accept.
func TestFallbackPeerAndSilence(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	plain := newEnv(t, envOpts{})
	text := prompt(11, 300)
	want := complete(t, plain.onebitURL, epCompletion, false, text, nPredict)

	t.Run("decoder never connects", func(t *testing.T) {
		e := newEnv(t, envOpts{share: true, provider: true, simArgs: []string{"--share-no-connect"},
			onebitArgs: []string{"--accept-timeout=500ms"}})
		base, _ := fdSnapshot(t, e.onebit.PID())
		got := complete(t, e.onebitURL, epCompletion, false, text, nPredict)
		if got.route != "fallback" || got.text != want.text {
			t.Fatalf("route %s text %q want %q", got.route, got.text, want.text)
		}
		checkOneReason(t, e, got.reqID, "receive", "did not connect to the share socket")
		assertClean(t, e, base)
	})

	t.Run("wrong peer", func(t *testing.T) {
		dir := t.TempDir()
		wrapper := filepath.Join(dir, "decoder-wrapper.sh")
		// No exec: the simulator runs as the wrapper's child.
		script := "#!/bin/sh\n" + bins.sim + " \"$@\"\n"
		if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		e := newLaunchedEnv(t, wrapper, []string{"--provider", bins.prov, "--kv-share"})
		base, _ := fdSnapshot(t, e.onebit.PID())
		got := complete(t, e.onebitURL, epCompletion, false, text, nPredict)
		if got.route != "fallback" || got.text != want.text {
			t.Fatalf("route %s text %q want %q\n%s", got.route, got.text, want.text, tail(e.onebit.Logs()))
		}
		checkOneReason(t, e, got.reqID, "peer", "not the decoder")
		assertClean(t, e, base)
	})
}

// newLaunchedEnv runs onebitd with --decoder-bin bin (one slot, -c 20480).
func newLaunchedEnv(t *testing.T, bin string, args []string) *env {
	t.Helper()
	e := &env{stateDir: t.TempDir()}
	e.slotDir = filepath.Join(e.stateDir, "slots")
	e.model = modelFile(t, "a")
	all := append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", e.stateDir, "--model", e.model,
		"--log-format", "json", "--nats-listen", "off", "--node", "e2e", "--event-log-sync", "always",
		"--provider-timeout", "20s", "--handoff", "always"}, args...)
	all = append(all, "--decoder-bin", bin, "--", "-c", "20480", "--token-delay", "5ms")
	e.onebit, e.onebitURL = start(t, bins.onebitd, reOnebitd, all...)
	return e
}
