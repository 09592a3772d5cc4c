package prefill

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/onebitd/onebitd/internal/decodersim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// world is a decoder and a prefill server (both simulators, in process)
// sharing one slot directory, as docs/llama-server.md describes.
type world struct {
	model   string
	slotDir string
	decoder *httptest.Server
	prefill *httptest.Server
}

func startSim(t *testing.T, model, slotDir string, edit func(*testing.T, *decodersim.Config)) *httptest.Server {
	t.Helper()
	c := decodersim.DefaultConfig()
	c.ModelPath = model
	c.NCtx = 1024
	c.NParallel = 2
	c.SlotSavePath = slotDir
	if edit != nil {
		edit(t, &c)
	}
	srv, err := decodersim.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	return ts
}

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newWorld(t *testing.T, editPrefill func(*testing.T, *decodersim.Config)) *world {
	t.Helper()
	dir := t.TempDir()
	w := &world{model: writeFile(t, filepath.Join(dir, "qwen3-0.6b.gguf"), "sim model weights\n"), slotDir: filepath.Join(dir, "slots")}
	if err := os.Mkdir(w.slotDir, 0o700); err != nil {
		t.Fatal(err)
	}
	w.decoder = startSim(t, w.model, w.slotDir, nil)
	w.prefill = startSim(t, w.model, w.slotDir, editPrefill)
	return w
}

func post(t *testing.T, url string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s: %v: %s", url, err, raw)
	}
	return resp.StatusCode, m
}

func tokenize(t *testing.T, base, text string) []int {
	t.Helper()
	_, m := post(t, base+"/tokenize", map[string]any{"content": text, "add_special": true, "parse_special": true})
	var toks []int
	for _, v := range m["tokens"].([]any) {
		toks = append(toks, int(v.(float64)))
	}
	return toks
}

func (w *world) config(t *testing.T, toks []int, stem string) Config {
	t.Helper()
	b, _ := json.Marshal(toks)
	return Config{
		PrefillURL: w.prefill.URL,
		TokensPath: writeFile(t, filepath.Join(w.slotDir, stem+".tokens"), string(b)),
		Model:      w.model,
		StatePath:  filepath.Join(w.slotDir, stem+".bin"),
	}
}

const prompt = "The quick brown fox jumps over the lazy dog, and then it writes a long story about the handoff of a KV cache."

func TestFileRouteMatchesPlain(t *testing.T) {
	w := newWorld(t, nil)
	toks := tokenize(t, w.decoder.URL, prompt)
	cfg := w.config(t, toks, "req1")
	cfg.Slot = 1
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.NTokens != len(toks) || res.NSaved != len(toks) || res.PromptN != len(toks) || res.NWritten <= 0 {
		t.Errorf("result %+v for %d tokens", res, len(toks))
	}
	// Plain: a fresh decoder slot evaluates the whole prompt.
	plain := startSim(t, w.model, t.TempDir(), nil)
	_, want := post(t, plain.URL+"/completion", map[string]any{"prompt": toks, "n_predict": 16, "id_slot": 0})

	st, r := post(t, w.decoder.URL+"/slots/0?action=restore", map[string]any{"filename": "req1.bin"})
	if st != 200 || int(r["n_restored"].(float64)) != len(toks) {
		t.Fatalf("restore: %d %v", st, r)
	}
	_, got := post(t, w.decoder.URL+"/completion", map[string]any{"prompt": toks, "n_predict": 16, "id_slot": 0, "cache_prompt": true})
	if pn := got["timings"].(map[string]any)["prompt_n"].(float64); pn != 1 {
		t.Errorf("prompt_n %v after restore, want 1", pn)
	}
	if got["content"] != want["content"] || got["content"] == "" {
		t.Errorf("text after restore %q, plain %q", got["content"], want["content"])
	}
	// Again, with a prompt that extends the first: the prefill server reuses
	// its own cache for the common prefix.
	toks2 := tokenize(t, w.decoder.URL, prompt+" And a second paragraph.")
	cfg2 := w.config(t, toks2, "req2")
	cfg2.Slot = 1
	res2, err := Run(context.Background(), cfg2)
	if err != nil {
		t.Fatal(err)
	}
	if res2.PromptN >= len(toks2) {
		t.Errorf("second run evaluated %d of %d tokens: no prefix reuse on the prefill server", res2.PromptN, len(toks2))
	}
}

