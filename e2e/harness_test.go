// Package e2e runs onebitd, the decoder simulator and the sim provider as
// real processes and checks the product's promises end to end.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/internal/tailbuf"
)

// bins are built once per test binary.
var bins struct {
	onebitd, sim, prov, prefill string
}

func TestMain(m *testing.M) {
	if os.Getenv("GO_WANT_HELPER_PROCESS") == "1" {
		os.Exit(helperProcess())
	}
	dir, err := os.MkdirTemp("", "onebit-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins.onebitd = filepath.Join(dir, "onebitd")
	bins.sim = filepath.Join(dir, "onebit-decoder-sim")
	bins.prov = filepath.Join(dir, "onebit-provider-sim")
	bins.prefill = filepath.Join(dir, "onebit-prefill")
	// One go build for the four binaries: they share the compiled
	// packages, and the build runs them in parallel.
	cmd := exec.Command("go", "build", "-race", "-o", dir+"/", "./cmd/onebitd", "./cmd/onebit-decoder-sim",
		"./cmd/onebit-provider-sim", "./cmd/onebit-prefill")
	cmd.Dir = ".."
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build the e2e binaries: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running child whose stderr we keep.
type proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{}
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.Write(b)
}

func (p *proc) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

func (p *proc) PID() int { return p.cmd.Process.Pid }

// start runs bin with args; the process is stopped (TERM, then KILL) at
// the end of the test. waitLine returns the first submatch of re in stderr.
func start(t *testing.T, bin string, re *regexp.Regexp, args ...string) (*proc, string) {
	t.Helper()
	return startEnv(t, nil, bin, re, args...)
}

func startEnv(t *testing.T, env []string, bin string, re *regexp.Regexp, args ...string) (*proc, string) {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	// Every stderr line is kept (tests read the whole log) and matched
	// against re until it matches.
	found := make(chan string, 1)
	sent := false
	stderr := tailbuf.New(tailbuf.Options{MaxLines: 1, MaxBytes: 1 << 20, MaxLine: 1 << 20, OnLine: func(line string) {
		p.Write([]byte(line + "\n"))
		if !sent {
			if m := re.FindStringSubmatch(line); m != nil {
				found <- m[1]
				sent = true
			}
		}
	}})
	p.cmd.Stderr = stderr
	p.cmd.Stdout = p
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); stderr.Flush(); close(p.done) }()
	t.Cleanup(func() { p.stop() })
	select {
	case s := <-found:
		return p, s
	case <-p.done:
		t.Fatalf("%s exited before it was ready:\n%s", filepath.Base(bin), p.Logs())
	case <-time.After(60 * time.Second):
		t.Fatalf("%s not ready in 60s:\n%s", filepath.Base(bin), p.Logs())
	}
	return nil, ""
}

func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

var (
	reSim     = regexp.MustCompile(`listening on (http://\S+)`)
	reOnebitd = regexp.MustCompile(`"msg":"onebitd serving".*"listen":"(http://[^"]+)"`)
)

// env is one decoder simulator and one onebitd in front of it.
type env struct {
	sim, onebit       *proc
	simURL, onebitURL string
	slotDir, model    string
	stateDir          string
}

type envOpts struct {
	simArgs     []string
	onebitArgs  []string
	provider    bool   // configure the sim provider
	share       bool   // --kv-share
	providerBin string // instead of the sim provider
	simModel    string // model file the simulator loads (default: the shared one)
	env         []string
}

// newEnv starts a simulator (-c 20480, one slot unless told) and onebitd.
func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	e := &env{stateDir: t.TempDir()}
	e.slotDir = filepath.Join(e.stateDir, "slots")
	if err := os.MkdirAll(e.slotDir, 0o700); err != nil {
		t.Fatal(err)
	}
	e.model = modelFile(t, "a")
	simModel := e.model
	if o.simModel != "" {
		simModel = o.simModel
	}
	// --compact: layer 0's records only, for speed (the honest full-cell gate
	// is internal/providersim's TestGateHonest).
	simArgs := append([]string{"--port", "0", "-m", simModel, "-c", "20480", "--slot-save-path", e.slotDir, "--compact"}, o.simArgs...)
	e.sim, e.simURL = start(t, bins.sim, reSim, simArgs...)
	args := []string{"serve", "--listen", "127.0.0.1:0", "--decoder-url", e.simURL, "--state-dir", e.stateDir,
		"--slot-dir", e.slotDir, "--model", e.model, "--log-format", "json", "--nats-listen", "off",
		"--node", "e2e", "--provider-timeout", "20s", "--event-log-sync", "always",
		"--handoff", "always"} // these tests are about the routes: every request is handed over
	if o.provider || o.providerBin != "" {
		pb := bins.prov
		if o.providerBin != "" {
			pb = o.providerBin
		}
		args = append(args, "--provider", pb)
		if o.providerBin == "" {
			args = append(args, "--provider-arg=--compact")
		}
	}
	if o.share {
		args = append(args, "--kv-share")
	}
	args = append(args, o.onebitArgs...)
	e.onebit, e.onebitURL = startEnv(t, append(o.env, "E2E_SIM_URL="+e.simURL), bins.onebitd, reOnebitd, args...)
	return e
}

