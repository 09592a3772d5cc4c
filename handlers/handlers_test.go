package handlers

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/decodersim"
	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/slots"
)

// sim is the decoder simulator, in process, as the decoder.
func sim(t testing.TB, mod func(*decodersim.Config)) *httptest.Server {
	t.Helper()
	ts, _ := simWrap(t, mod, nil)
	return ts
}

// simWrap is sim with wrap around the simulator's handler (nil: none); it
// also returns the simulator's configuration.
func simWrap(t testing.TB, mod func(*decodersim.Config), wrap func(http.Handler) http.Handler) (*httptest.Server, decodersim.Config) {
	t.Helper()
	cfg := decodersim.DefaultConfig()
	cfg.ModelPath = filepath.Join(t.TempDir(), "m.gguf")
	os.WriteFile(cfg.ModelPath, []byte("GGUF-SIM handlers"), 0o600)
	cfg.NCtx = 2048
	cfg.NParallel = 1
	cfg.SlotSavePath = t.TempDir()
	if mod != nil {
		mod(&cfg)
	}
	s, err := decodersim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = s.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(func() { ts.Close(); s.Close() })
	return ts, cfg
}

type front struct {
	url  string
	mem  *event.Mem
	pool *slots.Pool
}

func newFront(t *testing.T, decURL string, mod func(*Config)) front {
	t.Helper()
	dec, err := decoder.New(decURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := front{mem: &event.Mem{}, pool: slots.New(1, 4)}
	cfg := Config{Decoder: dec, Pool: f.pool, Sink: f.mem, MaxBody: 1 << 16}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	f.url = ts.URL
	return f
}

func post(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp, raw
}

func errorShape(t *testing.T, raw []byte, status int, typ string) string {
	t.Helper()
	var e struct {
		Error struct {
			Code    int
			Message string
			Type    string
		}
	}
	if err := json.Unmarshal(raw, &e); err != nil || e.Error.Code != status || e.Error.Type != typ || e.Error.Message == "" {
		t.Fatalf("want llama-server error %d %s, got %s", status, typ, raw)
	}
	return e.Error.Message
}

func TestPlainRoute(t *testing.T) {
	f := newFront(t, sim(t, nil).URL, nil)
	resp, raw := post(t, f.url+"/completion", `{"prompt":" the cache","n_predict":4}`)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderRoute) != "plain" || resp.Header.Get(HeaderRequestID) == "" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, raw)
	}
	evs := settled(t, f.mem)
	if len(evs) != 2 || evs[0].To != "forwarding" || evs[1].To != "done" || evs[1].HTTPStatus != 200 {
		t.Fatalf("events %+v", evs)
	}
}

func TestBadBodies(t *testing.T) {
	f := newFront(t, sim(t, nil).URL, nil)
	cases := []struct {
		path, body string
		status     int
	}{
		{"/completion", `{`, 400},
		{"/completion", `"str"`, 400},
		{"/v1/chat/completions", ``, 400},
		{"/completion", `{"prompt":"` + strings.Repeat("x", 1<<16) + `"}`, 413},
	}
	for _, c := range cases {
		resp, raw := post(t, f.url+c.path, c.body)
		if resp.StatusCode != c.status {
			t.Fatalf("%s %q: %d %s", c.path, c.body[:min(len(c.body), 20)], resp.StatusCode, raw)
		}
		errorShape(t, raw, c.status, typeInvalidRequest)
	}
	if n := len(f.mem.Events()); n != 0 {
		t.Fatalf("rejected bodies made %d events", n)
	}
}

