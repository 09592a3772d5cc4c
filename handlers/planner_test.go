package handlers

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/handoff"
	"github.com/onebitd/onebitd/internal/decodersim"
	"github.com/onebitd/onebitd/planner"
	"github.com/onebitd/onebitd/provider"
)

// onRun runs the real provider and calls hook first: a way to make
// something happen while a handoff is in flight.
type onRun struct {
	inner handoff.Provider
	hook  func(job *handoff.Job)
}

func (p onRun) Prefill(ctx context.Context, job *handoff.Job) (provider.Result, error) {
	p.hook(job)
	return p.inner.Prefill(ctx, job)
}

// sharedRoute is fileRoute's shared-route twin, with a hook in the
// provider.
func sharedRoute(t *testing.T, decURL string, sc decodersim.Config, hook func(*handoff.Job)) func(*Config) {
	t.Helper()
	dec, err := decoder.New(decURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(t.TempDir(), "provider-saw")
	prov := onRun{inner: handoff.Exec{Runner: &provider.Runner{Path: os.Args[0], Args: []string{"-provider", mark, "--compact"}, Timeout: 30 * time.Second}}, hook: hook}
	h := handoff.NewHandoff(handoff.Config{SlotDir: sc.SlotSavePath, Model: sc.ModelPath, Share: true, Slots: 1}, dec, prov, nil)
	t.Cleanup(func() { h.Close() })
	return func(c *Config) { c.Handoff = h }
}

type turnReply struct {
	Content string `json:"content"`
	Timings struct {
		PromptN int `json:"prompt_n"`
		CacheN  int `json:"cache_n"`
	} `json:"timings"`
}

func turn(t *testing.T, url, prompt string) (turnReply, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "n_predict": 6})
	resp, raw := post(t, url+"/completion", string(body))
	var r turnReply
	if resp.StatusCode != 200 || json.Unmarshal(raw, &r) != nil {
		t.Fatalf("answer %d %s", resp.StatusCode, raw)
	}
	return r, resp.Header.Get(HeaderRoute)
}

// TestRestartDuringIncrementalHandoff: when the decoder's identity changes
// while an incremental handoff runs (a restart between the slot choice and
// the share would leave cells 0..P-1 empty under an adopted prompt), the
// request is forwarded with cache_prompt false, so the decoder evaluates
// the whole prompt itself, and nothing is confirmed. A control run without
// the change is incremental (prompt_n 1).
func TestRestartDuringIncrementalHandoff(t *testing.T) {
	mod := func(c *decodersim.Config) { c.Compact = true }
	p1 := strings.Repeat("the cache of the decoder slot is the token prefill ", 8)
	plainURL := sim(t, mod)
	plain := newFront(t, plainURL.URL, nil)
	w1, _ := turn(t, plain.url, p1)
	p2 := p1 + w1.Content + " and the water of the slot"
	w2, _ := turn(t, plain.url, p2)

	for _, restart := range []bool{false, true} {
		name := map[bool]string{false: "control", true: "restart"}[restart]
		t.Run(name, func(t *testing.T) {
			ts, sc := simWrap(t, mod, nil)
			var id atomic.Int64
			id.Store(100)
			starts := make(chan int, 4)
			f := newFront(t, ts.URL, func(c *Config) {
				sharedRoute(t, ts.URL, sc, func(j *handoff.Job) {
					starts <- j.Start
					if restart && j.Start > 0 {
						id.Store(101) // the decoder "restarted" while the handoff ran
					}
				})(c)
				c.HandoffMode = planner.ModeAlways
				c.DecoderIdentity = func() int { return int(id.Load()) }
			})
			g1, r1 := turn(t, f.url, p1)
			g2, r2 := turn(t, f.url, p2)
			if <-starts != 0 || <-starts == 0 {
				t.Fatal("the second turn was not incremental")
			}
			if g1.Content != w1.Content || g2.Content != w2.Content || r1 != "shared" || r2 != "shared" {
				t.Fatalf("text %q %q (routes %s %s), plain said %q %q", g1.Content, g2.Content, r1, r2, w1.Content, w2.Content)
			}
			n := g2.Timings.PromptN + g2.Timings.CacheN
			switch {
			case restart && (g2.Timings.PromptN != n || g2.Timings.CacheN != 0):
				t.Fatalf("after a restart during the handoff: prompt_n %d cache_n %d, want the whole prompt (%d) evaluated", g2.Timings.PromptN, g2.Timings.CacheN, n)
			case !restart && g2.Timings.PromptN != 1:
				t.Fatalf("control: prompt_n %d, want 1", g2.Timings.PromptN)
			}
		})
	}
}

// TestProviderRefusesStart: a provider that does not accept --start (it
// exits 2, a usage error) falls back on its first incremental handoffs and,
// after maxStartRefusals, gets the whole prompt: handed over again, with
// the text of the plain route throughout.
func TestProviderRefusesStart(t *testing.T) {
	mod := func(c *decodersim.Config) { c.Compact = true }
	ts, sc := simWrap(t, mod, nil)
	plainTS := sim(t, mod)
	plain := newFront(t, plainTS.URL, nil)
	dec, err := decoder.New(ts.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(t.TempDir(), "provider-saw")
	script := `case " $* " in *" --start "*) echo "flag provided but not defined: -start" >&2; exit 2;; esac; exec "$0" "$@"`
	prov := &provider.Runner{Path: "/bin/sh", Args: []string{"-c", script, os.Args[0], "-provider", mark, "--compact"}, Timeout: 30 * time.Second}
	h := handoff.NewHandoff(handoff.Config{SlotDir: sc.SlotSavePath, Model: sc.ModelPath, Share: true, Slots: 1}, dec, handoff.Exec{Runner: prov}, nil)
	t.Cleanup(func() { h.Close() })
	f := newFront(t, ts.URL, func(c *Config) { c.Handoff, c.HandoffMode = h, planner.ModeAlways })

	prompt := strings.Repeat("the cache of the decoder slot is the token prefill ", 8)
	want := []string{"shared", "fallback", "fallback", "fallback", "shared", "shared"}
	for k, route := range want {
		w, _ := turn(t, plain.url, prompt)
		g, r := turn(t, f.url, prompt)
		if g.Content != w.Content || r != route {
			t.Fatalf("turn %d: route %s %q, want route %s, plain said %q", k, r, g.Content, route, w.Content)
		}
		if route == "shared" && g.Timings.PromptN != 1 {
			t.Fatalf("turn %d: prompt_n %d", k, g.Timings.PromptN)
		}
		prompt += g.Content + " and the slot"
	}
	var incremental int
	for _, e := range f.mem.Events() {
		if e.From == "received" && e.TokensHeld > 0 && e.TokensPrefill < e.TokensHeld {
			incremental++
		}
	}
	if incremental != 3 {
		t.Fatalf("%d incremental decisions, want 3 (then whole prompts)", incremental)
	}
}
