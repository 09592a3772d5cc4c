package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"github.com/onebitd/onebitd/internal/obtest"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestConcurrentSlots: --slots 4 (decoder -np 4) and 16 concurrent mixed
// requests on the shared route: every answer is its own prompt's answer.
func TestConcurrentSlots(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
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
	t.Parallel() // own processes, ports and temp dirs
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
	for _, p := range []string{"/props", "/v1/models"} {
		a := get(t, e.onebitURL+p)
		b := get(t, e.simURL+p)
		if a.status != b.status || a.body != b.body {
			t.Fatalf("%s: proxied %d %q, direct %d %q", p, a.status, a.body, b.status, b.body)
		}
	}
	// /health: the decoder's answer plus onebitd's details.
	var h struct {
		Status  string `json:"status"`
		Onebitd struct {
			Route    string `json:"route"`
			InFlight *int   `json:"in_flight"`
		} `json:"onebitd"`
	}
	if a := get(t, e.onebitURL+"/health"); a.status != 200 || json.Unmarshal([]byte(a.body), &h) != nil ||
		h.Status != "ok" || h.Onebitd.Route != "shared" || h.Onebitd.InFlight == nil {
		t.Fatalf("/health: %d %q", a.status, a.body)
	}
	// The control plane is onebitd's: /slots is refused.
	if a := get(t, e.onebitURL+"/slots"); a.status != 403 || !strings.Contains(a.body, "permission_error") {
		t.Fatalf("/slots through onebitd: %d %q, want 403 permission_error", a.status, a.body)
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

// streamOne starts a long streaming completion and returns the response
// after its first event arrived.
func streamOne(t *testing.T, base, text string, maxTokens int) (*http.Response, *bufio.Reader) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": text, "n_predict": maxTokens, "stream": true})
	resp, err := http.Post(base+"/completion", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event: %q %v", line, err)
	}
	return resp, br
}

// TestClientGoneFreesSlot: a client that disconnects mid-stream cancels the
// decoder's work and frees its slot; its request ends as failed with a
// reason in the event log.
func TestClientGoneFreesSlot(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	e := newEnv(t, envOpts{provider: true, share: true, simArgs: []string{"--token-delay", "20ms"}, onebitArgs: []string{"--slots", "1"}})
	resp, _ := streamOne(t, e.onebitURL, prompt(41, 200), 100000)
	id := resp.Header.Get("X-Onebit-Request-Id")
	resp.Body.Close()
	// With one slot, this only runs once the first request let go of it.
	if r := complete(t, e.onebitURL, epCompletion, false, prompt(42, 200), 4); r.status != 200 || r.route != "shared" {
		t.Fatalf("second request: %d %s %s", r.status, r.route, r.body)
	}
	evs := requestEvents(t, e, id)
	if len(evs) == 0 || evs[len(evs)-1].To != "failed" || !strings.Contains(evs[len(evs)-1].Reason, "client went away") {
		t.Fatalf("first request's events end with %+v", evs[len(evs)-1])
	}
}

// TestDrainOnSIGTERM: SIGTERM lets an in-flight stream finish, then onebitd
// exits 0 and refuses new connections.
func TestDrainOnSIGTERM(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	e := newEnv(t, envOpts{provider: true, share: true, simArgs: []string{"--token-delay", "10ms"}})
	resp, br := streamOne(t, e.onebitURL, prompt(43, 200), 40)
	defer resp.Body.Close()
	e.onebit.cmd.Process.Signal(syscall.SIGTERM)
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("stream cut by SIGTERM: %v", err)
	}
	if !strings.Contains(string(rest), `"stop":true`) {
		t.Fatalf("stream did not finish: %q", tail(string(rest)))
	}
	<-e.onebit.done
	if code := e.onebit.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d\n%s", code, tail(e.onebit.Logs()))
	}
	if !strings.Contains(e.onebit.Logs(), "onebitd stopped cleanly") {
		t.Fatalf("no clean stop in the log:\n%s", tail(e.onebit.Logs()))
	}
}

// TestSIGTERMWithHungProvider (issue 10): SIGTERM while a provider hangs
// (its limit, 60 s by default, beyond the drain's): onebitd cuts the
// handoff short before the drain limit, the client gets the plain answer,
// onebitd exits 0 within the limit, and nothing is left in the slot dir
// or as a process.
func TestSIGTERMWithHungProvider(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	plain := newEnv(t, envOpts{})
	text := prompt(45, 300)
	want := complete(t, plain.onebitURL, epCompletion, false, text, 8)
	e := newEnv(t, envOpts{provider: true, share: true,
		onebitArgs: []string{"--provider-arg=--hang", "--provider-timeout", "60s", "--drain-timeout", "8s"}})
	got := make(chan result, 1)
	go func() { got <- complete(t, e.onebitURL, epCompletion, false, text, 8) }()
	var prov int
	obtest.WaitFor(t, 20*time.Second, "the provider to run", func() bool {
		kids := children(e.onebit.PID())
		if len(kids) == 1 {
			prov = kids[0]
		}
		return prov != 0
	})
	start := time.Now()
	e.onebit.cmd.Process.Signal(syscall.SIGTERM)
	r := <-got
	if r.status != 200 || r.route != "fallback" || r.text != want.text {
		t.Fatalf("answer during the drain: %d %s %q, want the plain text %q", r.status, r.route, r.text, want.text)
	}
	<-e.onebit.done
	took := time.Since(start)
	if code := e.onebit.cmd.ProcessState.ExitCode(); code != 0 || took > 8*time.Second {
		t.Fatalf("exit %d after %s (drain limit 8s)\n%s", code, took, tail(e.onebit.Logs()))
	}
	if !obtest.Gone(prov) {
		t.Fatalf("the hung provider %d outlived onebitd", prov)
	}
	if left, _ := dirEntries(e.slotDir); len(left) != 0 {
		t.Fatalf("left in the slot dir: %v", left)
	}
	if !strings.Contains(e.onebit.Logs(), "shutting down") {
		t.Fatalf("the fallback does not say onebitd was shutting down:\n%s", tail(e.onebit.Logs()))
	}
}

// TestKill9WithHungProviders (issue 10): kill -9 of onebitd while its
// providers hang holding the decoder's KV memfds: no provider survives and
// no process but the decoder holds a memfd of the decoder's.
func TestKill9WithHungProviders(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	e := newEnv(t, envOpts{provider: true, share: true, simArgs: []string{"-np", "2"},
		onebitArgs: []string{"--slots", "2", "--provider-arg=--hang", "--provider-timeout", "60s"}})
	for i := range 2 {
		go httpPost(e.onebitURL+"/completion", `{"prompt": `+strconv.Quote(prompt(uint64(90+i), 300))+`, "n_predict": 4}`)
	}
	var provs []int
	obtest.WaitFor(t, 20*time.Second, "two hung providers holding regions", func() bool {
		provs = children(e.onebit.PID())
		return len(provs) == 2
	})
	for _, p := range provs {
		if _, mem := fdSnapshot(t, p); len(mem) == 0 {
			t.Fatalf("provider %d holds no memfd: the test would prove nothing", p)
		}
	}
	syscall.Kill(e.onebit.PID(), syscall.SIGKILL)
	<-e.onebit.done
	for _, p := range provs {
		obtest.WaitFor(t, 10*time.Second, "the providers to die with onebitd", func() bool { return obtest.Gone(p) })
	}
}