func TestStaleStateReplaced(t *testing.T) {
	w := newWorld(t, nil)
	toks := tokenize(t, w.decoder.URL, prompt)
	cfg := w.config(t, toks, "stale")
	writeFile(t, cfg.StatePath, "an old state file of another request")
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(cfg.StatePath)
	if err != nil || fi.Size() != res.NWritten {
		t.Errorf("state %v %v, want %d bytes", fi, err, res.NWritten)
	}
}

func TestRunFails(t *testing.T) {
	tests := []struct {
		name     string
		prefill  func(*testing.T, *decodersim.Config) // prefill server settings
		edit     func(*testing.T, *Config, *world)    // the run's config
		want     error
		exit     int
		says     []string
		noExists bool // the state file must not exist afterwards
	}{
		{
			name:    "other model",
			prefill: func(t *testing.T, c *decodersim.Config) { c.ModelPath = writeFile(t, c.ModelPath+".other.gguf", "x") },
			want:    ErrModelMismatch, exit: 2,
			says: []string{"qwen3-0.6b.gguf", "other.gguf"},
		},
		{
			name:    "different slot save path",
			prefill: func(_ *testing.T, c *decodersim.Config) { c.SlotSavePath = os.TempDir() },
			edit: func(t *testing.T, c *Config, _ *world) {
				c.StatePath = filepath.Join(filepath.Dir(c.StatePath), "prefill-test-"+filepath.Base(t.TempDir())+".bin")
				t.Cleanup(func() { os.Remove(filepath.Join(os.TempDir(), filepath.Base(c.StatePath))) })
			},
			want: ErrIncomplete, exit: 1,
			says:     []string{"does not exist", "--slot-save-path"},
			noExists: true,
		},
		{
			name:    "no slot save path",
			prefill: func(_ *testing.T, c *decodersim.Config) { c.SlotSavePath = "" },
			want:    ErrServer, exit: 1,
			says:     []string{"prefill server answered save with 501 not_supported_error", "--slot-save-path"},
			noExists: true,
		},
		{
			name: "slot past the end",
			edit: func(_ *testing.T, c *Config, _ *world) { c.Slot = 2 },
			want: ErrUsage, exit: 2,
			says: []string{"--slot 2", "2 slots"},
		},
		{
			name: "prompt larger than the context",
			edit: func(t *testing.T, c *Config, _ *world) {
				big := make([]int, 600)
				for i := range big {
					big[i] = 1 + i%50
				}
				b, _ := json.Marshal(big)
				writeFile(t, c.TokensPath, string(b))
			},
			want: ErrServer, exit: 1,
			says: []string{"prefill server answered completion with 400 exceed_context_size_error"},
		},
		{
			name: "server down",
			edit: func(_ *testing.T, c *Config, _ *world) { c.PrefillURL = "http://127.0.0.1:1" },
			want: ErrServer, exit: 1,
			says: []string{"props", "refused"},
		},
		{
			name: "state name llama-server refuses",
			edit: func(_ *testing.T, c *Config, _ *world) {
				c.StatePath = filepath.Join(filepath.Dir(c.StatePath), "bad..bin")
			},
			want: ErrUsage, exit: 2,
		},
		{
			name: "state dir missing",
			edit: func(_ *testing.T, c *Config, _ *world) { c.StatePath = "/nonexistent/dir/x.bin" },
			want: ErrUsage, exit: 2,
		},
		{
			name: "no model flag",
			edit: func(_ *testing.T, c *Config, _ *world) { c.Model = "" },
			want: ErrUsage, exit: 2,
		},
		{
			name: "bad url",
			edit: func(_ *testing.T, c *Config, _ *world) { c.PrefillURL = "127.0.0.1:8080" },
			want: ErrUsage, exit: 2,
		},
		{
			name: "tokens file missing",
			edit: func(_ *testing.T, c *Config, _ *world) { c.TokensPath += ".missing" },
			want: ErrTokens, exit: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t, tt.prefill)
			cfg := w.config(t, []int{1, 20, 30, 40}, "req")
			if tt.edit != nil {
				tt.edit(t, &cfg, w)
			}
			_, err := Run(context.Background(), cfg)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
			if got := ExitCode(err); got != tt.exit {
				t.Errorf("exit %d, want %d", got, tt.exit)
			}
			for _, s := range tt.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error lacks %q: %v", s, err)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
			if tt.noExists {
				if _, err := os.Stat(cfg.StatePath); err == nil {
					t.Errorf("%s exists after a failed run", cfg.StatePath)
				}
			}
		})
	}
}