var modelMu sync.Mutex
var models = map[string]string{}

// modelFile is a model stand-in whose bytes depend on name (shared per name).
func modelFile(t *testing.T, name string) string {
	modelMu.Lock()
	defer modelMu.Unlock()
	if p, ok := models[name]; ok {
		return p
	}
	dir, err := os.MkdirTemp("", "onebit-e2e-model")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name+".gguf")
	if err := os.WriteFile(p, []byte("GGUF-SIM model "+name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	models[name] = p
	return p
}

// prompt is a deterministic text of about n tokens in the simulator's
// tokenizer (vocabulary words are one token, other bytes one token each).
func prompt(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, 7))
	vocab := []string{"the", "cache", "of", "decoder", "slot", "token", "prefill", "and", "is", "water"}
	var b strings.Builder
	for tok := 0; tok < n; {
		if r.IntN(3) == 0 {
			w := fmt.Sprintf("%c%c%c", 'k'+r.IntN(10), 'a'+r.IntN(26), 'a'+r.IntN(26))
			b.WriteString(" " + w)
			tok += 4
		} else {
			b.WriteString(" " + vocab[r.IntN(len(vocab))])
			tok++
		}
	}
	return b.String()
}

// result is what one completion gave.
type result struct {
	status  int
	text    string
	promptN int
	cacheN  int
	route   string
	reqID   string
	body    string
}

type entry string

const (
	epCompletion entry = "/completion"
	epV1Compl    entry = "/v1/completions"
	epChat       entry = "/v1/chat/completions"
)

var entries = []entry{epCompletion, epV1Compl, epChat}

// complete sends one greedy completion and collects text and timings, from
// a stream or not.
func complete(t *testing.T, base string, ep entry, stream bool, p string, nPredict int) result {
	t.Helper()
	req := map[string]any{"stream": stream}
	switch ep {
	case epCompletion:
		req["prompt"] = p
		req["n_predict"] = nPredict
	case epV1Compl:
		req["prompt"] = p
		req["max_tokens"] = nPredict
	case epChat:
		req["messages"] = []map[string]string{{"role": "user", "content": p}}
		req["max_tokens"] = nPredict
	}
	body, _ := json.Marshal(req)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+string(ep), bytes.NewReader(body))
	hr.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatalf("%s: %v", ep, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: read: %v", ep, err)
	}
	res := result{status: resp.StatusCode, route: resp.Header.Get("X-Onebit-Route"), reqID: resp.Header.Get("X-Onebit-Request-Id"), body: string(raw)}
	if resp.StatusCode != 200 {
		return res
	}
	var objs []map[string]any
	if stream {
		for _, ev := range strings.Split(string(raw), "\n\n") {
			ev = strings.TrimSpace(ev)
			if !strings.HasPrefix(ev, "data: ") || ev == "data: [DONE]" {
				continue
			}
			var o map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &o); err != nil {
				t.Fatalf("%s: bad SSE event %q: %v", ep, ev, err)
			}
			objs = append(objs, o)
		}
		if (ep != epCompletion) != strings.HasSuffix(string(raw), "data: [DONE]\n\n") {
			t.Fatalf("%s: [DONE] framing wrong: %q", ep, tail(string(raw)))
		}
	} else {
		var o map[string]any
		if err := json.Unmarshal(raw, &o); err != nil {
			t.Fatalf("%s: %v", ep, err)
		}
		objs = append(objs, o)
	}
	for _, o := range objs {
		if _, ok := o["error"]; ok {
			t.Fatalf("%s: error event: %v", ep, o)
		}
		switch ep {
		case epCompletion:
			res.text += str(o["content"])
		case epV1Compl:
			if c := choice(o); c != nil {
				res.text += str(c["text"])
			}
		case epChat:
			if c := choice(o); c != nil {
				if m, ok := c["message"].(map[string]any); ok {
					res.text += str(m["content"])
				}
				if d, ok := c["delta"].(map[string]any); ok {
					res.text += str(d["content"])
				}
			}
		}
		if tm, ok := o["timings"].(map[string]any); ok {
			res.promptN = num(tm["prompt_n"])
			res.cacheN = num(tm["cache_n"])
		}
	}
	return res
}

