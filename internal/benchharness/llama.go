package benchharness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
	"github.com/onebitd/onebitd/handlers"
	"github.com/onebitd/onebitd/machine"
)

// Section d: onebitd launching a real llama-server (LLAMA_SERVER, MODEL),
// the plain route against the file route (a second llama-server as the
// prefill server, bin/onebit-prefill as the provider), side by side.

// LlamaSizes are section d's target prompt lengths (tokens, BOS included);
// the prompts are built from English sentences sized with the decoder's
// /tokenize, and the report shows the lengths the decoder reported.
var LlamaSizes = []int{250, 3200, 12700}

// Section d's defaults.
const (
	LlamaCtx      = 16384 // -c: room for the longest prompt
	LlamaNPredict = 8     // tokens generated per request (greedy)
	llamaRounds   = 6     // measured rounds at scale 1 (6: benchmath's smallest sample with a 95 % CI)
	llamaReady    = 15 * time.Minute
	llamaRequest  = 15 * time.Minute // one request: a long prompt on a CPU takes minutes
)

// ErrLlamaConfig: section d was asked for without what it needs (a model).
var ErrLlamaConfig = errors.New("benchharness: llama-server section misconfigured")

// LlamaConfig is section d. With Server empty the section is skipped (the
// report says so).
type LlamaConfig struct {
	Server string   // llama-server binary (make bench LLAMA_SERVER=…)
	Model  string   // GGUF both llama-servers load (MODEL=…)
	Ctx    int      // -c of both llama-servers (0: LlamaCtx)
	Args   []string // more llama-server arguments, after -c N -fa off
	Sizes  []int    // target prompt lengths (nil: LlamaSizes)
	// NPredict is the tokens generated per request (0: LlamaNPredict).
	NPredict int
	// Rounds is the measured rounds (0: llamaRounds × Config.Scale, at
	// least 3); one more round of warm-up comes first.
	Rounds int
}

// LlamaRow is one prompt length, both routes.
type LlamaRow struct {
	Target int // the length asked for (capped to the context)
	// PlainTokens and FileTokens are prompt_n + cache_n as each decoder
	// reported them (min and max over the requests).
	PlainTokens, FileTokens [2]int
	// TTFT: request sent → the first streamed event carrying content.
	PlainTTFT, FileTTFT Summary
	// Added is file − plain per round; Ratio file / plain per round.
	Added Summary
	Ratio Stat
	// Prefill (received → prefill: tokenize, the prefill server's prompt
	// evaluation and save) and Restore (prefill → restore: ?action=restore
	// on the decoder) are the file route's phases from onebitd's event log.
	Prefill, Restore Summary
	// PlainPromptN and FilePromptN are the decoders' prompt_n (min, max).
	PlainPromptN, FilePromptN [2]int
	// Matched of Compared rounds generated the same text on both routes.
	Matched, Compared int
	// Fallbacks counts file-stack requests that did not take the file route
	// with prompt_n 1 (not sampled).
	Fallbacks int
}

// LlamaResult is section d.
type LlamaResult struct {
	// Skipped says why the section did not run ("": it ran); Failed why
	// it stopped (a llama-server that did not start, a request that
	// failed), with no rows.
	Skipped  string
	Failed   string
	Server   string
	Model    string
	Args     []string // the llama-servers' arguments as onebitd got them
	NCtx     int      // the decoder's n_ctx (/props)
	NPredict int
	Rounds   int
	Rows     []LlamaRow
}

// llamaSkipped is the report's line when LLAMA_SERVER is not set.
const llamaSkipped = "LLAMA_SERVER is not set; `make bench LLAMA_SERVER=/path/to/llama-server MODEL=/path/to/model.gguf` adds it"