func TestTimeout(t *testing.T) {
	hang := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer ts.Close()
	defer close(hang)
	dir := t.TempDir()
	cfg := Config{
		PrefillURL: ts.URL,
		Timeout:    200 * time.Millisecond,
		TokensPath: writeFile(t, filepath.Join(dir, "a.tokens"), "[1,2,3]"),
		Model:      "m.gguf",
		StatePath:  filepath.Join(dir, "a.bin"),
	}
	t0 := time.Now()
	_, err := Run(context.Background(), cfg)
	if !errors.Is(err, ErrServer) || !strings.Contains(err.Error(), "in time") {
		t.Fatalf("err %v", err)
	}
	if el := time.Since(t0); el > 5*time.Second {
		t.Errorf("took %s", el)
	}
}

func TestLyingSave(t *testing.T) {
	// A server whose save claims more bytes than it wrote.
	dir := t.TempDir()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/props":
			_, _ = io.WriteString(w, `{"model_path":"/models/m.gguf","total_slots":1}`)
		case "/completion":
			_, _ = io.WriteString(w, `{"content":"","timings":{"prompt_n":3}}`)
		default:
			_ = os.WriteFile(filepath.Join(dir, "a.bin"), []byte("short"), 0o600)
			_, _ = io.WriteString(w, `{"id_slot":0,"filename":"a.bin","n_saved":3,"n_written":4096}`)
		}
	}))
	defer ts.Close()
	cfg := Config{
		PrefillURL: ts.URL,
		TokensPath: writeFile(t, filepath.Join(dir, "a.tokens"), "[1,2,3]"),
		Model:      "/elsewhere/m.gguf",
		StatePath:  filepath.Join(dir, "a.bin"),
	}
	_, err := Run(context.Background(), cfg)
	if !errors.Is(err, ErrIncomplete) || !strings.Contains(err.Error(), "has 5 bytes") {
		t.Fatalf("err %v", err)
	}
}