func choice(o map[string]any) map[string]any {
	cs, _ := o["choices"].([]any)
	if len(cs) == 0 {
		return nil
	}
	c, _ := cs[0].(map[string]any)
	return c
}

func str(v any) string { s, _ := v.(string); return s }
func num(v any) int    { f, _ := v.(float64); return int(f) }

func tail(s string) string {
	if len(s) > 200 {
		return s[len(s)-200:]
	}
	return s
}

// fdSnapshot counts pid's open fds that are not sockets (keep-alive
// connections come and go) and lists any memfd it still holds.
func fdSnapshot(t *testing.T, pid int) (n int, memfds []string) {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || strings.HasPrefix(link, "socket:") {
			continue
		}
		if strings.HasPrefix(link, "/memfd:") {
			memfds = append(memfds, link)
		}
		n++
	}
	return n, memfds
}

// assertClean checks that the slot dir is empty and onebitd holds no fd
// beyond its baseline.
func assertClean(t *testing.T, e *env, baseline int) {
	t.Helper()
	obtest.WaitFor(t, 5*time.Second, "no handoff file left in the slot dir", func() bool {
		ents, _ := dirEntries(e.slotDir)
		return len(ents) == 0
	})
	obtest.WaitFor(t, 5*time.Second, "onebitd's fds back to baseline and no memfd held", func() bool {
		n, mem := fdSnapshot(t, e.onebit.PID())
		return n <= baseline && len(mem) == 0
	})
}

// eventLog is the path of e's event log.
func (e *env) eventLog() string { return filepath.Join(e.stateDir, "events.jsonl") }

// logEvents reads every event of e's event log (onebitd runs with
// --event-log-sync always in tests, so a line is on disk before the
// response ends).
func logEvents(t *testing.T, e *env) []event.Event {
	t.Helper()
	var out []event.Event
	if _, err := eventlog.ReadFile(e.eventLog(), func(_ int, ev event.Event) error {
		out = append(out, ev)
		return nil
	}); err != nil {
		t.Fatalf("read event log: %v", err)
	}
	return out
}

// requestEvents are the logged events of one request, in order.
func requestEvents(t *testing.T, e *env, id string) []event.Event {
	var out []event.Event
	for _, ev := range logEvents(t, e) {
		if ev.RequestID == id {
			out = append(out, ev)
		}
	}
	return out
}

// helperProcess lets the test binary act as a provider (see providerModes).
func helperProcess() int {
	mode := os.Getenv("E2E_PROVIDER_MODE")
	if f, ok := providerModes[mode]; ok {
		return f(os.Args[1:])
	}
	fmt.Fprintf(os.Stderr, "unknown E2E_PROVIDER_MODE %q\n", mode)
	return 2
}

var providerModes = map[string]func(args []string) int{}

// innerProvider runs the real sim provider ($E2E_PROVIDER_BIN) with args
// and every fd this helper inherited from 3 on, at the same numbers.
func innerProvider(args []string) error {
	cmd := exec.Command(os.Getenv("E2E_PROVIDER_BIN"), args...)
	for fd := 3; ; fd++ {
		f := os.NewFile(uintptr(fd), fmt.Sprintf("fd%d", fd))
		if _, err := f.Stat(); err != nil {
			break
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	}
	cmd.Stderr = os.Stderr
	return cmd.Run()
}

// httpPost posts body and drains the answer; it returns the status.
func httpPost(url, body string) (int, error) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

// dirEntries lists dir's files but the slots' share sockets
// (kvshare-<K>.sock), which onebitd keeps from start to stop.
func dirEntries(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		if ok, _ := filepath.Match("kvshare-*.sock", e.Name()); ok {
			continue
		}
		names = append(names, e.Name())
	}
	return names, err
}
