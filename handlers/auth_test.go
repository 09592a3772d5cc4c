package handlers

import (
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAPIKeys (issue 10, clients authenticated): with keys, every path but
// /health needs one in llama-server's convention (Authorization, a
// "Bearer " prefix removed, else X-Api-Key); anything else is 401 in
// llama-server's shape, and a client's key never reaches the decoder.
func TestAPIKeys(t *testing.T) {
	rec := &recorder{}
	dec, _ := simWrap(t, nil, rec.wrap)
	keys := []string{"k-one", "k-two-longer"}
	f := newFront(t, dec.URL, func(c *Config) { c.APIKeys = keys })
	completion := `{"prompt":" the","n_predict":1}`
	cases := []struct {
		name, method, path string
		header             map[string]string
		want               int
	}{
		{"no key", "POST", "/completion", nil, 401},
		{"wrong key", "POST", "/completion", map[string]string{"Authorization": "Bearer nope"}, 401},
		{"prefix of a key", "POST", "/completion", map[string]string{"Authorization": "Bearer k-on"}, 401},
		{"key and more", "POST", "/completion", map[string]string{"Authorization": "Bearer k-one2"}, 401},
		{"empty bearer", "POST", "/completion", map[string]string{"Authorization": "Bearer "}, 401},
		{"two keys joined", "POST", "/completion", map[string]string{"Authorization": "Bearer k-one,k-two-longer"}, 401},
		{"bearer", "POST", "/completion", map[string]string{"Authorization": "Bearer k-one"}, 200},
		{"second key", "POST", "/v1/chat/completions", map[string]string{"Authorization": "Bearer k-two-longer"}, 200},
		{"bare key, as llama-server takes it", "POST", "/completion", map[string]string{"Authorization": "k-one"}, 200},
		{"X-Api-Key", "POST", "/completion", map[string]string{"X-Api-Key": "k-two-longer"}, 200},
		{"X-Api-Key with bearer", "POST", "/completion", map[string]string{"X-Api-Key": "Bearer k-one"}, 200},
		{"Authorization wins over X-Api-Key", "POST", "/completion", map[string]string{"Authorization": "Bearer nope", "X-Api-Key": "k-one"}, 401},
		{"proxied path without key", "GET", "/props", nil, 401},
		{"proxied path with key", "GET", "/props", map[string]string{"Authorization": "Bearer k-one"}, 200},
		{"model list needs a key", "GET", "/v1/models", nil, 401},
		{"tokenize needs a key", "POST", "/tokenize", nil, 401},
		{"health stays open", "GET", "/health", nil, 200},
		{"v1 health stays open", "GET", "/v1/health", nil, 200},
		{"escaped health is health", "GET", "/%68ealth", nil, 200},
		{"slots without key", "GET", "/slots", nil, 401},
		{"slots with key", "GET", "/slots", map[string]string{"Authorization": "Bearer k-one"}, 403},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body string
			if c.method == "POST" {
				body = completion
				if c.path == "/v1/chat/completions" {
					body = `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
				}
			}
			req, _ := http.NewRequest(c.method, f.url+c.path, strings.NewReader(body))
			for k, v := range c.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw := readAll(resp)
			if resp.StatusCode != c.want {
				t.Fatalf("%d %s", resp.StatusCode, raw)
			}
			if c.want == 401 {
				if msg := errorShape(t, raw, 401, typeAuthentication); msg != "Invalid API Key" {
					t.Fatalf("message %q", msg)
				}
				if resp.Header.Get("WWW-Authenticate") == "" {
					t.Fatal("a 401 without WWW-Authenticate")
				}
			}
		})
	}
	for _, r := range rec.all() {
		if r.Header.Get("Authorization") != "" || r.Header.Get("X-Api-Key") != "" {
			t.Fatalf("a client's key reached the decoder: %s %s %v", r.Method, r.Path, r.Header)
		}
	}
	// Refused requests made no event; the five accepted completions did.
	if evs := settled(t, f.mem); len(evs) != 2*5 {
		t.Fatalf("%d events, want 10: %+v", len(evs), evs)
	}
}

// TestAPIKeysPreflight: a browser's CORS preflight carries no key; it is
// not refused (llama-server answers OPTIONS before its key check).
func TestAPIKeysPreflight(t *testing.T) {
	f := newFront(t, sim(t, nil).URL, func(c *Config) { c.APIKeys = []string{"k"} })
	req, _ := http.NewRequest("OPTIONS", f.url+"/completion", nil)
	req.Header.Set("Origin", "http://ui.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(resp)
	if resp.StatusCode == 401 {
		t.Fatal("a preflight was refused for want of a key")
	}
}

// TestRequireKey: the middleware the daemon wraps its other handlers with
// (/metrics, the UI).
func TestRequireKey(t *testing.T) {
	calls := 0
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls++ })
	h := RequireKey([]string{"secret", "other"}, next)
	for _, c := range []struct {
		auth, api string
		ok        bool
	}{
		{"", "", false}, {"Bearer secre", "", false}, {"Bearer secret", "", true}, {"other", "", true},
		{"", "secret", true}, {"bearer secret", "", true}, {"Basic c2VjcmV0", "", false}, {"Bearer  secret", "", false},
	} {
		calls = 0
		req := httptest.NewRequest("GET", "/metrics", nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		if c.api != "" {
			req.Header.Set("X-Api-Key", c.api)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if got := calls == 1; got != c.ok || (c.ok && w.Code != 200) || (!c.ok && w.Code != 401) {
			t.Fatalf("%+v: called %v, status %d", c, got, w.Code)
		}
		if !c.ok {
			errorShape(t, w.Body.Bytes(), 401, typeAuthentication)
		}
	}
	// No keys: nothing to check (llama-server without --api-key).
	calls = 0
	w := httptest.NewRecorder()
	RequireKey(nil, next).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if calls != 1 {
		t.Fatal("RequireKey without keys refused a request")
	}
}

// TestLoadAPIKeys: --api-key-file is one key a line; blank lines and
// surrounding white space (a CRLF file) are dropped; a file without a key is
// an error, never "no authentication".
func TestLoadAPIKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keys, err := LoadAPIKeys(write("keys", "k1\n\n  k2  \r\nk3\r\n\n"))
	if err != nil || !slices.Equal(keys, []string{"k1", "k2", "k3"}) {
		t.Fatalf("%q %v", keys, err)
	}
	for _, empty := range []string{"", "\n\n", " \r\n\t\n"} {
		if _, err := LoadAPIKeys(write("empty", empty)); !errors.Is(err, ErrNoAPIKeys) {
			t.Fatalf("%q: %v", empty, err)
		}
	}
	if _, err := LoadAPIKeys(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// FuzzPresentedKey: the credential is read from outside bytes.
// llama-server's rule holds for any header values: Authorization when it
// is not empty, else X-Api-Key, with one "Bearer " prefix removed.
func FuzzPresentedKey(f *testing.F) {
	for _, s := range [][2]string{{"Bearer k", ""}, {"", "k"}, {"bearer k", "x"}, {"Bearer ", ""}, {"", ""}, {"BEARER \x00", "\xff"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, auth, api string) {
		h := http.Header{}
		if auth != "" {
			h["Authorization"] = []string{auth}
		}
		if api != "" {
			h["X-Api-Key"] = []string{api}
		}
		got := presentedKey(h)
		src := auth
		if src == "" {
			src = api
		}
		if got != src && !(len(src) >= 7 && strings.EqualFold(src[:7], "bearer ") && got == src[7:]) {
			t.Fatalf("auth %q api %q: presented %q", auth, api, got)
		}
		keys := newKeySet([]string{"k"})
		if keys.match(got) != (got == "k") {
			t.Fatalf("match(%q) wrong", got)
		}
	})
}

// FuzzRequestHead: the Authorization and Content-Length headers as a client
// writes them. Whatever they hold, onebitd answers within its body
// deadline; a completion is served only with a valid key; a Content-Length
// over the limit is 413; our own errors are in llama-server's shape.
func FuzzRequestHead(f *testing.F) {
	for _, s := range [][2]string{{"Bearer k", "31"}, {"k", "31"}, {"Bearer nope", "31"}, {"", "31"},
		{"Bearer k", "70000"}, {"Bearer k", "-1"}, {"Bearer k", "99999999999999999999"}, {"Bearer k", "3 1"},
		{"Bearer k", "+31"}, {"Bearer k", "0x1f"}, {"Bearer k", "10"}, {"Bearer k", "40"}} {
		f.Add(s[0], s[1])
	}
	dec := sim(f, nil)
	f.Fuzz(func(t *testing.T, auth, cl string) {
		if strings.ContainsAny(auth+cl, "\r\n") {
			return // not one header
		}
		fr := newFront(t, dec.URL, func(c *Config) {
			c.APIKeys = []string{"k"}
			c.BodyTimeout = 100 * time.Millisecond
		})
		body := `{"prompt":" the","n_predict":1}` // 31 bytes
		req := "POST /completion HTTP/1.1\r\nHost: x\r\nAuthorization: " + auth + "\r\nContent-Length: " + cl +
			"\r\nConnection: close\r\n\r\n" + body
		res := raw(t, fr.url, req, 5*time.Second)
		if res.err != nil && res.status == 0 {
			if strings.Contains(res.err.Error(), "timeout") {
				t.Fatalf("auth %q length %q: no answer: %v", auth, cl, res.err)
			}
			return // the connection was closed (a malformed request line)
		}
		valid := presentedKey(http.Header{"Authorization": {auth}}) == "k"
		if res.status == 200 && !valid {
			t.Fatalf("auth %q served", auth)
		}
		if strings.HasPrefix(res.header.Get("Content-Type"), "application/json") && res.status >= 400 {
			var typ string
			switch res.status {
			case 401:
				typ = typeAuthentication
			case 503:
				typ = typeUnavailable
			default:
				typ = typeInvalidRequest
			}
			errorShape(t, res.body, res.status, typ)
		}
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n > 1<<16 && valid && res.status != 413 {
			t.Fatalf("length %q: %d, want 413", cl, res.status)
		}
		if valid && res.status == 200 && cl != "31" {
			t.Fatalf("length %q for a 31-byte body served", cl)
		}
	})
}
