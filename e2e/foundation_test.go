package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/fdpass"
)

// simProc is a decoder simulator binary driven by hand (no onebitd).
type simProc struct {
	url, slotDir, model string
}

func startSim(t *testing.T, model string, args ...string) simProc {
	t.Helper()
	s := simProc{slotDir: t.TempDir(), model: model}
	all := append([]string{"--port", "0", "-m", model, "-c", "20480", "--slot-save-path", s.slotDir}, args...)
	_, s.url = start(t, bins.sim, reSim, all...)
	return s
}

// call POSTs body to the simulator and decodes the answer into out.
func (s simProc) call(t *testing.T, path string, body any, out any) int {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(s.url+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: %v: %s", path, err, raw)
		}
	}
	return resp.StatusCode
}

type llamaErr struct {
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Type    string `json:"type"`
	} `json:"error"`
}

type completion struct {
	Content string `json:"content"`
	Timings struct {
		PromptN int `json:"prompt_n"`
		CacheN  int `json:"cache_n"`
	} `json:"timings"`
}

func (s simProc) complete(t *testing.T, prompt string) completion {
	t.Helper()
	var c completion
	if code := s.call(t, "/completion", map[string]any{"prompt": prompt, "n_predict": nPredict, "id_slot": 0}, &c); code != 200 {
		t.Fatalf("completion: %d", code)
	}
	return c
}

func (s simProc) tokenize(t *testing.T, prompt string) []int {
	t.Helper()
	var out struct{ Tokens []int }
	s.call(t, "/tokenize", map[string]any{"content": prompt, "add_special": true}, &out)
	return out.Tokens
}

// share runs ?action=share on slot 0 against a fresh socket and returns the
// share_id and the received message (the caller closes it).
func (s simProc) share(t *testing.T, dir string) (int64, *fdpass.Message) {
	t.Helper()
	l, err := fdpass.Listen(dir, fmt.Sprintf("s%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan *fdpass.Message, 1)
	go func() {
		c, err := l.Accept(time.Now().Add(10 * time.Second))
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		m, err := c.Receive(time.Now().Add(10*time.Second), 64)
		if err != nil {
			t.Error(err)
		}
		got <- m
	}()
	var rep struct {
		ShareID int64 `json:"share_id"`
	}
	if code := s.call(t, "/slots/0?action=share", map[string]string{"socket": l.Path()}, &rep); code != 200 {
		t.Fatalf("share: %d", code)
	}
	m := <-got
	if m == nil {
		t.Fatal("no share message")
	}
	return rep.ShareID, m
}

// runProvider runs the sim provider binary with args, region fds inherited
// at 3, 4, …; it returns the exit code and stderr.
func runProvider(t *testing.T, files []*os.File, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bins.prov, args...)
	cmd.ExtraFiles = files
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), stderr.String()
		}
		t.Fatal(err)
	}
	return 0, stderr.String()
}

