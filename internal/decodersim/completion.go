package decodersim

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/onebitd/onebitd/internal/simfault"
	"github.com/onebitd/onebitd/internal/simkv"
)

// route is the API flavour of a completion endpoint.
type route int

const (
	routeNative route = iota // POST /completion
	routeText                // POST /v1/completions
	routeChat                // POST /v1/chat/completions
)

// genRequest is the union of the completion bodies the sim reads; sampling
// parameters (temperature, top_k, seed, …) are accepted and ignored: the sim
// is greedy.
type genRequest struct {
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	NPredict            *int            `json:"n_predict"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	CachePrompt         *bool           `json:"cache_prompt"`
	IDSlot              *int            `json:"id_slot"`
	Stream              bool            `json:"stream"`
	Stop                json.RawMessage `json:"stop"`
	Model               string          `json:"model"`
	ReturnTokens        bool            `json:"return_tokens"`
}

// timingsJSON is llama-server's timings object.
type timingsJSON struct {
	CacheN              int     `json:"cache_n"`
	PromptN             int     `json:"prompt_n"`
	PromptMs            float64 `json:"prompt_ms"`
	PromptPerTokenMs    float64 `json:"prompt_per_token_ms"`
	PromptPerSecond     float64 `json:"prompt_per_second"`
	PredictedN          int     `json:"predicted_n"`
	PredictedMs         float64 `json:"predicted_ms"`
	PredictedPerTokenMs float64 `json:"predicted_per_token_ms"`
	PredictedPerSecond  float64 `json:"predicted_per_second"`
}

func perToken(ms float64, n int) (perTok, perSec float64) {
	if n == 0 || ms <= 0 {
		return 0, 0
	}
	return ms / float64(n), 1e3 / ms * float64(n)
}

func (r *genResult) timings() timingsJSON {
	t := timingsJSON{CacheN: r.cacheN, PromptN: r.promptN, PromptMs: r.promptMs, PredictedN: len(r.tokens), PredictedMs: r.predictedMs}
	t.PromptPerTokenMs, t.PromptPerSecond = perToken(r.promptMs, r.promptN)
	t.PredictedPerTokenMs, t.PredictedPerSecond = perToken(r.predictedMs, len(r.tokens))
	return t
}

func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) {
	s.serveGen(w, r, routeNative)
}
func (s *Server) handleOAICompletion(w http.ResponseWriter, r *http.Request) {
	s.serveGen(w, r, routeText)
}
func (s *Server) handleOAIChat(w http.ResponseWriter, r *http.Request) { s.serveGen(w, r, routeChat) }

// serveGen is every completion route: parse, wait for the slot, generate,
// answer in the route's shape (streamed as SSE when asked).
func (s *Server) serveGen(w http.ResponseWriter, r *http.Request, rt route) {
	var req genRequest
	if e := readBody(r, &req); e != nil {
		writeError(w, e)
		return
	}
	p, e := s.genParams(&req, rt)
	if e != nil {
		writeError(w, e)
		return
	}
	p.tokenDelay = s.cfg.TokenDelay
	switch s.tokensFault(p.prompt) {
	case simfault.Gen500:
		writeError(w, apiErr(errServer, "simulated server error (fault gen-500)"))
		return
	case simfault.GenSlow:
		p.tokenDelay = genSlowTokenDelay
	}
	want := -1
	if req.IDSlot != nil {
		want = *req.IDSlot
	}
	if want < -1 || want >= s.cfg.NParallel {
		writeError(w, apiErr(errInvalidRequest, "invalid id_slot %d: the server has %d slots", want, s.cfg.NParallel))
		return
	}
	// Like upstream without context shift: the prompt must leave a cell free.
	if len(p.prompt) >= s.kv.slotCells {
		writeError(w, exceedContext(len(p.prompt), s.kv.slotCells))
		return
	}
	sl, err := s.sched.acquire(r.Context(), want, p.prompt)
	if err != nil {
		return // the client went away while waiting
	}
	defer s.sched.release(sl)

	model := req.Model
	if model == "" {
		model = s.cfg.ModelPath
	}
	out := &genWriter{w: w, rt: rt, model: model, stream: req.Stream, id: "chatcmpl-" + rand.Text(), created: time.Now().Unix(),
		slot: sl, nPrompt: len(p.prompt), returnTokens: req.ReturnTokens}
	res, err := s.generate(r.Context(), sl, p, out.partial)
	if err != nil {
		if out.started && !errors.Is(err, errClientGone) && r.Context().Err() == nil {
			out.streamError(apiErr(errServer, "%v", err))
		}
		return
	}
	out.final(&res, p.prompt)
}

// genParams validates a request into engine parameters.
func (s *Server) genParams(req *genRequest, rt route) (genParams, *apiError) {
	p := genParams{nPredict: -1, cachePrompt: true}
	var e *apiError
	if rt == routeChat {
		text, e := applyTemplate(req.Messages)
		if e != nil {
			return p, e
		}
		p.prompt = simkv.Tokenize(text, true)
	} else if p.prompt, e = parsePrompt(req.Prompt); e != nil {
		return p, e
	}
	for _, n := range []*int{req.NPredict, req.MaxTokens, req.MaxCompletionTokens} {
		if n != nil {
			p.nPredict = *n
			break
		}
	}
	if req.CachePrompt != nil {
		p.cachePrompt = *req.CachePrompt
	}
	if p.stop, e = parseStop(req.Stop); e != nil {
		return p, e
	}
	return p, nil
}

// errClientGone: writing to the client failed; the stream is over.
var errClientGone = errors.New("decodersim: client connection lost")

// genWriter shapes engine output into a route's responses.
type genWriter struct {
	w       http.ResponseWriter
	rt      route
	model   string
	stream  bool
	id      string
	created int64
	started bool // SSE headers and at least one event sent
	slot    *slot
	nPrompt int
	// returnTokens fills the native routes' "tokens" fields (upstream's
	// return_tokens; without it they stay empty).
	returnTokens bool
}

func (g *genWriter) tokens(t []int) []int {
	if !g.returnTokens {
		return []int{}
	}
	return nonNil(t)
}

// sse writes one "data: <json>\n\n" event and flushes.
func (g *genWriter) sse(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return g.sseRaw(b)
}

func (g *genWriter) sseRaw(b []byte) error {
	if !g.started {
		h := g.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		g.w.WriteHeader(http.StatusOK)
		g.started = true
	}
	buf := make([]byte, 0, len(b)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	if _, err := g.w.Write(buf); err != nil {
		return errClientGone
	}
	if err := http.NewResponseController(g.w).Flush(); err != nil {
		return errClientGone
	}
	return nil
}

// streamError ends a started stream with an error event.
func (g *genWriter) streamError(e *apiError) {
	_ = g.sse(struct {
		Error *apiError `json:"error"`
	}{e})
}

// partial is the engine's emitFunc: one stream event per piece of text.
func (g *genWriter) partial(text string, tok int) error {
	if !g.stream {
		return nil
	}
	switch g.rt {
	case routeNative:
		return g.sse(nativePartial{Content: text, Tokens: g.tokens([]int{tok}), IDSlot: g.slot.id,
			TokensPredicted: int(g.slot.nDecoded.Load()), TokensEvaluated: g.nPrompt})
	case routeText:
		return g.sse(g.oaiText(text, nil))
	default:
		if !g.started {
			if err := g.sse(g.oaiChunk(roleDelta, nil)); err != nil {
				return err
			}
		}
		return g.sse(g.oaiChunk(map[string]string{"content": text}, nil))
	}
}

type nativePartial struct {
	Index           int    `json:"index"`
	Content         string `json:"content"`
	Tokens          []int  `json:"tokens"`
	Stop            bool   `json:"stop"`
	IDSlot          int    `json:"id_slot"`
	TokensPredicted int    `json:"tokens_predicted"`
	TokensEvaluated int    `json:"tokens_evaluated"`
}

type nativeFinal struct {
	Index              int            `json:"index"`
	Content            string         `json:"content"`
	Tokens             []int          `json:"tokens"`
	IDSlot             int            `json:"id_slot"`
	Stop               bool           `json:"stop"`
	Model              string         `json:"model"`
	TokensPredicted    int            `json:"tokens_predicted"`
	TokensEvaluated    int            `json:"tokens_evaluated"`
	GenerationSettings map[string]any `json:"generation_settings"`
	Prompt             string         `json:"prompt"`
	HasNewLine         bool           `json:"has_new_line"`
	Truncated          bool           `json:"truncated"`
	StopType           string         `json:"stop_type"`
	StoppingWord       string         `json:"stopping_word"`
	TokensCached       int            `json:"tokens_cached"`
	Timings            timingsJSON    `json:"timings"`
}

type usageJSON struct {
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokens        int `json:"prompt_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func usage(r *genResult) *usageJSON {
	u := &usageJSON{CompletionTokens: len(r.tokens), PromptTokens: r.nPrompt, TotalTokens: len(r.tokens) + r.nPrompt}
	u.PromptTokensDetails.CachedTokens = r.cacheN
	return u
}