// llamaText is the English the prompts repeat.
var llamaText = []string{
	" The lighthouse stood at the end of a long stone pier, and its keeper climbed the stairs every evening before the sun went down.",
	" He carried a can of oil, a clean cloth and a small notebook in which he wrote the weather, the ships he saw and the state of the lamp.",
	" In winter the waves broke over the pier and the spray froze on the railings, so that the walk out to the tower took twice as long.",
	" The village behind the harbour had a bakery, a school with two rooms, a church and a market that opened on Saturday mornings.",
	" Fishermen left before dawn and came back in the afternoon, and the children ran down to the quay to count the boxes of fish.",
	" Once a month a supply boat brought flour, lamp oil, letters and newspapers that were already a week old when they arrived.",
	" The keeper read every page of them at the kitchen table, slowly, while the kettle boiled and the clock on the wall ticked.",
	" On clear nights he could see the lights of three other towers along the coast, each flashing in its own pattern.",
	" Sailors learned those patterns by heart, because a light that flashed twice and then paused meant a different shore than one that flashed once.",
	" When fog came in from the sea he started the horn, which sounded every thirty seconds until the air cleared again.",
	" Some nights that took hours, and he sat by the window with a blanket over his knees, listening to the horn and the water.",
	" In spring the gulls returned to the cliffs, the ice melted from the railings, and the walk along the pier was short again.",
}

// llamaOpeners start each prompt: every request to a decoder starts with a
// different first word, so no prompt finds another's prefix in the slot.
var llamaOpeners = []string{"Amber", "Birch", "Cedar", "Dune", "Elm", "Fern", "Granite", "Heath", "Iris", "Juniper", "Kestrel", "Linden"}

// llamaStack is one onebitd launching llama-server(s).
type llamaStack struct {
	route    string
	proc     *Proc
	url      string
	stateDir string
}

func (c *Config) llamaDefaults() LlamaConfig {
	l := c.Llama
	if l.Ctx <= 0 {
		l.Ctx = LlamaCtx
	}
	if l.Sizes == nil {
		l.Sizes = LlamaSizes
	}
	if l.NPredict <= 0 {
		l.NPredict = LlamaNPredict
	}
	if l.Rounds <= 0 {
		l.Rounds = c.count(llamaRounds)
	}
	return l
}

// llamaArgs are the llama-servers' arguments: -c, -fa off (LLAMA_SERVER.md:
// with flash attention on a CPU, one token re-evaluated after a restore is
// not bit-identical to a batched prefill), then the caller's.
func (l *LlamaConfig) llamaArgs() []string {
	return append([]string{"-c", fmt.Sprint(l.Ctx), "-fa", "off"}, l.Args...)
}

// startLlamaStack starts `onebitd serve --decoder-bin` (plain), with
// --prefill-bin and bin/onebit-prefill on the file route.
func startLlamaStack(ctx context.Context, c *Config, l *LlamaConfig, route machine.Route) (*llamaStack, error) {
	s := &llamaStack{route: string(route), stateDir: filepath.Join(c.WorkDir, "llama-"+string(route))}
	if err := os.MkdirAll(s.stateDir, 0o700); err != nil {
		return nil, err
	}
	args := []string{"serve", "--listen", "127.0.0.1:0", "--state-dir", s.stateDir, "--nats-listen", "127.0.0.1:0",
		"--node", "bench", "--log-format", "json", "--decoder-wait", llamaReady.String(),
		"--model", l.Model, "--decoder-bin", l.Server}
	if route == machine.RouteFile {
		// A long prompt on a CPU takes minutes to prefill: onebitd's
		// provider limit (1m) and onebit-prefill's own (5m) would fall back.
		args = append(args, "--prefill-bin", l.Server, "--prefill-provider", c.bin("onebit-prefill"), "--handoff", "always",
			"--provider-timeout", llamaRequest.String(), "--provider-arg=--timeout="+llamaRequest.String(), "--adopt-timeout", "5m")
	}
	args = append(append(args, "--"), l.llamaArgs()...)
	p, url, err := startProcLimit(ctx, c.bin("onebitd"), nil, reOnebitdReady, llamaReady, args...)
	if err != nil {
		if why := onebitdStopped(err.Error()); why != "" {
			return nil, fmt.Errorf("onebitd, %s route: %w: %s", route, ErrExited, why)
		}
		return nil, fmt.Errorf("onebitd, %s route: %w", route, err)
	}
	s.proc, s.url = p, url
	return s, nil
}

