package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onebitd/onebitd/launcher"
)

// Binaries built by TestMain.
var simBin, prefillBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "onebit-prefill-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	simBin, prefillBin = filepath.Join(dir, "onebit-decoder-sim"), filepath.Join(dir, "onebit-prefill")
	for bin, pkg := range map[string]string{simBin: "../onebit-decoder-sim", prefillBin: "."} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// sim starts a simulator process (through the launcher) with its
// --slot-save-path on slotDir.
func sim(t *testing.T, model, slotDir string) string {
	t.Helper()
	d, err := launcher.Start(context.Background(), launcher.Config{
		Bin: simBin, Model: model, SlotDir: slotDir, Slots: 1, Args: []string{"-c", "1024"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop() })
	return d.URL()
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

// setup writes a model and a tokens file for prompt into a shared slot dir
// and starts the decoder and the prefill server on it.
func setup(t *testing.T, prompt string) (model, slotDir, decoderURL, prefillURL, tokensPath string, toks []any) {
	t.Helper()
	dir := t.TempDir()
	model = filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(model, []byte("sim weights for onebit-prefill"), 0o600); err != nil {
		t.Fatal(err)
	}
	slotDir = filepath.Join(dir, "slots")
	if err := os.Mkdir(slotDir, 0o700); err != nil {
		t.Fatal(err)
	}
	decoderURL = sim(t, model, slotDir)
	prefillURL = sim(t, model, slotDir)
	_, tk := post(t, decoderURL+"/tokenize", map[string]any{"content": prompt, "add_special": true, "parse_special": true})
	toks = tk["tokens"].([]any)
	b, _ := json.Marshal(toks)
	tokensPath = filepath.Join(slotDir, "req.tokens")
	if err := os.WriteFile(tokensPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return
}

func runPrefill(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(prefillBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
	return code, lines[len(lines)-1]
}

// TestTwoSimulators is the acceptance test: the file route through
// onebit-prefill gives the plain route's text with prompt_n == 1.
func TestTwoSimulators(t *testing.T) {
	const prompt = "Disaggregated prefill on two llama-servers over a shared directory."
	model, slotDir, decoderURL, prefillURL, tokens, toks := setup(t, prompt)
	state := filepath.Join(slotDir, "req.bin")
	code, last := runPrefill(t, "--prefill-url", prefillURL, "--slot", "0", "--tokens", tokens, "--model", model, "--state", state)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, last)
	}
	if !strings.Contains(last, fmt.Sprintf("saved %d tokens", len(toks))) {
		t.Errorf("last line %q", last)
	}
	st, r := post(t, decoderURL+"/slots/0?action=restore", map[string]any{"filename": "req.bin"})
	if st != 200 {
		t.Fatalf("restore %d %v", st, r)
	}
	_, got := post(t, decoderURL+"/completion", map[string]any{"prompt": toks, "n_predict": 24, "id_slot": 0, "cache_prompt": true})
	plainURL := sim(t, model, t.TempDir())
	_, want := post(t, plainURL+"/completion", map[string]any{"prompt": toks, "n_predict": 24})
	if pn := got["timings"].(map[string]any)["prompt_n"]; pn != 1.0 {
		t.Errorf("prompt_n %v, want 1", pn)
	}
	if got["content"] != want["content"] || got["content"] == "" {
		t.Errorf("file route text %q, plain %q", got["content"], want["content"])
	}
}

func TestExitStatus(t *testing.T) {
	model, slotDir, _, prefillURL, tokens, _ := setup(t, "exit codes")
	other := filepath.Join(t.TempDir(), "other.gguf")
	tests := []struct {
		name string
		args []string
		code int
		says string
	}{
		{"model mismatch", []string{"--prefill-url", prefillURL, "--tokens", tokens, "--model", other, "--state", filepath.Join(slotDir, "a.bin")}, 2, "runs model.gguf, --model is other.gguf"},
		{"missing flag", []string{"--prefill-url", prefillURL, "--tokens", tokens, "--state", filepath.Join(slotDir, "a.bin")}, 2, "--model is required"},
		{"stray argument", []string{"extra"}, 2, `unexpected argument "extra"`},
		{"wrong directory", []string{"--prefill-url", prefillURL, "--tokens", tokens, "--model", model, "--state", filepath.Join(t.TempDir(), "a.bin")}, 1, "--slot-save-path"},
		{"bad slot", []string{"--prefill-url", prefillURL, "--slot", "3", "--tokens", tokens, "--model", model, "--state", filepath.Join(slotDir, "a.bin")}, 2, "--slot 3 but the prefill server has 1 slots"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, last := runPrefill(t, tt.args...)
			if code != tt.code || !strings.Contains(last, tt.says) {
				t.Errorf("exit %d, last line %q; want %d and %q", code, last, tt.code, tt.says)
			}
		})
	}
}
