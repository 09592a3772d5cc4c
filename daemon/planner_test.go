package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
	"github.com/onebitd/onebitd/internal/decodersim"
	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/internal/simkv"
)

// Issue 13's gates: multi-turn chat on the shared route with prefix-aware
// slots and incremental handoffs, and prefixes that must be forgotten.

// countingProvider writes a wrapper around the sim provider that appends
// "N START" (the job's tokens and its --start) to a file for every run,
// then execs the real provider with the same arguments and fds: the
// provider's own runs are what the gate counts.
func countingProvider(t *testing.T) (path, runs string) {
	t.Helper()
	dir := t.TempDir()
	runs = filepath.Join(dir, "runs")
	path = filepath.Join(dir, "provider.sh")
	script := `#!/bin/sh
tok=""; start=0; prev=""
for a in "$@"; do
  case "$prev" in --tokens) tok="$a";; --start) start="$a";; esac
  prev="$a"
done
n=$(tr -cd , < "$tok" | wc -c)
echo "$((n+1)) $start" >> ` + runs + `
exec ` + providerBin + ` "$@"
`
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return path, runs
}

// providerRuns reads the wrapper's file: the tokens of each job and the
// tokens it prefilled (N - start).
func providerRuns(t *testing.T, runs string) (jobs, whole, prefilled int) {
	t.Helper()
	raw, err := os.ReadFile(runs)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if l == "" {
			continue
		}
		var n, start int
		if _, err := fmt.Sscanf(l, "%d %d", &n, &start); err != nil {
			t.Fatalf("provider run line %q: %v", l, err)
		}
		jobs++
		whole += n
		prefilled += n - start
	}
	return jobs, whole, prefilled
}

type plannerOpts struct {
	provider string // "" plain
	handoff  string
	slots    int
	launched bool // --decoder-bin: the simulator as a supervised process
	expose   bool // --expose-slots-api

	promptMs     float64  // the decoder's prefill ms per token (--prompt-ms-per-token)
	providerArgs []string // after --compact
	nctx         int      // 0: 2048 per slot
	mode         string   // --provider-mode
}

// newPlannerStack is newStack with several slots, compact KV (fast), and
// the issue-13 options.
func newPlannerStack(t testing.TB, po plannerOpts) *stack {
	t.Helper()
	state, slotDir, model := testDirs(t)
	nctx := 2048 * po.slots
	if po.nctx != 0 {
		nctx = po.nctx
	}
	o := Options{
		Listen: "127.0.0.1:0", Model: model, StateDir: state, SlotDir: slotDir, NATSListen: NATSOff,
		Node: "test", EventLogSync: "batch", Slots: po.slots, Handoff: po.handoff, ExposeSlotsAPI: po.expose,
	}
	var ts *httptest.Server
	if po.launched {
		o.DecoderBin = simBin
		o.DecoderArgs = []string{"-c", strconv.Itoa(nctx), "--compact", "--prompt-ms-per-token", fmt.Sprint(po.promptMs)}
	} else {
		cfg := decodersim.DefaultConfig()
		cfg.ModelPath, cfg.NCtx, cfg.NParallel, cfg.SlotSavePath, cfg.Compact = model, nctx, po.slots, slotDir, true
		cfg.PromptMsPerToken = po.promptMs
		sim, err := decodersim.New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		ts = httptest.NewServer(sim.Handler())
		t.Cleanup(func() { ts.Close(); sim.Close() })
		o.DecoderURL = ts.URL
	}
	if po.provider != "" {
		o.Provider, o.ProviderArgs, o.KVShare = po.provider, append([]string{"--compact"}, po.providerArgs...), true
		o.ProviderMode = po.mode
	}
	log := slog.New(slog.DiscardHandler)
	if tt, ok := t.(*testing.T); ok {
		log = testLogger(tt)
	}
	d, err := New(o, log)
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
	t.Cleanup(func() {
		if s.cancel != nil {
			s.cancel()
			s.cancel = nil
			<-s.served
			s.d.Close()
		}
	})
	return s
}

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatAnswer struct {
	status         int
	route, id      string
	content        string
	promptN, cache int
}