// onebitdStopped is the error of onebitd's last "onebitd stopped" JSON log
// line in text (a process's stderr tail), or "".
func onebitdStopped(text string) string {
	lines := strings.Split(text, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		j := strings.Index(lines[i], "{")
		if j < 0 || !strings.Contains(lines[i], `"msg":"onebitd stopped"`) {
			continue
		}
		var l struct {
			Error string `json:"error"`
		}
		if json.Unmarshal([]byte(lines[i][j:]), &l) == nil && l.Error != "" {
			return l.Error
		}
	}
	return ""
}

// llamaReply is one streamed completion.
type llamaReply struct {
	route   string
	id      string
	ttft    time.Duration // request sent → first event with content
	text    string
	promptN int
	cacheN  int
}

// streamCompletion sends a streaming /completion (greedy) and reads it to
// its end.
func streamCompletion(ctx context.Context, hc *http.Client, url, prompt string, nPredict int) (llamaReply, error) {
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "n_predict": nPredict, "stream": true,
		"temperature": 0, "top_k": 1, "seed": 1, "cache_prompt": true})
	ctx, cancel := context.WithTimeout(ctx, llamaRequest)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/completion", bytes.NewReader(body))
	if err != nil {
		return llamaReply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return llamaReply{}, err
	}
	defer resp.Body.Close()
	r := llamaReply{route: resp.Header.Get(handlers.HeaderRoute), id: resp.Header.Get(handlers.HeaderRequestID)}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return r, fmt.Errorf("%w: %s/completion answered %d: %s", ErrBadResponse, url, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return r, fmt.Errorf("%w: %s/completion answered %q, not a stream", ErrBadResponse, url, ct)
	}
	if err := readLlamaStream(resp.Body, t0, &r); err != nil {
		return r, fmt.Errorf("%s/completion: %w", url, err)
	}
	return r, nil
}

// readLlamaStream reads a streamed /completion to its end into r: the text,
// the time from t0 to the first event carrying content (ttft), and the
// final event's timings. An error event, a malformed event or a stream
// without its final event is ErrBadResponse.
func readLlamaStream(body io.Reader, t0 time.Time, r *llamaReply) error {
	var text strings.Builder
	stopped := false
	br := bufio.NewReaderSize(body, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: ")); ok && !stopped {
			var ev struct {
				Content string          `json:"content"`
				Stop    bool            `json:"stop"`
				Error   json.RawMessage `json:"error"`
				Timings struct {
					PromptN int `json:"prompt_n"`
					CacheN  int `json:"cache_n"`
				} `json:"timings"`
			}
			if jerr := json.Unmarshal(data, &ev); jerr != nil {
				return fmt.Errorf("%w: stream event %.200q: %v", ErrBadResponse, data, jerr)
			}
			if len(ev.Error) > 0 && string(ev.Error) != "null" {
				return fmt.Errorf("%w: stream error %.300s", ErrBadResponse, ev.Error)
			}
			if ev.Content != "" && r.ttft == 0 {
				r.ttft = max(time.Since(t0), 1)
			}
			text.WriteString(ev.Content)
			if ev.Stop {
				r.promptN, r.cacheN, stopped = ev.Timings.PromptN, ev.Timings.CacheN, true
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
	}
	if !stopped {
		return fmt.Errorf("%w: the stream ended without its final event", ErrBadResponse)
	}
	if r.ttft == 0 {
		r.ttft = max(time.Since(t0), 1) // no content at all (EOS first): the whole answer
	}
	r.text = text.String()
	return nil
}

// tokenCount is the number of tokens of text without BOS (POST /tokenize).
func tokenCount(ctx context.Context, hc *http.Client, url, text string) (int, error) {
	body, _ := json.Marshal(map[string]any{"content": text})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Tokens []json.RawMessage `json:"tokens"`
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%w: /tokenize answered %d", ErrBadResponse, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("%w: /tokenize: %v", ErrBadResponse, err)
	}
	return len(out.Tokens), nil
}