func TestParseTokens(t *testing.T) {
	tests := []struct {
		in   string
		want []int
		ok   bool
	}{
		{"[1,2,3]", []int{1, 2, 3}, true},
		{" [0] \n", []int{0}, true},
		{"[2147483647]", []int{2147483647}, true},
		{"[]", nil, false},
		{"", nil, false},
		{"null", nil, false},
		{"[1,-2]", nil, false},
		{"[1.5]", nil, false},
		{"[1e3]", nil, false},
		{"[2147483648]", nil, false},
		{`["1"]`, nil, false},
		{"[1] [2]", nil, false},
		{"{}", nil, false},
		{"[1,2", nil, false},
	}
	for _, tt := range tests {
		got, err := ParseTokens([]byte(tt.in))
		if (err == nil) != tt.ok {
			t.Errorf("ParseTokens(%q) err %v, want ok=%v", tt.in, err, tt.ok)
			continue
		}
		if err != nil && !errors.Is(err, ErrTokens) {
			t.Errorf("ParseTokens(%q) err %v does not wrap ErrTokens", tt.in, err)
		}
		if tt.ok && !equal(got, tt.want) {
			t.Errorf("ParseTokens(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{"[1,2,3]", "[]", "[-1]", "[1.0]", "[9999999999]", `["a"]`, "[1]x", " [ 0 , 7 ] "} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		toks, err := ParseTokens(b)
		if err != nil {
			if !errors.Is(err, ErrTokens) {
				t.Fatalf("error %v does not wrap ErrTokens", err)
			}
			return
		}
		if len(toks) == 0 {
			t.Fatal("no tokens without an error")
		}
		for _, v := range toks {
			if v < 0 || v > 1<<31-1 {
				t.Fatalf("token %d out of range", v)
			}
		}
		// Round trip.
		out, _ := json.Marshal(toks)
		again, err := ParseTokens(out)
		if err != nil || !equal(again, toks) {
			t.Fatalf("round trip %s: %v %v", out, again, err)
		}
	})
}

// TestConcurrentRuns: onebitd runs providers concurrently; every state file
// must hold its own prompt, on one prefill slot or spread over several.
func TestConcurrentRuns(t *testing.T) {
	for _, slots := range []int{0, 2} {
		t.Run(fmt.Sprintf("slots=%d", slots), func(t *testing.T) {
			w := newWorld(t, nil)
			const n = 8
			cfgs := make([]Config, n)
			toks := make([][]int, n)
			for i := range n {
				toks[i] = tokenize(t, w.decoder.URL, fmt.Sprintf("request %d: %s", i, strings.Repeat("word ", i+3)))
				cfgs[i] = w.config(t, toks[i], fmt.Sprintf("c%d", i))
				cfgs[i].Slots = slots
			}
			errs := make(chan error, n)
			used := make(chan int, n)
			for i := range n {
				go func() {
					res, err := Run(context.Background(), cfgs[i])
					used <- res.Slot
					errs <- err
				}()
			}
			seen := map[int]bool{}
			for range n {
				if err := <-errs; err != nil {
					t.Error(err)
				}
				seen[<-used] = true
			}
			if slots == 2 && len(seen) > 2 {
				t.Errorf("slots used %v", seen)
			}
			for i := range n {
				st, r := post(t, w.decoder.URL+"/slots/0?action=restore", map[string]any{"filename": fmt.Sprintf("c%d.bin", i)})
				if st != 200 || int(r["n_restored"].(float64)) != len(toks[i]) {
					t.Fatalf("restore c%d: %d %v", i, st, r)
				}
				_, got := post(t, w.decoder.URL+"/completion", map[string]any{"prompt": toks[i], "n_predict": 1, "id_slot": 0})
				if pn := got["timings"].(map[string]any)["prompt_n"].(float64); pn != 1 {
					t.Errorf("c%d: prompt_n %v after restore: the state holds another prompt", i, pn)
				}
			}
		})
	}
}

func TestLockSlotCancelled(t *testing.T) {
	dir := t.TempDir()
	_, l, err := lockSlot(context.Background(), dir, "http://x", []int{0})
	if err != nil {
		t.Fatal(err)
	}
	defer l.unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := lockSlot(ctx, dir, "http://x", []int{0}); !errors.Is(err, ErrServer) {
		t.Fatalf("err %v", err)
	}
	// Another server's slot 0 is a different lock.
	_, l2, err := lockSlot(context.Background(), dir, "http://y", []int{0})
	if err != nil {
		t.Fatal(err)
	}
	l2.unlock()
}

// BenchmarkRun: one onebit-prefill run (props, completion, save, check)
// against an in-process simulator, for a prompt of about 200 tokens.
func BenchmarkRun(b *testing.B) {
	dir := b.TempDir()
	model := filepath.Join(dir, "m.gguf")
	if err := os.WriteFile(model, []byte("bench"), 0o600); err != nil {
		b.Fatal(err)
	}
	c := decodersim.DefaultConfig()
	c.ModelPath, c.NCtx, c.SlotSavePath = model, 1024, dir
	srv, err := decodersim.New(c, nil)
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer func() { ts.Close(); srv.Close() }()
	toks := make([]int, 200)
	for i := range toks {
		toks[i] = 1 + i%50
	}
	raw, _ := json.Marshal(toks)
	tp := filepath.Join(dir, "b.tokens")
	if err := os.WriteFile(tp, raw, 0o600); err != nil {
		b.Fatal(err)
	}
	cfg := Config{PrefillURL: ts.URL, TokensPath: tp, Model: model, StatePath: filepath.Join(dir, "b.bin")}
	for b.Loop() {
		// A fresh slot each time: erase, so the whole prompt is evaluated.
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/slots/0?action=erase", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if _, err := Run(context.Background(), cfg); err != nil {
			b.Fatal(err)
		}
	}
}
