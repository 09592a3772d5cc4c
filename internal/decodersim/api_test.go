package decodersim

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/internal/simkv"
)

const notSupportedSlots = "This server does not support slots action. Start it with `--slot-save-path`"

// TestErrors checks status, error type and message of every error answer.
func TestErrors(t *testing.T) {
	long := make([]int, 600)
	for i := range long {
		long[i] = simkv.WordBase
	}
	noSave := func(c *Config) { c.SlotSavePath = "" }
	recurrent := func(c *Config) { c.Recurrent = true }
	tests := []struct {
		name   string
		cfg    func(*Config)
		method string
		path   string
		body   any
		status int
		typ    string
		msg    string // exact, or a prefix when it ends with "…"
	}{
		{"unknown route", nil, "GET", "/nope", nil, 404, "not_found_error", "File Not Found"},
		{"wrong method", nil, "POST", "/health", "{}", 404, "not_found_error", "File Not Found"},
		{"completion invalid json", nil, "POST", "/completion", "{nope", 500, "server_error", "[json.exception.parse_error.101] parse error…"},
		{"completion no prompt", nil, "POST", "/completion", "{}", 400, "invalid_request_error", `"prompt" is required`},
		{"completion null prompt", nil, "POST", "/completion", `{"prompt":null}`, 400, "invalid_request_error", `"prompt" is required`},
		{"completion number prompt", nil, "POST", "/completion", `{"prompt":5}`, 400, "invalid_request_error", errPromptShape},
		{"completion object prompt", nil, "POST", "/completion", `{"prompt":{}}`, 400, "invalid_request_error", errPromptShape},
		{"completion list of prompts", nil, "POST", "/completion", `{"prompt":[[1,2],[3]]}`, 400, "invalid_request_error", "the simulator serves one prompt per request; got a list of 2 prompts"},
		{"completion list of strings", nil, "POST", "/completion", `{"prompt":["a","b"]}`, 400, "invalid_request_error", "the simulator serves one prompt per request; got a list of 2 prompts"},
		{"completion invalid token", nil, "POST", "/completion", `{"prompt":[1,99999]}`, 400, "invalid_request_error", "Prompt contains invalid tokens"},
		{"completion token past the vocabulary", nil, "POST", "/completion", `{"prompt":[1,1100]}`, 400, "invalid_request_error", "Prompt contains invalid tokens"},
		{"completion negative token", nil, "POST", "/completion", `{"prompt":[-1]}`, 400, "invalid_request_error", "Prompt contains invalid tokens"},
		{"completion fractional token", nil, "POST", "/completion", `{"prompt":[1.5]}`, 400, "invalid_request_error", errPromptElement},
		{"completion bool in prompt", nil, "POST", "/completion", `{"prompt":[true]}`, 400, "invalid_request_error", errPromptElement},
		{"completion huge token", nil, "POST", "/completion", `{"prompt":[1,99999999999]}`, 400, "invalid_request_error", "Prompt contains invalid tokens"},
		{"completion too long", nil, "POST", "/completion", map[string]any{"prompt": long}, 400, "exceed_context_size_error",
			"request (600 tokens) exceeds the available context size (512 tokens), try increasing it"},
		{"completion fills the context", nil, "POST", "/completion", map[string]any{"prompt": long[:512]}, 400, "exceed_context_size_error",
			"request (512 tokens) exceeds the available context size (512 tokens), try increasing it"},
		{"completion bad id_slot", nil, "POST", "/completion", `{"prompt":"x","id_slot":1}`, 400, "invalid_request_error", "invalid id_slot 1…"},
		{"completion bad stop", nil, "POST", "/completion", `{"prompt":"x","stop":5}`, 400, "invalid_request_error", `"stop" must be a string or an array of strings`},
		{"completion bad n_predict", nil, "POST", "/completion", `{"prompt":"x","n_predict":"a"}`, 500, "server_error", "[json.exception.type_error.302] n_predict…"},
		{"oai completion no prompt", nil, "POST", "/v1/completions", "{}", 400, "invalid_request_error", `"prompt" is required`},
		{"chat no messages", nil, "POST", "/v1/chat/completions", "{}", 400, "invalid_request_error", "'messages' is required"},
		{"chat messages not array", nil, "POST", "/v1/chat/completions", `{"messages":"hi"}`, 400, "invalid_request_error", "Expected 'messages' to be an array…"},
		{"chat empty messages", nil, "POST", "/v1/chat/completions", `{"messages":[]}`, 400, "invalid_request_error", "'messages' must not be empty"},
		{"template no role", nil, "POST", "/apply-template", `{"messages":[{"content":"x"}]}`, 400, "invalid_request_error", "message 0: missing 'role'"},
		{"template image part", nil, "POST", "/apply-template", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, "invalid_request_error", "message 0: unsupported content part type \"image_url\""},
		{"tokenize invalid json", nil, "POST", "/tokenize", "[", 500, "server_error", "[json.exception.parse_error.101]…"},
		{"detokenize bad tokens", nil, "POST", "/detokenize", `{"tokens":"x"}`, 500, "server_error", "[json.exception.type_error.302] tokens…"},

		{"slot id not a number", nil, "POST", "/slots/x?action=save", `{"filename":"a"}`, 400, "invalid_request_error", "Invalid slot ID"},
		{"slot id too large", nil, "POST", "/slots/1?action=save", `{"filename":"a"}`, 400, "invalid_request_error", "Invalid slot ID: 1 (total_slots is 1)"},
		{"slot id negative", nil, "POST", "/slots/-1?action=erase", "", 400, "invalid_request_error", "Invalid slot ID…"},
		{"bad action", nil, "POST", "/slots/0?action=bogus", "{}", 400, "invalid_request_error", "Invalid action"},
		{"no action", nil, "POST", "/slots/0", "{}", 400, "invalid_request_error", "Invalid action"},
		{"save invalid json", nil, "POST", "/slots/0?action=save", "{", 500, "server_error", "[json.exception.parse_error.101]…"},
		{"save empty body", nil, "POST", "/slots/0?action=save", "", 500, "server_error", "[json.exception.parse_error.101]…"},
		{"save no filename", nil, "POST", "/slots/0?action=save", "{}", 500, "server_error", "[json.exception.out_of_range.403] key 'filename' not found"},
		{"save filename not string", nil, "POST", "/slots/0?action=save", `{"filename":3}`, 500, "server_error", "[json.exception.type_error.302] type must be string, but is number"},
		{"save empty filename", nil, "POST", "/slots/0?action=save", `{"filename":""}`, 400, "invalid_request_error", "Invalid filename"},
		{"save slash", nil, "POST", "/slots/0?action=save", `{"filename":"a/b"}`, 400, "invalid_request_error", "Invalid filename"},
		{"save backslash", nil, "POST", "/slots/0?action=save", `{"filename":"a\\b"}`, 400, "invalid_request_error", "Invalid filename"},
		{"save dotdot", nil, "POST", "/slots/0?action=save", `{"filename":".."}`, 400, "invalid_request_error", "Invalid filename"},
		{"save inner dotdot", nil, "POST", "/slots/0?action=save", `{"filename":"a..b"}`, 400, "invalid_request_error", "Invalid filename"},
		{"save dot", nil, "POST", "/slots/0?action=save", `{"filename":"."}`, 400, "invalid_request_error", "Invalid filename"},
		{"save too long", nil, "POST", "/slots/0?action=save", map[string]string{"filename": strings.Repeat("a", 256)}, 400, "invalid_request_error", "Invalid filename"},
		{"save invalid utf8", nil, "POST", "/slots/0?action=save", "{\"filename\":\"a\xffb\"}", 400, "invalid_request_error", "Invalid filename"},
		{"save colon", nil, "POST", "/slots/0?action=save", `{"filename":"a:b"}`, 400, "invalid_request_error", "Invalid filename"},
		{"save control char", nil, "POST", "/slots/0?action=save", `{"filename":"a\u0001b"}`, 400, "invalid_request_error", "Invalid filename"},
		{"save leading space", nil, "POST", "/slots/0?action=save", `{"filename":" a"}`, 400, "invalid_request_error", "Invalid filename"},
		{"save trailing dot", nil, "POST", "/slots/0?action=save", `{"filename":"a."}`, 400, "invalid_request_error", "Invalid filename"},
		{"restore invalid filename", nil, "POST", "/slots/0?action=restore", `{"filename":"../x"}`, 400, "invalid_request_error", "Invalid filename"},
		{"restore missing file", nil, "POST", "/slots/0?action=restore", `{"filename":"none.bin"}`, 400, "invalid_request_error", "Unable to restore slot: open …"},
		{"share invalid json", nil, "POST", "/slots/0?action=share", "{", 500, "server_error", "[json.exception.parse_error.101]…"},
		{"share no socket", nil, "POST", "/slots/0?action=share", "{}", 400, "invalid_request_error", "socket is required"},
		{"share relative socket", nil, "POST", "/slots/0?action=share", `{"socket":"x.sock"}`, 400, "invalid_request_error", `socket must be an absolute path, got "x.sock"`},
		{"share nobody listening", nil, "POST", "/slots/0?action=share", `{"socket":"/nonexistent/x.sock"}`, 500, "server_error", "unable to share slot 0: fdpass: dial /nonexistent/x.sock…"},
		{"adopt invalid json", nil, "POST", "/slots/0?action=adopt", "[", 500, "server_error", "[json.exception.parse_error.101]…"},
		{"adopt no tokens", nil, "POST", "/slots/0?action=adopt", `{"share_id":1}`, 400, "invalid_request_error", "tokens is required"},
		{"adopt tokens not array", nil, "POST", "/slots/0?action=adopt", `{"tokens":"a","share_id":1}`, 400, "invalid_request_error", "tokens must be an array of token ids"},
		{"adopt invalid token", nil, "POST", "/slots/0?action=adopt", `{"tokens":[1,1100],"share_id":1}`, 400, "invalid_request_error", "invalid token 1100 at position 1…"},
		{"adopt no share_id", nil, "POST", "/slots/0?action=adopt", `{"tokens":[1]}`, 400, "invalid_request_error", "share_id is required"},
		{"adopt null share_id", nil, "POST", "/slots/0?action=adopt", `{"tokens":[1],"share_id":null}`, 400, "invalid_request_error", "share_id is required"},
		{"adopt bad share_id", nil, "POST", "/slots/0?action=adopt", `{"tokens":[1],"share_id":"x"}`, 400, "invalid_request_error", `share_id must be a positive integer, got "x"`},
		{"adopt never shared", nil, "POST", "/slots/0?action=adopt", `{"tokens":[1],"share_id":1}`, 400, "invalid_request_error", refused(1, 0)},
		{"adopt layout mismatch", nil, "POST", "/slots/0?action=adopt", `{"tokens":[1],"share_id":1,"layout_hash":"0123"}`, 400, "invalid_request_error", `layout_hash "0123" does not match this decoder's layout …`},
		{"adopt too long", nil, "POST", "/slots/0?action=adopt", map[string]any{"tokens": long, "share_id": 1}, 400, "exceed_context_size_error", "request (600 tokens) exceeds…"},

		{"save without save path", noSave, "POST", "/slots/0?action=save", `{"filename":"a"}`, 501, "not_supported_error", notSupportedSlots},
		{"restore without save path", noSave, "POST", "/slots/0?action=restore", `{"filename":"a"}`, 501, "not_supported_error", notSupportedSlots},
		{"erase without save path", noSave, "POST", "/slots/0?action=erase", "", 501, "not_supported_error", notSupportedSlots},
		{"share without save path", noSave, "POST", "/slots/0?action=share", `{"socket":"/x"}`, 501, "not_supported_error", notSupportedSlots},
		{"adopt without save path", noSave, "POST", "/slots/0?action=adopt", `{"tokens":[],"share_id":1}`, 501, "not_supported_error", notSupportedSlots},
		{"bad slot without save path", noSave, "POST", "/slots/x?action=bogus", "", 501, "not_supported_error", notSupportedSlots},
		{"share recurrent", recurrent, "POST", "/slots/0?action=share", `{"socket":"/x.sock"}`, 501, "not_supported_error", "no shareable region"},
		{"adopt recurrent", recurrent, "POST", "/slots/0?action=adopt", `{"tokens":[1],"share_id":1}`, 501, "not_supported_error", "no shareable region"},
		{"no-slots", func(c *Config) { c.NoSlots = true }, "GET", "/slots", nil, 501, "not_supported_error",
			"This server does not support slots endpoint. Start it with `--slots`"},
	}
	def := startSim(t, testConfig(t)) // shared by the cases without a cfg
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := *def
			if tc.cfg != nil {
				cfg := testConfig(t)
				tc.cfg(&cfg)
				s = *startSim(t, cfg)
			}
			s.t = t
			r := s.do(tc.method, tc.path, tc.body)
			code, typ, msg := r.errorOf(t)
			if r.status != tc.status || code != tc.status || typ != tc.typ {
				t.Errorf("got %d {code %d, type %q}, want %d %q; body %s", r.status, code, typ, tc.status, tc.typ, r.body)
			}
			if want, ok := strings.CutSuffix(tc.msg, "…"); ok {
				if !strings.HasPrefix(msg, want) {
					t.Errorf("message %q, want prefix %q", msg, want)
				}
			} else if msg != tc.msg {
				t.Errorf("message %q, want %q", msg, tc.msg)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
}

func TestInfoEndpoints(t *testing.T) {
	cfg := testConfig(t)
	cfg.NParallel = 2
	s := startSim(t, cfg)

	if r := s.do("GET", "/health", nil); r.status != 200 || string(r.body) != `{"status":"ok"}` {
		t.Errorf("/health: %d %s", r.status, r.body)
	}

	props := s.do("GET", "/props", nil).json(t)
	dgs := props["default_generation_settings"].(map[string]any)
	for k, want := range map[string]any{"total_slots": 2.0, "model_path": cfg.ModelPath, "chat_template": chatTemplate, "build_info": buildInfo} {
		if props[k] != want {
			t.Errorf("/props %s = %v, want %v", k, props[k], want)
		}
	}
	if dgs["n_ctx"] != 256.0 {
		t.Errorf("/props default_generation_settings.n_ctx = %v, want 256 (per slot)", dgs["n_ctx"])
	}

	var slots []map[string]any
	if err := json.Unmarshal(s.do("GET", "/slots", nil).body, &slots); err != nil || len(slots) != 2 {
		t.Fatalf("/slots: %v %v", err, slots)
	}
	for i, sl := range slots {
		if sl["id"] != float64(i) || sl["n_ctx"] != 256.0 || sl["is_processing"] != false {
			t.Errorf("/slots[%d] = %v", i, sl)
		}
	}

	models := s.do("GET", "/v1/models", nil).json(t)
	if d := models["data"].([]any); len(d) != 1 || d[0].(map[string]any)["id"] != cfg.ModelPath || models["object"] != "list" {
		t.Errorf("/v1/models = %v", models)
	}
}

func TestTokenize(t *testing.T) {
	s := startSim(t, testConfig(t))
	text := "Hello the cache\n"
	tests := []struct {
		name string
		body map[string]any
		want any
	}{
		{"default no BOS", map[string]any{"content": text}, simkv.Tokenize(text, false)},
		{"add_special", map[string]any{"content": text, "add_special": true}, simkv.Tokenize(text, true)},
		{"no content", map[string]any{}, []int{}},
		{"with pieces", map[string]any{"content": " theé", "with_pieces": true}, []any{
			map[string]any{"id": float64(simkv.Tokenize(" the", false)[0]), "piece": " the"},
			map[string]any{"id": float64(simkv.ByteBase + 0xc3), "piece": []any{195.0}},
			map[string]any{"id": float64(simkv.ByteBase + 0xa9), "piece": []any{169.0}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := s.post("/tokenize", tc.body)
			var got struct{ Tokens any }
			if err := json.Unmarshal(r.body, &got); err != nil || r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			want := tc.want
			if ids, ok := want.([]int); ok { // compare as JSON numbers
				b, _ := json.Marshal(ids)
				_ = json.Unmarshal(b, &want)
			}
			if !reflect.DeepEqual(got.Tokens, want) {
				t.Errorf("tokens %v, want %v", got.Tokens, want)
			}
		})
	}
	r := s.post("/detokenize", map[string]any{"tokens": simkv.Tokenize(text, true)})
	if got := r.json(t)["content"]; got != text {
		t.Errorf("/detokenize = %q, want %q", got, text)
	}
}

func TestApplyTemplate(t *testing.T) {
	s := startSim(t, testConfig(t))
	r := s.post("/apply-template", map[string]any{"messages": []map[string]any{
		{"role": "system", "content": "Be brief."},
		{"role": "user", "content": []map[string]string{{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}}},
	}})
	want := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
	if got := r.json(t)["prompt"]; got != want {
		t.Errorf("prompt %q, want %q", got, want)
	}
}

func TestLoading(t *testing.T) {
	cfg := testConfig(t)
	cfg.LoadingDelay = time.Hour
	s := startSim(t, cfg)
	for _, p := range []struct{ method, path string }{{"GET", "/health"}, {"GET", "/props"}, {"POST", "/completion"}, {"POST", "/slots/0?action=save"}} {
		r := s.do(p.method, p.path, `{"prompt":"x"}`)
		if code, typ, msg := r.errorOf(t); r.status != 503 || code != 503 || typ != "unavailable_error" || msg != "Loading model" {
			t.Errorf("%s while loading: %d %s", p.path, r.status, r.body)
		}
	}
	if r := s.do("GET", "/v1/models", nil); r.status != http.StatusOK {
		t.Errorf("/v1/models while loading: %d %s", r.status, r.body)
	}

	cfg.LoadingDelay = 30 * time.Millisecond
	s2 := startSim(t, cfg)
	obtest.WaitFor(t, 5*time.Second, "/health 200 after the loading delay", func() bool {
		return s2.do("GET", "/health", nil).status == http.StatusOK
	})
}
