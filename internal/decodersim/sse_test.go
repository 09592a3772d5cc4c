package decodersim

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/onebitd/onebitd/internal/simkv"
)

// normalize blanks what differs between runs: ids, creation times, timings.
var (
	reCreated = regexp.MustCompile(`"created":\d+`)
	reID      = regexp.MustCompile(`"id":"chatcmpl-[A-Z0-9]+"`)
	reTimings = regexp.MustCompile(`"timings":\{[^}]*\}`)
)

func normalize(b []byte) string {
	s := reCreated.ReplaceAllString(string(b), `"created":0`)
	s = reID.ReplaceAllString(s, `"id":"X"`)
	return reTimings.ReplaceAllString(s, `"timings":{}`)
}

func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestSSEFraming compares the three streaming routes byte for byte with the
// framing the simulator promises (after blanking ids, times and timings):
// what it takes from llama-server — `data: ` events separated by a blank
// line, the final chunk's field names and order, `[DONE]` on the OpenAI
// routes only — with the simulator's own values. It guards the simulator
// against drift, not llama-server: LLAMA_SERVER.md and the probe are where
// llama-server's behaviour is checked.
func TestSSEFraming(t *testing.T) {
	cfg := testConfig(t)
	s := startSim(t, cfg)
	const nPredict = 4
	model := js(cfg.ModelPath)
	const fp = `"system_fingerprint":"` + buildInfo + `"`

	chatPrompt, _ := applyTemplate(json.RawMessage(`[{"role":"user","content":"hello"}]`))
	routes := []struct {
		name, path string
		body       map[string]any
		prompt     []int
		expect     func(toks []int, n int, fr string) string
	}{
		{"completion", "/completion", map[string]any{"prompt": promptText}, simkv.Tokenize(promptText, true),
			func(toks []int, n int, fr string) string {
				var b strings.Builder
				for i, tok := range toks {
					fmt.Fprintf(&b, `data: {"index":0,"content":%s,"tokens":[%d],"stop":false,"id_slot":0,"tokens_predicted":%d,"tokens_evaluated":%d}`+"\n\n",
						js(simkv.Piece(tok)), tok, i+1, n)
				}
				fmt.Fprintf(&b, `data: {"index":0,"content":"","tokens":[],"id_slot":0,"stop":true,"model":%s,"tokens_predicted":%d,"tokens_evaluated":%d,`+
					`"generation_settings":{"n_predict":-1,"samplers":["greedy"],"temperature":0.8},"prompt":%s,"has_new_line":false,"truncated":false,`+
					`"stop_type":"limit","stopping_word":"","tokens_cached":%d,"timings":{}}`+"\n\n",
					model, len(toks), n, js(promptText), n+len(toks)-1)
				return b.String()
			}},
		{"v1 completions", "/v1/completions", map[string]any{"prompt": promptText}, simkv.Tokenize(promptText, true),
			func(toks []int, n int, fr string) string {
				var b strings.Builder
				for _, tok := range toks {
					fmt.Fprintf(&b, `data: {"choices":[{"text":%s,"index":0,"logprobs":null,"finish_reason":null}],"created":0,"model":%s,%s,"object":"text_completion","id":"X"}`+"\n\n",
						js(simkv.Piece(tok)), model, fp)
				}
				fmt.Fprintf(&b, `data: {"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":%q}],"created":0,"model":%s,%s,"object":"text_completion",`+
					`"usage":{"completion_tokens":%d,"prompt_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}},"id":"X","timings":{}}`+"\n\n",
					fr, model, fp, len(toks), n, n+len(toks))
				return b.String() + "data: [DONE]\n\n"
			}},
		{"v1 chat completions", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hello"}}},
			simkv.Tokenize(chatPrompt, true),
			func(toks []int, n int, fr string) string {
				var b strings.Builder
				head := `"created":0,"id":"X","model":` + model + `,` + fp + `,"object":"chat.completion.chunk"`
				fmt.Fprintf(&b, `data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],%s}`+"\n\n", head)
				for _, tok := range toks {
					fmt.Fprintf(&b, `data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":%s}}],%s}`+"\n\n", js(simkv.Piece(tok)), head)
				}
				fmt.Fprintf(&b, `data: {"choices":[{"finish_reason":%q,"index":0,"delta":{}}],%s,`+
					`"usage":{"completion_tokens":%d,"prompt_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}},"timings":{}}`+"\n\n",
					fr, head, len(toks), n, n+len(toks))
				return b.String() + "data: [DONE]\n\n"
			}},
	}
	for _, rt := range routes {
		t.Run(rt.name, func(t *testing.T) {
			s.t = t
			body := map[string]any{"n_predict": nPredict, "max_tokens": nPredict, "cache_prompt": false, "stream": true, "return_tokens": true}
			for k, v := range rt.body {
				body[k] = v
			}
			// What the model generates for this prompt, from a plain run.
			plain := s.complete(map[string]any{"prompt": rt.prompt, "n_predict": nPredict, "cache_prompt": false})
			if plain.StopType != stopLimit {
				t.Skipf("the sim model ended early (%s) on this prompt", plain.StopType)
			}
			r := s.post(rt.path, body)
			if r.status != 200 || r.header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("%d %q %s", r.status, r.header.Get("Content-Type"), r.body)
			}
			want := rt.expect(plain.Tokens, len(rt.prompt), "length")
			if got := normalize(r.body); got != want {
				t.Errorf("stream differs\ngot:\n%s\nwant:\n%s", got, want)
			}
		})
	}

	t.Run("stop word held back", func(t *testing.T) {
		s.t = t
		plain := s.complete(map[string]any{"prompt": promptText, "n_predict": 6})
		stop := simkv.Piece(plain.Tokens[3])[:3] // a prefix first seen as a partial match
		full := s.complete(map[string]any{"prompt": promptText, "n_predict": 6, "stop": stop})
		r := s.post("/completion", map[string]any{"prompt": promptText, "n_predict": 6, "stop": stop, "stream": true})
		var text strings.Builder
		for ev := range strings.SplitSeq(strings.TrimSuffix(string(r.body), "\n\n"), "\n\n") {
			var c struct{ Content string }
			if err := json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &c); err != nil {
				t.Fatalf("event %q: %v", ev, err)
			}
			text.WriteString(c.Content)
		}
		if text.String() != full.Content || full.StopType != stopWord {
			t.Errorf("streamed %q, non-streamed %q (%s)", text.String(), full.Content, full.StopType)
		}
	})

	t.Run("tokens only with return_tokens", func(t *testing.T) {
		s.t = t
		for _, stream := range []bool{false, true} {
			r := s.post("/completion", map[string]any{"prompt": promptText, "n_predict": 2, "stream": stream})
			if strings.Contains(string(r.body), `"tokens":[`) && !strings.Contains(string(r.body), `"tokens":[]`) ||
				strings.Count(string(r.body), `"tokens":[]`) != strings.Count(string(r.body), `"tokens":`) {
				t.Errorf("stream %v: tokens without return_tokens: %s", stream, r.body)
			}
		}
	})

	t.Run("error before the first event", func(t *testing.T) {
		s.t = t
		r := s.post("/completion", `{"prompt":5,"stream":true}`)
		if _, typ, _ := r.errorOf(t); r.status != 400 || typ != "invalid_request_error" || r.header.Get("Content-Type") != "application/json; charset=utf-8" {
			t.Errorf("%d %s %s", r.status, r.header.Get("Content-Type"), r.body)
		}
	})
}