func chat(t *testing.T, url string, msgs []chatMsg) chatAnswer {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"messages": msgs, "max_tokens": 12})
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return chatAnswer{}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var o struct {
		Choices []struct {
			Message chatMsg `json:"message"`
		} `json:"choices"`
		Timings struct {
			PromptN int `json:"prompt_n"`
			CacheN  int `json:"cache_n"`
		} `json:"timings"`
	}
	if err := json.Unmarshal(raw, &o); err != nil || len(o.Choices) != 1 {
		t.Errorf("answer %d %q: %v", resp.StatusCode, raw, err)
		return chatAnswer{status: resp.StatusCode}
	}
	return chatAnswer{status: resp.StatusCode, route: resp.Header.Get("X-Onebit-Route"), id: resp.Header.Get("X-Onebit-Request-Id"),
		content: o.Choices[0].Message.Content, promptN: o.Timings.PromptN, cache: o.Timings.CacheN}
}

// system is the conversations' shared system prompt (vocabulary words of
// the sim model: one token each).
var system = strings.TrimSpace(strings.Repeat("the cache of the decoder slot is the token prefill and the water of the slot cache ", 12))

func userTurn(conv, turn int) string {
	return fmt.Sprintf("conversation %d turn %d: the slot and the cache of the token", conv, turn)
}