// nCtx is the decoder's context per slot (/props), 0 if it does not say.
func nCtx(ctx context.Context, hc *http.Client, url string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/props", nil)
	if err != nil {
		return 0
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var out struct {
		Settings struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil {
		return 0
	}
	return out.Settings.NCtx
}

// llamaPrompt is the prompt of request k at about target tokens: an opener
// naming k (its first word differs from request k-1's), then llamaText
// repeated, stopping at the sentence boundary nearest the target.
// sentTokens are llamaText's token counts; opener counts the opener's.
func llamaPrompt(k, target int, sentTokens []int, opener func(string) int) string {
	first := fmt.Sprintf("%s entry %d follows.", llamaOpeners[k%len(llamaOpeners)], k)
	var b strings.Builder
	b.WriteString(first)
	n := 1 + opener(first) // BOS
	for i := 0; n < target; i++ {
		st := sentTokens[i%len(llamaText)]
		if n+st-target > target-n {
			break // stopping short is nearer the target than one more sentence
		}
		b.WriteString(llamaText[i%len(llamaText)])
		n += st
	}
	return b.String()
}

func runLlama(ctx context.Context, c *Config, log *slog.Logger) (*LlamaResult, error) {
	if c.Llama.Server == "" {
		return &LlamaResult{Skipped: llamaSkipped}, nil
	}
	l := c.llamaDefaults()
	if l.Model == "" {
		return nil, fmt.Errorf("%w: LLAMA_SERVER is set but MODEL is not", ErrLlamaConfig)
	}
	// onebitd runs in its own state dir: paths must not be relative.
	cc := *c
	c = &cc
	for _, p := range []*string{&l.Server, &l.Model, &c.BinDir, &c.WorkDir} {
		if *p == "" || p == &l.Server && !strings.Contains(*p, "/") {
			continue // a llama-server found in PATH
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, err
		}
		*p = abs
	}
	if _, err := os.Stat(l.Model); err != nil {
		return nil, fmt.Errorf("%w: MODEL: %w", ErrLlamaConfig, err)
	}
	res := &LlamaResult{Server: l.Server, Model: l.Model, Args: l.llamaArgs(), NPredict: l.NPredict, Rounds: l.Rounds}
	if err := measureLlama(ctx, c, &l, res, log); err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		// The other sections' results stay: the report says what failed.
		log.Error("section d failed", "error", err)
		res.Failed, res.Rows = err.Error(), nil
	}
	return res, nil
}

// measureLlama runs section d's two stacks and fills res.Rows.
func measureLlama(ctx context.Context, c *Config, l *LlamaConfig, res *LlamaResult, log *slog.Logger) error {
	log.Info("section d: launching llama-server on the plain route", "bin", l.Server, "model", l.Model)
	plain, err := startLlamaStack(ctx, c, l, machine.RoutePlain)
	if err != nil {
		return err
	}
	defer plain.proc.Stop()
	log.Info("section d: launching the decoder and the prefill server on the file route")
	file, err := startLlamaStack(ctx, c, l, machine.RouteFile)
	if err != nil {
		return err
	}
	defer file.proc.Stop()

	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DisableCompression = true
	hc := &http.Client{Transport: t} // per-request deadlines: llamaRequest
	defer t.CloseIdleConnections()

	// Size the prompts with the decoder's tokenizer, within its context.
	if res.NCtx = nCtx(ctx, hc, plain.url); res.NCtx <= 0 {
		res.NCtx = l.Ctx // -np 1: the slot has all of -c
	}
	sentTokens := make([]int, len(llamaText))
	for i, s := range llamaText {
		if sentTokens[i], err = tokenCount(ctx, hc, plain.url, s); err != nil {
			return err
		}
		sentTokens[i] = max(sentTokens[i], 1)
	}
	var tokErr error
	opener := func(s string) int {
		n, err := tokenCount(ctx, hc, plain.url, s)
		if err != nil && tokErr == nil {
			tokErr = err
		}
		return n
	}
	longest := slices.Max(sentTokens)
	sizes := slices.Clone(l.Sizes)
	for i, n := range sizes {
		sizes[i] = min(n, res.NCtx-l.NPredict-longest-32) // room for the last sentence and the answer
	}

	type sample struct {
		round int
		plain llamaReply
		file  llamaReply
	}
	samples := make([][]sample, len(sizes))
	k := 0
	for round := -1; round < l.Rounds; round++ { // one round of warm-up
		log.Info("section d", "round", max(round, 0), "of", l.Rounds, "warm-up", round < 0)
		for i, n := range sizes {
			prompt := llamaPrompt(k, n, sentTokens, opener)
			k++
			if tokErr != nil {
				return tokErr
			}
			sides := []*llamaStack{plain, file}
			if round%2 != 0 { // alternate who goes first
				sides[0], sides[1] = file, plain
			}
			var got [2]llamaReply
			for _, s := range sides {
				if err := ctx.Err(); err != nil {
					return err
				}
				r, err := streamCompletion(ctx, hc, s.url, prompt, l.NPredict)
				if err != nil {
					return fmt.Errorf("%s route, %d tokens: %w", s.route, n, err)
				}
				if s == plain {
					got[0] = r
				} else {
					got[1] = r
				}
			}
			if round >= 0 {
				samples[i] = append(samples[i], sample{round: round, plain: got[0], file: got[1]})
			}
		}
	}

	// onebitd flushes its event log when it stops.
	file.proc.Stop()
	logged := map[string][]event.Event{}
	if _, err := eventlog.ReadFile(filepath.Join(file.stateDir, "events.jsonl"), func(_ int, e event.Event) error {
		if e.RequestID != "" {
			logged[e.RequestID] = append(logged[e.RequestID], e)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("read the file route's event log: %w", err)
	}
	for i, n := range sizes {
		row := LlamaRow{Target: n}
		var pt, ft, prefill, restore []time.Duration
		pr, fr := Rounds{}, Rounds{}
		var pTok, fTok, pN, fN []int
		for _, sm := range samples[i] {
			pTok, pN = append(pTok, sm.plain.promptN+sm.plain.cacheN), append(pN, sm.plain.promptN)
			fTok, fN = append(fTok, sm.file.promptN+sm.file.cacheN), append(fN, sm.file.promptN)
			row.Compared++
			if sm.plain.text == sm.file.text {
				row.Matched++
			}
			pt = append(pt, sm.plain.ttft)
			pr[sm.round] = sm.plain.ttft
			if sm.file.route != string(machine.RouteFile) || sm.file.promptN != 1 {
				row.Fallbacks++
				log.Warn("section d: request did not take the file route", "tokens", n, "route", sm.file.route, "prompt_n", sm.file.promptN)
				continue
			}
			ph, err := phasesOf(string(machine.RouteFile), logged[sm.file.id])
			if err != nil {
				return fmt.Errorf("request %s: %w", sm.file.id, err)
			}
			prefill, restore = append(prefill, ph[PhasePrefill]), append(restore, ph[PhaseRestore])
			ft = append(ft, sm.file.ttft)
			fr[sm.round] = sm.file.ttft
		}
		row.PlainTokens, row.FileTokens = minMax(pTok), minMax(fTok)
		row.PlainPromptN, row.FilePromptN = minMax(pN), minMax(fN)
		row.PlainTTFT, row.FileTTFT = Summarize(pt), Summarize(ft)
		row.Prefill, row.Restore = Summarize(prefill), Summarize(restore)
		var added []time.Duration
		for r, f := range fr {
			added = append(added, f-pr[r])
		}
		row.Added, row.Ratio = Summarize(added), PairedRatio(fr, pr)
		res.Rows = append(res.Rows, row)
	}
	return nil
}

func minMax(xs []int) [2]int {
	if len(xs) == 0 {
		return [2]int{}
	}
	return [2]int{slices.Min(xs), slices.Max(xs)}
}

// fmtRange is "a" or "a–b".
func fmtRange(r [2]int) string {
	if r[0] == r[1] {
		return fmt.Sprint(r[0])
	}
	return fmt.Sprintf("%d–%d", r[0], r[1])
}

// fmtRatioCell is "median ×" with its interval when it has one.
func fmtRatioCell(st Stat) string {
	switch {
	case st.N == 0:
		return "–"
	case !st.HasCI:
		return fmtRatio(st.Center) + " ×"
	}
	return fmt.Sprintf("%s × [%s]", fmtRatio(st.Center), fmtRatioCI(st))
}

// LlamaSectionTitle heads section d in the report.
const LlamaSectionTitle = "## d. A real llama-server: plain vs file route"

func (r *Results) llamaMarkdown(b *strings.Builder) {
	l := r.Llama
	b.WriteString(LlamaSectionTitle + "\n\n")
	if l.Skipped != "" {
		fmt.Fprintf(b, "Skipped: %s.\n\n", l.Skipped)
		return
	}
	if l.Failed != "" {
		fmt.Fprintf(b, "**Failed** (`%s` with `%s`, args `%s`): %s\n\n", l.Server, l.Model, strings.Join(l.Args, " "), strings.ReplaceAll(l.Failed, "\n", " "))
		return
	}
	fmt.Fprintf(b, "`%s` with `%s`, launched by onebitd (`--decoder-bin`, args `%s`; n_ctx %d). Plain: `onebitd serve --decoder-bin` alone. File route: `onebitd serve --decoder-bin --prefill-bin --prefill-provider bin/onebit-prefill --handoff always` (the prefill server evaluates the prompt and saves the slot, the decoder restores it and evaluates the last token). Both stacks run at once; each prompt (English text, a different first sentence per request, sized with the decoder's `/tokenize`) goes to both, in alternating order, %d rounds after one of warm-up. Streaming `/completion`, greedy (`temperature` 0, `top_k` 1), `n_predict` %d.\n\n",
		l.Server, l.Model, strings.Join(l.Args, " "), l.NCtx, l.Rounds, l.NPredict)
	b.WriteString("| target tokens | tokens (prompt_n + cache_n) plain / file | time to first token, plain | file route | file − plain¹ | file : plain¹ | prefill phase² | restore phase² | prompt_n plain | prompt_n file | text = plain | fell back |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range l.Rows {
		fmt.Fprintf(b, "| %d | %s / %s | %s | %s | %s | %s | %s | %s | %s | %s | %d/%d | %d |\n", row.Target,
			fmtRange(row.PlainTokens), fmtRange(row.FileTokens), fmtSum(row.PlainTTFT), fmtSum(row.FileTTFT),
			fmtDiff(row.Added), fmtRatioCell(row.Ratio), fmtSum(row.Prefill), fmtSum(row.Restore), fmtRange(row.PlainPromptN), fmtRange(row.FilePromptN),
			row.Matched, row.Compared, row.Fallbacks)
	}
	b.WriteString("\n¹ per round, then the median (with its 95 % CI where there are 6 rounds or more). ² from the file stack's event log (`elapsed_us`): prefill = received → `prefill` (tokenize, the prefill server's evaluation and save), restore = `prefill` → `restore` (`?action=restore` on the decoder). Time to first token: request sent → the first streamed event with content.\n\n")
}
