package decoder

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// keyed answers like llama-server with --api-key-file: 401 in its error shape
// without the right bearer key, except /health. It records the headers seen.
func keyed(key string, seen chan<- string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen != nil {
			seen <- r.Header.Get("Authorization")
		}
		if r.URL.Path != "/health" && r.Header.Get("Authorization") != "Bearer "+key {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}`))
			return
		}
		w.Write([]byte(`{"total_slots":2,"status":"ok"}`))
	})
}

// unixServer serves h on a unix socket in a 0700 directory.
func unixServer(t *testing.T, h http.Handler) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dec")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "decoder.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestBearerKey(t *testing.T) {
	const key = "k3y-per-boot"
	seen := make(chan string, 16)
	ts := httptest.NewServer(keyed(key, seen))
	defer ts.Close()
	ctx := context.Background()

	// Without the key: /health answers, /props is refused with a readable error.
	bare, _ := New(ts.URL, nil)
	if err := bare.Health(ctx); err != nil {
		t.Fatalf("health without key: %v", err)
	}
	<-seen
	_, err := bare.Props(ctx)
	if !IsStatus(err, 401) || !strings.Contains(err.Error(), "Invalid API Key") {
		t.Fatalf("props without key: %v", err)
	}
	if got := <-seen; got != "" {
		t.Fatalf("a client without a key sent Authorization %q", got)
	}

	c, err := New(ts.URL, nil, WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := c.Props(ctx); err != nil || p.TotalSlots != 2 {
		t.Fatalf("props with key: %+v %v", p, err)
	}
	if got := <-seen; got != "Bearer "+key {
		t.Fatalf("Authorization %q", got)
	}
	// The forward path: a client's own Authorization is replaced by the
	// decoder's key, and the client's request is left as it was.
	req, _ := http.NewRequest(http.MethodPost, c.BaseURL()+"/completion", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer the-clients-key")
	resp, err := c.HTTP().Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("forward: %v %v", resp, err)
	}
	resp.Body.Close()
	if got := <-seen; got != "Bearer "+key {
		t.Fatalf("forwarded Authorization %q", got)
	}
	if req.Header.Get("Authorization") != "Bearer the-clients-key" {
		t.Fatal("the RoundTripper modified the caller's request")
	}
	// A reverse proxy on the client's transport (as handlers/ builds it).
	up, _ := url.Parse(c.BaseURL())
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(up) },
		Transport: c.HTTP().Transport,
	})
	defer proxy.Close()
	resp, err = http.Get(proxy.URL + "/props")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("proxied /props: %v %v", resp, err)
	}
	resp.Body.Close()
	if got := <-seen; got != "Bearer "+key {
		t.Fatalf("proxied Authorization %q", got)
	}
	c.HTTP().CloseIdleConnections()

	if _, err := New(ts.URL, nil, WithAPIKey("two words")); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("key with a space: %v", err)
	}
	// From a key file (an attached decoder's --decoder-api-key-file).
	kf := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(kf, []byte("\n"+key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cf, err := New(ts.URL, nil, WithAPIKeyFile(kf))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cf.Props(ctx); err != nil {
		t.Fatalf("props with the key file's key: %v", err)
	}
	<-seen
	if _, err := New(ts.URL, nil, WithAPIKeyFile(kf+".missing")); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("missing key file: %v", err)
	}
}

func TestUnixSocket(t *testing.T) {
	const key = "sock-key"
	sock := unixServer(t, keyed(key, nil))
	ctx := context.Background()
	c, err := New("unix://"+sock, nil, WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket() != sock || c.Addr() != "unix://"+sock || !strings.HasPrefix(c.BaseURL(), "http://") {
		t.Fatalf("socket %q addr %q base %q", c.Socket(), c.Addr(), c.BaseURL())
	}
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := c.Props(ctx); err != nil || p.TotalSlots != 2 {
		t.Fatalf("props %+v %v", p, err)
	}
	req, _ := http.NewRequest(http.MethodPost, c.BaseURL()+"/completion", strings.NewReader("{}"))
	resp, err := c.HTTP().Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("forward over the socket: %v %v", resp, err)
	}
	resp.Body.Close()
	// Built on a caller's *http.Transport: cloned, the caller's untouched.
	own := &http.Transport{DisableKeepAlives: true}
	c2, err := New("unix://"+sock, &http.Client{Transport: own})
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if own.DialContext != nil {
		t.Fatal("the caller's transport was modified")
	}
	// Nothing listens: unreachable, not a hang.
	dead, _ := New("unix://"+filepath.Join(filepath.Dir(sock), "none.sock"), nil)
	if err := dead.Health(ctx); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("no socket: %v", err)
	}
	c.HTTP().CloseIdleConnections()
}

func TestBadAddresses(t *testing.T) {
	long := "unix:///" + strings.Repeat("d", 120) + ".sock"
	for _, u := range []string{"unix:relative.sock", "unix://host/x.sock", "unix://", long} {
		if _, err := New(u, nil); !errors.Is(err, ErrBadURL) {
			t.Errorf("New(%q): %v, want ErrBadURL", u, err)
		}
	}
	type rt struct{ http.RoundTripper }
	if _, err := New("unix:///tmp/x.sock", &http.Client{Transport: rt{}}); !errors.Is(err, ErrBadURL) {
		t.Errorf("unix socket over a foreign RoundTripper: %v", err)
	}
}

func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, content, want string
		ok                  bool
	}{
		{"one key", "abc\n", "abc", true},
		{"first of many", "\n  \nfirst\nsecond\n", "first", true},
		{"crlf", "key\r\n", "key", true},
		{"no newline", "key", "key", true},
		{"empty", "", "", false},
		{"blank", "\n \n\t\n", "", false},
		{"inner space", "two words\n", "", false},
		{"control char", "a\x01b\n", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := ReadKeyFile(p)
			if tc.ok != (err == nil) || got != tc.want {
				t.Fatalf("ReadKeyFile = %q, %v", got, err)
			}
			if err != nil && (!errors.Is(err, ErrKeyFile) || strings.Contains(err.Error(), "two words")) {
				t.Fatalf("error %v (must wrap ErrKeyFile and never show the key)", err)
			}
		})
	}
	if _, err := ReadKeyFile(filepath.Join(dir, "missing")); !errors.Is(err, ErrKeyFile) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// FuzzParseKeyFile: whatever a key file holds, a key that comes out can go
// in a header as is, and New accepts it.
func FuzzParseKeyFile(f *testing.F) {
	f.Add([]byte("abc\n"))
	f.Add([]byte("\r\n  key-2 \r\nother\n"))
	f.Add([]byte("two words\n"))
	f.Add([]byte("\x00\xff\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		key, err := parseKeyFile(b)
		if err != nil {
			return
		}
		if key == "" || strings.ContainsAny(key, " \t\r\n\x00") || !strings.Contains(string(b), key) {
			t.Fatalf("key %q from %q", key, b)
		}
		if _, err := New("http://127.0.0.1:1", nil, WithAPIKey(key)); err != nil {
			t.Fatalf("New refused key %q: %v", key, err)
		}
	})
}

// nopRT answers every request with an empty 200 without I/O.
type nopRT struct{}

func (nopRT) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
}

// BenchmarkKeyTransport: what the bearer key adds to a forwarded request
// (a clone of the request and one header).
func BenchmarkKeyTransport(b *testing.B) {
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/completion", http.NoBody)
	for k, v := range map[string]string{"Content-Type": "application/json", "User-Agent": "bench", "Accept": "*/*", "X-Request-Id": "abc"} {
		req.Header.Set(k, v)
	}
	for _, tc := range []struct {
		name string
		rt   http.RoundTripper
	}{{"none", nopRT{}}, {"key", &keyTransport{base: nopRT{}, auth: "Bearer " + strings.Repeat("k", 64)}}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tc.rt.RoundTrip(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
