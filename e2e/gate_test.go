package e2e

import (
	"fmt"
	"testing"
)

// gatePrompts are the three prompt sizes (about 250, 3 200 and
// 12 700 tokens).
var gatePrompts = []struct {
	name   string
	tokens int
	seed   uint64
}{
	{"250", 250, 1},
	{"3200", 3200, 2},
	{"12700", 12700, 3},
}

const nPredict = 24

// TestGate: identical greedy text on the plain, file and shared routes for
// every prompt, entry point and streaming mode; file and shared report
// prompt_n == 1; nothing is left behind.
func TestGate(t *testing.T) {
	if testing.Short() {
		t.Skip("long prompts")
	}
	plain := newEnv(t, envOpts{})
	file := newEnv(t, envOpts{provider: true})
	shared := newEnv(t, envOpts{provider: true, share: true})
	baseFile, _ := fdSnapshot(t, file.onebit.PID())
	baseShared, _ := fdSnapshot(t, shared.onebit.PID())

	for _, p := range gatePrompts {
		text := prompt(p.seed, p.tokens)
		for _, ep := range entries {
			for _, stream := range []bool{false, true} {
				name := fmt.Sprintf("%s%s/stream=%v", p.name, ep, stream)
				t.Run(name, func(t *testing.T) {
					want := complete(t, plain.onebitURL, ep, stream, text, nPredict)
					if want.status != 200 || want.text == "" || want.route != "plain" {
						t.Fatalf("plain: status %d route %q text %q body %s", want.status, want.route, want.text, tail(want.body))
					}
					for _, r := range []struct {
						e     *env
						route string
					}{{file, "file"}, {shared, "shared"}} {
						got := complete(t, r.e.onebitURL, ep, stream, text, nPredict)
						if got.status != 200 {
							t.Fatalf("%s: status %d: %s", r.route, got.status, tail(got.body))
						}
						if got.route != r.route {
							t.Fatalf("%s: X-Onebit-Route %q (onebitd log:\n%s)", r.route, got.route, tail(r.e.onebit.Logs()))
						}
						if got.text != want.text {
							t.Fatalf("%s: text differs from plain\nplain: %q\n%s: %q", r.route, want.text, r.route, got.text)
						}
						if got.promptN != 1 {
							t.Fatalf("%s: prompt_n %d cache_n %d, want prompt_n 1", r.route, got.promptN, got.cacheN)
						}
					}
				})
			}
		}
	}
	assertClean(t, file, baseFile)
	assertClean(t, shared, baseShared)
}
