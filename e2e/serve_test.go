package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestConcurrentSlots: --slots 4 (decoder -np 4) and 16 concurrent mixed
// requests on the shared route: every answer is its own prompt's answer.
func TestConcurrentSlots(t *testing.T) {
	plain := newEnv(t, envOpts{simArgs: []string{"-np", "4"}, onebitArgs: []string{"--slots", "4"}})
	shared := newEnv(t, envOpts{provider: true, share: true, simArgs: []string{"-np", "4"}, onebitArgs: []string{"--slots", "4"}})
	base, _ := fdSnapshot(t, shared.onebit.PID())
	type job struct {
		ep     entry
		stream bool
		text   string
	}
	var jobs []job
	for i := range 16 {
		jobs = append(jobs, job{entries[i%3], i%2 == 0, prompt(uint64(100+i), 200+i*60)})
	}
	want := make([]string, len(jobs))
	for i, j := range jobs {
		want[i] = complete(t, plain.onebitURL, j.ep, j.stream, j.text, nPredict).text
	}
	got := make([]result, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = complete(t, shared.onebitURL, j.ep, j.stream, j.text, nPredict)
		}()
	}
	wg.Wait()
	for i := range jobs {
		if got[i].status != 200 || got[i].text != want[i] {
			t.Fatalf("job %d (%s): status %d route %s text %q, want %q", i, jobs[i].ep, got[i].status, got[i].route, got[i].text, want[i])
		}
		if got[i].route != "shared" || got[i].promptN != 1 {
			t.Fatalf("job %d: route %s prompt_n %d", i, got[i].route, got[i].promptN)
		}
	}
	assertClean(t, shared, base)
}

// TestBadInput: invalid JSON → 400, oversized body → 413, both in
// llama-server's error shape; onebitd keeps serving.
func TestBadInput(t *testing.T) {
	e := newEnv(t, envOpts{provider: true, share: true, onebitArgs: []string{"--max-body", "4096"}})
	cases := []struct {
		name   string
		path   string
		body   string
		status int
		typ    string
	}{
		{"invalid JSON", "/completion", `{"prompt": "x"`, 400, "invalid_request_error"},
		{"not an object", "/v1/completions", `[1,2,3]`, 400, "invalid_request_error"},
		{"null", "/v1/chat/completions", `null`, 400, "invalid_request_error"},
		{"oversized", "/completion", `{"prompt": "` + strings.Repeat("a", 5000) + `"}`, 413, "invalid_request_error"},
		{"oversized chat", "/v1/chat/completions", strings.Repeat(" ", 5000), 413, "invalid_request_error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(e.onebitURL+tc.path, "application/json", bytes.NewReader([]byte(tc.body)))
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, raw)
			}
			var shape struct {
				Error struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if err := json.Unmarshal(raw, &shape); err != nil || shape.Error.Code != tc.status || shape.Error.Type != tc.typ || shape.Error.Message == "" {
				t.Fatalf("not llama-server's error shape: %s", raw)
			}
		})
	}
	// Still serving, and other paths are proxied verbatim.
	if r := complete(t, e.onebitURL, epCompletion, false, prompt(5, 40), 4); r.status != 200 || r.route != "shared" {
		t.Fatalf("after bad input: %d %s %s", r.status, r.route, r.body)
	}
	for _, p := range []string{"/health", "/props", "/v1/models", "/slots"} {
		a := get(t, e.onebitURL+p)
		b := get(t, e.simURL+p)
		if a.status != b.status || (p != "/slots" && a.body != b.body) {
			t.Fatalf("%s: proxied %d %q, direct %d %q", p, a.status, a.body, b.status, b.body)
		}
	}
}

func get(t *testing.T, url string) result {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, body: string(raw)}
}