// TestQueueFull: every slot busy and the queue full ⇒ 503 at once.
func TestQueueFull(t *testing.T) {
	dec := sim(t, func(c *decodersim.Config) { c.TokenDelay = 5 * time.Millisecond })
	f := newFront(t, dec.URL, func(c *Config) { c.Pool = slots.New(1, 0) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/completion", strings.NewReader(`{"prompt":" the","n_predict":100000,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	r2, raw := post(t, f.url+"/v1/completions", `{"prompt":" the","max_tokens":2}`)
	if r2.StatusCode != 503 {
		t.Fatalf("second request: %d %s", r2.StatusCode, raw)
	}
	errorShape(t, raw, 503, typeUnavailable)
}

func TestNotReady(t *testing.T) {
	f := newFront(t, sim(t, nil).URL, func(c *Config) {
		c.Ready = func() error { return errors.New("the decoder is restarting after it exited") }
	})
	resp, raw := post(t, f.url+"/completion", `{"prompt":" the"}`)
	if msg := errorShape(t, raw, 503, typeUnavailable); resp.StatusCode != 503 || !strings.Contains(msg, "restarting") {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
}

// TestDecoderDown: the decoder unreachable ⇒ 503 in llama-server's shape,
// and the request's machine ends failed with the reason.
func TestDecoderDown(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	f := newFront(t, dead.URL, nil)
	resp, raw := post(t, f.url+"/completion", `{"prompt":" the"}`)
	errorShape(t, raw, 503, typeUnavailable)
	evs := settled(t, f.mem)
	if resp.StatusCode != 503 || len(evs) != 2 || evs[1].To != "failed" || evs[1].Reason == "" {
		t.Fatalf("%d events %+v", resp.StatusCode, evs)
	}
	// Other paths: the proxy's own 503.
	resp, raw = post(t, f.url+"/tokenize", `{"content":"x"}`)
	if resp.StatusCode != 503 {
		t.Fatalf("proxy to a dead decoder: %d", resp.StatusCode)
	}
	errorShape(t, raw, 503, typeUnavailable)
}

// TestProxyVerbatim: non-completion paths reach the decoder unchanged.
func TestProxyVerbatim(t *testing.T) {
	dec := sim(t, nil)
	f := newFront(t, dec.URL, nil)
	for _, p := range []string{"/health", "/props", "/v1/models", "/nope"} {
		a, _ := http.Get(f.url + p)
		b, _ := http.Get(dec.URL + p)
		ab, _ := io.ReadAll(a.Body)
		bb, _ := io.ReadAll(b.Body)
		a.Body.Close()
		b.Body.Close()
		if a.StatusCode != b.StatusCode || !bytes.Equal(ab, bb) {
			t.Fatalf("%s: proxied %d %s, direct %d %s", p, a.StatusCode, ab, b.StatusCode, bb)
		}
	}
}

// FuzzCompletionBody: request bodies are outside bytes. Whatever arrives,
// onebitd answers (never panics), an error is in llama-server's shape, and
// every request that reached a slot ends in done or failed.
func FuzzCompletionBody(f *testing.F) {
	for _, s := range []string{`{"prompt":" the cache","n_predict":2}`, `{"prompt":[1,1003],"n_predict":1}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`, `{`, `null`, `{"prompt":null}`, `{"prompt":[["x"]]}`,
		`{"prompt":[1,-1],"n_predict":1}`, `{"prompt":[1,4294968296],"n_predict":1}`, `{"prompt":[1,1e3]}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		dec := sim(t, nil)
		fr := newFront(t, dec.URL, nil)
		for _, path := range []string{"/completion", "/v1/chat/completions"} {
			resp, raw := post(t, fr.url+path, body)
			if resp.StatusCode >= 400 && !json.Valid(raw) {
				t.Fatalf("%s %q: %d with a non-JSON body %q", path, body, resp.StatusCode, raw)
			}
		}
		settled(t, fr.mem)
	})
}

// settled waits until every request seen in mem has ended (done or
// failed: the last event is emitted after the response is written) and
// returns the events.
func settled(t *testing.T, mem *event.Mem) []event.Event {
	t.Helper()
	var evs []event.Event
	obtest.WaitFor(t, 5*time.Second, "every request to end", func() bool {
		evs = mem.Events()
		last := map[string]string{}
		for _, e := range evs {
			last[e.RequestID] = e.To
		}
		for _, to := range last {
			if to != "done" && to != "failed" {
				return false
			}
		}
		return true
	})
	return evs
}
