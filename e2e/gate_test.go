package e2e

import (
	"encoding/json"
	"fmt"
	"os"
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
	t.Parallel() // own processes, ports and temp dirs
	prompts := gatePrompts
	if testing.Short() {
		prompts = gatePrompts[:1] // -short keeps the 250-token case
	}
	plain := newEnv(t, envOpts{})
	file := newEnv(t, envOpts{provider: true})
	shared := newEnv(t, envOpts{provider: true, share: true})
	baseFile, _ := fdSnapshot(t, file.onebit.PID())
	baseShared, _ := fdSnapshot(t, shared.onebit.PID())

	for _, p := range prompts {
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

func init() {
	// corrupt: prefill one token wrong (the middle one), so the decoder is
	// handed KV that does not belong to the prompt.
	providerModes["corrupt"] = func(args []string) int {
		for i := 0; i+1 < len(args); i++ {
			if args[i] != "--tokens" {
				continue
			}
			raw, err := os.ReadFile(args[i+1])
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			var toks []int
			if err := json.Unmarshal(raw, &toks); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			toks[len(toks)/2] = toks[len(toks)/2]%200 + 4 // another byte token
			// The tokens arrive as /proc/self/fd/N (a sealed memfd): the
			// corrupt copy goes to a temp file.
			f, err := os.CreateTemp("", "corrupt-tokens")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			b, _ := json.Marshal(toks)
			_, err = f.Write(b)
			f.Close()
			defer os.Remove(f.Name())
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			args[i+1] = f.Name()
		}
		if err := innerProvider(args); err != nil {
			return 1
		}
		return 0
	}
}

// TestGateDetectsWrongKV is the gate's control: a provider that prefills a
// prompt differing in one token. On the shared route the decoder adopts the
// cells under onebitd's token list, so the handoff looks successful
// (prompt_n == 1) and only the text tells; on the file route the state file
// carries its own tokens, so the decoder re-evaluates from the difference
// (prompt_n > 1). Either way TestGate's checks would fail: identical text
// with prompt_n == 1 means the right KV arrived.
func TestGateDetectsWrongKV(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	provEnv := []string{"GO_WANT_HELPER_PROCESS=1", "E2E_PROVIDER_MODE=corrupt", "E2E_PROVIDER_BIN=" + bins.prov}
	plain := newEnv(t, envOpts{})
	text := prompt(21, 600)
	want := complete(t, plain.onebitURL, epCompletion, false, text, nPredict)

	shared := newEnv(t, envOpts{share: true, providerBin: self, env: provEnv})
	got := complete(t, shared.onebitURL, epCompletion, false, text, nPredict)
	if got.route != "shared" || got.promptN != 1 {
		t.Fatalf("shared: the corrupt handoff should look successful: route %s prompt_n %d", got.route, got.promptN)
	}
	if got.text == want.text {
		t.Fatalf("shared: wrong KV gave the same text %q: the gate cannot tell", got.text)
	}

	file := newEnv(t, envOpts{providerBin: self, env: provEnv})
	got = complete(t, file.onebitURL, epCompletion, false, text, nPredict)
	if got.route != "file" || got.promptN <= 1 {
		t.Fatalf("file: route %s prompt_n %d, want a restore whose tokens diverge (prompt_n > 1)", got.route, got.promptN)
	}
}