// conversations runs convs conversations of turns turns each, workers at
// a time (each worker its conversations one after the other), and returns
// every answer, [conv][turn].
func conversations(t *testing.T, url string, convs, turns, workers int) [][]chatAnswer {
	t.Helper()
	out := make([][]chatAnswer, convs)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := w; c < convs; c += workers {
				msgs := []chatMsg{{"system", system}}
				for k := range turns {
					msgs = append(msgs, chatMsg{"user", userTurn(c, k)})
					a := chat(t, url, msgs)
					out[c] = append(out[c], a)
					msgs = append(msgs, chatMsg{"assistant", a.content})
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// decisions maps request id to the event that left received.
func decisions(t *testing.T, d *Daemon) map[string]event.Event {
	t.Helper()
	out := map[string]event.Event{}
	for _, e := range readLog(t, d) {
		if e.RequestID != "" && e.From == "received" {
			out[e.RequestID] = e
		}
	}
	return out
}

// TestMultiTurnIncremental is issue 13's multi-turn gate: 10 conversations
// × 5 turns through /v1/chat/completions, the history growing, on the
// shared route under --handoff always: every turn's text is the plain
// route's, every turn is handed over with prompt_n 1, and the provider
// prefills at most 30 % of the tokens full handoffs would.
func TestMultiTurnIncremental(t *testing.T) {
	const convs, turns, workers, slots = 10, 5, 2, 4
	plain := newPlannerStack(t, plannerOpts{slots: slots})
	want := conversations(t, plain.d.URL(), convs, turns, workers)

	prov, runs := countingProvider(t)
	s := newPlannerStack(t, plannerOpts{slots: slots, provider: prov, handoff: "always"})
	got := conversations(t, s.d.URL(), convs, turns, workers)
	if t.Failed() {
		t.FailNow()
	}
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}
	dec := decisions(t, s.d)
	incremental := 0
	for c := range convs {
		for k := range turns {
			g, w := got[c][k], want[c][k]
			if g.status != 200 || g.content != w.content {
				t.Errorf("conversation %d turn %d: %d %q, plain said %q", c, k, g.status, g.content, w.content)
			}
			if g.route != "shared" || g.promptN != 1 {
				t.Errorf("conversation %d turn %d: route %s prompt_n %d, want shared with prompt_n 1", c, k, g.route, g.promptN)
			}
			e := dec[g.id]
			if e.Decision != "handoff" || e.DecisionBasis != "always" {
				t.Errorf("conversation %d turn %d: decision %q (%q)", c, k, e.Decision, e.DecisionBasis)
			}
			if e.TokensHeld > 0 {
				incremental++
			}
		}
	}
	jobs, whole, prefilled := providerRuns(t, runs)
	t.Logf("%d provider runs, %d incremental: prefilled %d of %d prompt tokens (%.1f %%)",
		jobs, incremental, prefilled, whole, 100*float64(prefilled)/float64(whole))
	if jobs != convs*turns {
		t.Errorf("%d provider runs, want %d", jobs, convs*turns)
	}
	if prefilled*10 > whole*3 {
		t.Errorf("the provider prefilled %d of %d tokens (more than 30 %%)", prefilled, whole)
	}
}

// TestMultiTurnNative: turns of /completion (return_tokens) whose prompt
// is the last prompt + its answer + more, with the exec and the warm provider: the
// answer's generated tokens (listed by the native reply, counted by
// tokens_cached) are remembered too, so each turn after the first holds
// more than the previous prompt; text and prompt_n 1 as on the plain route.
func TestMultiTurnNative(t *testing.T) {
	run := func(url string) (out []answer) {
		prompt := system
		for k := range 4 {
			a := completeReturnTokens(t, url, prompt)
			out = append(out, a)
			prompt += a.content + fmt.Sprintf(" and the slot %d", k)
		}
		return out
	}
	plain := newPlannerStack(t, plannerOpts{slots: 2})
	want := run(plain.d.URL())
	for _, mode := range []string{ProviderModeExec, ProviderModeServe} {
		t.Run(mode, func(t *testing.T) {
			s := newPlannerStack(t, plannerOpts{slots: 2, provider: providerBin, handoff: "always", mode: mode})
			got := run(s.d.URL())
			if err := s.d.elog.Sync(); err != nil {
				t.Fatal(err)
			}
			dec := decisions(t, s.d)
			prevN := 0
			for k, g := range got {
				e := dec[g.id]
				if g.status != 200 || g.content != want[k].content || g.route != "shared" || g.promptN != 1 {
					t.Fatalf("turn %d: %+v, plain said %q", k, g, want[k].content)
				}
				if k > 0 && e.TokensHeld <= prevN {
					t.Errorf("turn %d held %d tokens, the previous prompt alone had %d", k, e.TokensHeld, prevN)
				}
				prevN = e.TokensHeld + e.TokensPrefill
			}
		})
	}
}

// completeReturnTokens is complete with "return_tokens": true (the client
// asks for its generated token ids, so the reply lists them).
func completeReturnTokens(t *testing.T, url, prompt string) answer {
	t.Helper()
	return completeWith(t, url, map[string]any{"prompt": prompt, "n_predict": 8, "return_tokens": true})
}

// TestForgottenPrefixNotUsed: a prefix the daemon had to forget is never
// used incrementally. A decoder restart (the launched decoder killed and
// restarted by its supervisor), a proxied request that may evaluate tokens
// into any slot, and an exposed slot API each make the next turn a full
// handoff (tokens_held 0, no --start) that still gives the plain text.
func TestForgottenPrefixNotUsed(t *testing.T) {
	msgs := []chatMsg{{"system", system}, {"user", userTurn(0, 0)}}
	next := func(a chatAnswer, k int) []chatMsg {
		return append(append([]chatMsg(nil), msgs...), chatMsg{"assistant", a.content}, chatMsg{"user", userTurn(0, k)})
	}
	plain := newPlannerStack(t, plannerOpts{slots: 1})
	w0 := chat(t, plain.d.URL(), msgs)
	w1 := chat(t, plain.d.URL(), next(w0, 1))

	for _, tc := range []struct {
		name   string
		po     plannerOpts
		forget func(t *testing.T, s *stack)
	}{
		{"decoder restart", plannerOpts{launched: true}, func(t *testing.T, s *stack) {
			old := s.d.launched.PID()
			if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			obtest.WaitFor(t, 30*time.Second, "the decoder restarted", func() bool {
				pid := s.d.launched.PID()
				return pid != 0 && pid != old && s.d.launched.Ready() == nil
			})
		}},
		{"proxied request", plannerOpts{}, func(t *testing.T, s *stack) {
			resp, err := http.Post(s.d.URL()+"/tokenize", "application/json", strings.NewReader(`{"content":"the slot"}`))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}},
		{"slot API exposed", plannerOpts{expose: true}, func(t *testing.T, s *stack) {
			resp, err := http.Post(s.d.URL()+"/slots/0?action=erase", "application/json", nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}},
		{"control: nothing forgotten", plannerOpts{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prov, runs := countingProvider(t)
			po := tc.po
			po.slots, po.provider, po.handoff = 1, prov, "always"
			s := newPlannerStack(t, po)
			a0 := chat(t, s.d.URL(), msgs)
			if tc.forget != nil {
				tc.forget(t, s)
			}
			a1 := chat(t, s.d.URL(), next(a0, 1))
			if a0.content != w0.content || a1.content != w1.content || a1.route != "shared" || a1.promptN != 1 {
				t.Fatalf("turns %+v %+v, plain said %q %q", a0, a1, w0.content, w1.content)
			}
			if err := s.stop(t); err != nil {
				t.Fatal(err)
			}
			held := decisions(t, s.d)[a1.id].TokensHeld
			_, whole, prefilled := providerRuns(t, runs)
			if tc.forget == nil {
				if held == 0 || prefilled == whole {
					t.Fatalf("control: turn 2 held %d tokens, the provider prefilled %d of %d: the prefix was not used", held, prefilled, whole)
				}
				return
			}
			if held != 0 || prefilled != whole {
				t.Fatalf("turn 2 after the slot was forgotten: tokens_held %d, the provider prefilled %d of %d", held, prefilled, whole)
			}
		})
	}
}

// TestAutoDecisions: under --handoff auto with no model yet, the static
// floor decides: a short prompt skips the handoff (the plain route with a
// decision, not a fallback), a long one is handed over; both give the plain
// text, the decision is on the event that leaves received, and the log
// passes the audit (skip-and-handoff included).
func TestAutoDecisions(t *testing.T) {
	long := strings.Repeat(system+" ", 6) // > 1024 tokens
	plain := newPlannerStack(t, plannerOpts{slots: 1})
	prov, _ := countingProvider(t)
	s := newPlannerStack(t, plannerOpts{slots: 1, provider: prov, handoff: "auto"})
	type turn struct {
		msgs           []chatMsg
		route, choice  string
		prefillAtLeast int
	}
	for i, tc := range []turn{
		{[]chatMsg{{"user", "the slot"}}, "plain", "skip", 1},
		{[]chatMsg{{"system", long}, {"user", "the slot"}}, "shared", "handoff", 1024},
	} {
		w := chat(t, plain.d.URL(), tc.msgs)
		g := chat(t, s.d.URL(), tc.msgs)
		if g.status != 200 || g.content != w.content || g.route != tc.route {
			t.Fatalf("turn %d: %+v, plain said %q, want route %s", i, g, w.content, tc.route)
		}
		if err := s.d.elog.Sync(); err != nil {
			t.Fatal(err)
		}
		e := decisions(t, s.d)[g.id]
		if e.Decision != tc.choice || e.DecisionBasis != "floor" || e.TokensPrefill < tc.prefillAtLeast || e.Route != tc.route {
			t.Fatalf("turn %d: event leaving received %+v", i, e)
		}
	}
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}
	a := eventlog.NewAuditor()
	for i, e := range readLog(t, s.d) {
		a.Add(i+1, e)
	}
	if rep := a.Finish(); !rep.OK() {
		t.Fatalf("audit: %v", rep.Violations)
	}
}

// BenchmarkHandoffBreakEven is issue 13's break-even benchmark: a provider
// 5× faster per token than the decoder (0.01 vs 0.05 ms) but 20 ms to
// start (--fixed-ms, plus its process start), a mixed workload of prompt
// lengths log-uniform in 10..12 000 tokens (60 prompts, one seed), the same
// workload under --handoff never, always and auto, side by side, on the
// shared route. It reports each mode's total time to first token (n_predict
// 1, not streamed: the answer's time), the oracle's (the better of never and
// always for each prompt, known only afterwards) and auto's decisions by
// basis.
func BenchmarkHandoffBreakEven(b *testing.B) {
	const prompts, decMs, provMs, provFixed = 60, 0.05, 0.01, 20
	rng := rand.New(rand.NewPCG(13, 13))
	work := make([][]int, prompts)
	for i := range work {
		n := int(math.Round(10 * math.Pow(1200, rng.Float64())))
		ids := make([]int, n)
		for j := range ids {
			ids[j] = simkv.WordBase + rng.IntN(simkv.VocabSize()-simkv.WordBase)
		}
		work[i] = ids
	}
	modes := []string{"never", "always", "auto"}
	stacks := map[string]*stack{}
	for _, m := range modes {
		stacks[m] = newPlannerStack(b, plannerOpts{slots: 1, nctx: 16384, promptMs: decMs, provider: providerBin,
			handoff: m, providerArgs: []string{"--fixed-ms", fmt.Sprint(provFixed), "--ms-per-token", fmt.Sprint(provMs)}})
	}
	total := map[string]time.Duration{}
	var oracle time.Duration // the better of never and always, prompt by prompt
	for b.Loop() {
		for _, ids := range work {
			body, _ := json.Marshal(map[string]any{"prompt": ids, "n_predict": 1})
			took := map[string]time.Duration{}
			for _, m := range modes { // side by side: each prompt under every mode in turn
				t0 := time.Now()
				resp, err := http.Post(stacks[m].d.URL()+"/completion", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				took[m] = time.Since(t0)
				total[m] += took[m]
				if resp.StatusCode != 200 {
					b.Fatalf("%s: status %d", m, resp.StatusCode)
				}
			}
			oracle += min(took["never"], took["always"])
		}
	}
	b.ReportMetric(float64(oracle.Milliseconds())/float64(b.N), "oracle-ttft-ms")
	for _, m := range modes {
		b.ReportMetric(float64(total[m].Milliseconds())/float64(b.N), m+"-ttft-ms")
	}
	if err := stacks["auto"].d.elog.Sync(); err != nil {
		b.Fatal(err)
	}
	bases := map[string]int{}
	for _, e := range readLogTB(b, stacks["auto"].d) {
		if e.Decision == "" {
			continue
		}
		bases[e.Decision+"/"+e.DecisionBasis]++
		if e.DecisionBasis == "explore" || (e.DecisionBasis == "model" && e.PredictedDecoder > 0 &&
			math.Abs(float64(e.PredictedHandoff-e.PredictedDecoder)) < 0.3*float64(e.PredictedDecoder)) {
			b.Logf("near the break-even: %s (%s) prefill %d: decoder %.1f ms vs handoff %.1f ms", e.Decision, e.DecisionBasis,
				e.TokensPrefill, float64(e.PredictedDecoder)/1000, float64(e.PredictedHandoff)/1000)
		}
	}
	est := stacks["auto"].d.front.Planner().Estimates()
	b.Logf("auto decisions %v; learned: decoder %.4f ms/token, provider %.1f ms + %.4f ms/token, handoff %.1f ms",
		bases, est.DecoderMsPerToken, est.ProviderFixedMs, est.ProviderMsPerToken, est.HandoffMs["shared"])
	if total["auto"] >= total["always"] || total["auto"] >= total["never"] {
		b.Errorf("auto %v is not below always %v and never %v", total["auto"], total["always"], total["never"])
	}
}

func readLogTB(tb testing.TB, d *Daemon) []event.Event {
	tb.Helper()
	raw, err := os.ReadFile(d.Options().EventLog)
	if err != nil {
		tb.Fatal(err)
	}
	var out []event.Event
	for _, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		e, err := event.Parse(line)
		if err != nil {
			tb.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}