func writeTokens(t *testing.T, path string, toks []int) {
	t.Helper()
	b, _ := json.Marshal(toks)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func fdList(n int) string {
	var fds []string
	for i := range n {
		fds = append(fds, fmt.Sprint(3+i))
	}
	return strings.Join(fds, ",")
}

// TestFoundationByHand drives both routes by hand against the simulator and
// provider binaries (no onebitd): listen, share, receive, provider, adopt —
// or provider state file, restore — then the same prompt on /completion
// gives the text of a plain /completion on a fresh simulator, with
// prompt_n == 1. Prompts of about 250, 3 200 and 12 700 tokens.
func TestFoundationByHand(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	prompts := gatePrompts
	if testing.Short() {
		prompts = gatePrompts[:1]
	}
	model := modelFile(t, "a")
	for _, p := range prompts {
		text := prompt(p.seed, p.tokens)
		t.Run(p.name, func(t *testing.T) {
			want := startSim(t, model).complete(t, text)
			work := t.TempDir()

			// Shared route.
			s := startSim(t, model)
			toks := s.tokenize(t, text)
			id, msg := s.share(t, work)
			defer msg.Close()
			tokPath, layout := filepath.Join(work, "p.tokens"), filepath.Join(work, "p.json")
			writeTokens(t, tokPath, toks)
			os.WriteFile(layout, msg.Raw, 0o600)
			if code, stderr := runProvider(t, msg.Files, "--tokens", tokPath, "--model", model, "--layout", layout, "--fds", fdList(len(msg.Files))); code != 0 {
				t.Fatalf("provider: %d %s", code, stderr)
			}
			msg.Close()
			if code := s.call(t, "/slots/0?action=adopt", map[string]any{"tokens": toks, "share_id": id}, nil); code != 200 {
				t.Fatalf("adopt: %d", code)
			}
			got := s.complete(t, text)
			if got.Content != want.Content || got.Timings.PromptN != 1 || got.Timings.CacheN != len(toks)-1 {
				t.Fatalf("shared: %q prompt_n %d cache_n %d, want %q prompt_n 1", got.Content, got.Timings.PromptN, got.Timings.CacheN, want.Content)
			}

			// File route.
			f := startSim(t, model)
			writeTokens(t, tokPath, toks)
			if code, stderr := runProvider(t, nil, "--tokens", tokPath, "--model", model, "--state", filepath.Join(f.slotDir, "p.bin")); code != 0 {
				t.Fatalf("provider: %d %s", code, stderr)
			}
			if code := f.call(t, "/slots/0?action=restore", map[string]string{"filename": "p.bin"}, nil); code != 200 {
				t.Fatalf("restore: %d", code)
			}
			got = f.complete(t, text)
			if got.Content != want.Content || got.Timings.PromptN != 1 {
				t.Fatalf("file: %q prompt_n %d, want %q prompt_n 1", got.Content, got.Timings.PromptN, want.Content)
			}
		})
	}
}

// TestFoundationRefusals: share_id rules and the recurrent 501 in
// llama-server's error shape, against the binary; and a provider with
// another model refuses, leaves the cells unadopted, and the next request
// on the slot is unaffected.
func TestFoundationRefusals(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	model := modelFile(t, "a")
	s := startSim(t, model)
	work := t.TempDir()
	text := prompt(81, 250)
	toks := s.tokenize(t, text)
	adopt := func(body map[string]any) (int, llamaErr) {
		var e llamaErr
		code := s.call(t, "/slots/0?action=adopt", body, &e)
		return code, e
	}

	old, m1 := s.share(t, work)
	m1.Close()
	newer, m2 := s.share(t, work)
	m2.Close()
	cases := []struct {
		name string
		body map[string]any
	}{
		{"older share's id", map[string]any{"tokens": toks, "share_id": old}},
		{"no share_id", map[string]any{"tokens": toks}},
	}
	for _, c := range cases {
		if code, e := adopt(c.body); code != 400 || e.Error.Type != "invalid_request_error" || e.Error.Code != 400 || e.Error.Message == "" {
			t.Fatalf("%s: %d %+v", c.name, code, e)
		}
	}
	// The newest id is accepted once, then refused.
	if code, e := adopt(map[string]any{"tokens": toks[:2], "share_id": newer}); code != 200 {
		t.Fatalf("newest share_id: %d %+v", code, e)
	}
	if code, e := adopt(map[string]any{"tokens": toks[:2], "share_id": newer}); code != 400 || e.Error.Type != "invalid_request_error" {
		t.Fatalf("reused share_id: %d %+v", code, e)
	}

	// A provider loaded with another model refuses before writing; its
	// share is never adopted.
	_, msg := s.share(t, work)
	defer msg.Close()
	tokPath, layout := filepath.Join(work, "r.tokens"), filepath.Join(work, "r.json")
	writeTokens(t, tokPath, toks)
	os.WriteFile(layout, msg.Raw, 0o600)
	code, stderr := runProvider(t, msg.Files, "--tokens", tokPath, "--model", modelFile(t, "b"), "--layout", layout, "--fds", fdList(len(msg.Files)))
	if code != 2 || !strings.Contains(stderr, "layout hash mismatch") {
		t.Fatalf("provider with another model: exit %d %q", code, stderr)
	}
	want := startSim(t, model).complete(t, text)
	got := s.complete(t, text)
	if got.Content != want.Content || got.Timings.PromptN != len(toks) {
		t.Fatalf("after the refusal: %q prompt_n %d, want %q evaluated in full (%d)", got.Content, got.Timings.PromptN, want.Content, len(toks))
	}

	rec := startSim(t, model, "--recurrent")
	var e llamaErr
	if code := rec.call(t, "/slots/0?action=share", map[string]string{"socket": filepath.Join(work, "x.sock")}, &e); code != 501 || e.Error.Type != "not_supported_error" || !strings.Contains(e.Error.Message, "no shareable region") {
		t.Fatalf("recurrent: %d %+v", code, e)
	}
}