func finishReason(r *genResult) string {
	if r.stopType == stopLimit {
		return "length"
	}
	return "stop"
}

type textChoice struct {
	Text         string  `json:"text"`
	Index        int     `json:"index"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type oaiText struct {
	Choices           []textChoice `json:"choices"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint"`
	Object            string       `json:"object"`
	Usage             *usageJSON   `json:"usage,omitempty"`
	ID                string       `json:"id"`
	Timings           *timingsJSON `json:"timings,omitempty"`
}

func (g *genWriter) oaiText(text string, finish *string) oaiText {
	return oaiText{
		Choices: []textChoice{{Text: text, FinishReason: finish}},
		Created: g.created, Model: g.model, SystemFingerprint: buildInfo, Object: "text_completion", ID: g.id,
	}
}

// chatMsg is a chat message or the first delta (content null).
type chatMsg struct {
	Role    string  `json:"role"`
	Content *string `json:"content"`
}

// roleDelta is the first delta of a chat stream.
var roleDelta = chatMsg{Role: "assistant"}

type chatChoice struct {
	FinishReason *string  `json:"finish_reason"`
	Index        int      `json:"index"`
	Delta        any      `json:"delta,omitempty"`
	Message      *chatMsg `json:"message,omitempty"`
}

type oaiChat struct {
	Choices           []chatChoice `json:"choices"`
	Created           int64        `json:"created"`
	ID                string       `json:"id"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint"`
	Object            string       `json:"object"`
	Usage             *usageJSON   `json:"usage,omitempty"`
	Timings           *timingsJSON `json:"timings,omitempty"`
}

// oaiChunk is a chat.completion.chunk; the first one announces the role
// with content null, the last one has an empty delta.
func (g *genWriter) oaiChunk(delta any, finish *string) oaiChat {
	return oaiChat{
		Choices: []chatChoice{{FinishReason: finish, Delta: delta}},
		Created: g.created, ID: g.id, Model: g.model, SystemFingerprint: buildInfo, Object: "chat.completion.chunk",
	}
}

// final writes the last answer: the whole response, or the last stream
// event (plus [DONE] on the OpenAI routes).
func (g *genWriter) final(r *genResult, prompt []int) {
	t := r.timings()
	fr := finishReason(r)
	switch g.rt {
	case routeNative:
		f := nativeFinal{
			Content: r.content, Tokens: g.tokens(r.tokens), IDSlot: r.slot, Stop: true, Model: g.model,
			TokensPredicted: len(r.tokens), TokensEvaluated: r.nPrompt,
			GenerationSettings: map[string]any{"n_predict": -1, "temperature": 0.8, "samplers": []string{"greedy"}},
			Prompt:             simkv.Detokenize(prompt), Truncated: r.truncated,
			StopType: r.stopType, StoppingWord: r.stoppingWord, TokensCached: r.tokensCached, Timings: t,
		}
		for _, c := range []byte(r.content) {
			f.HasNewLine = f.HasNewLine || c == '\n'
		}
		if g.stream {
			f.Content, f.Tokens = "", []int{}
			_ = g.sse(f)
			return
		}
		writeJSON(g.w, http.StatusOK, f)
	case routeText:
		if g.stream {
			v := g.oaiText("", &fr)
			v.Usage, v.Timings = usage(r), &t
			if g.sse(v) == nil {
				_ = g.sseRaw([]byte("[DONE]"))
			}
			return
		}
		v := g.oaiText(r.content, &fr)
		v.Usage, v.Timings = usage(r), &t
		writeJSON(g.w, http.StatusOK, v)
	default:
		if g.stream {
			if !g.started && g.sse(g.oaiChunk(roleDelta, nil)) != nil {
				return
			}
			v := g.oaiChunk(struct{}{}, &fr)
			v.Usage, v.Timings = usage(r), &t
			if g.sse(v) == nil {
				_ = g.sseRaw([]byte("[DONE]"))
			}
			return
		}
		content := r.content
		v := oaiChat{
			Choices: []chatChoice{{FinishReason: &fr, Message: &chatMsg{Role: "assistant", Content: &content}}},
			Created: g.created, ID: g.id, Model: g.model, SystemFingerprint: buildInfo, Object: "chat.completion",
			Usage: usage(r), Timings: &t,
		}
		writeJSON(g.w, http.StatusOK, v)
	}
}
