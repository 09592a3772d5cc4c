package handlers

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/decodersim"
)

// TestContentLengthTooLarge (issue 10 §6): a declared body over MaxBody is
// 413 at once, from the header, before a byte of it is read (nginx does the
// same); the client never has to send it.
func TestContentLengthTooLarge(t *testing.T) {
	f := newFront(t, sim(t, nil).URL, nil) // MaxBody 64 KiB
	for _, path := range []string{"/completion", "/v1/chat/completions"} {
		req := "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
			itoa(1<<16+1) + "\r\n\r\n{\"prompt\":"
		res := raw(t, f.url, req, 3*time.Second)
		if res.err != nil || res.status != 413 {
			t.Fatalf("%s: %d %v %s after %v", path, res.status, res.err, res.body, res.elapsed)
		}
		if msg := errorShape(t, res.body, 413, typeInvalidRequest); !strings.Contains(msg, "65536") {
			t.Fatalf("the message should name the limit: %q", msg)
		}
		if !res.close {
			t.Fatalf("413 without Connection: close: %v", res.header)
		}
	}
	if n := len(f.mem.Events()); n != 0 {
		t.Fatalf("refused requests made %d events", n)
	}
}

// TestBodyTimeout (issue 10 §6): a client that sends its headers and not
// (all of) its body is answered 408 in llama-server's shape when the body
// deadline passes, on the completion paths and on the proxied ones; it
// does not hold its connection (nor a decoder connection) forever.
func TestBodyTimeout(t *testing.T) {
	rec := &recorder{}
	dec, _ := simWrap(t, nil, rec.wrap)
	const deadline = 200 * time.Millisecond
	f := newFront(t, dec.URL, func(c *Config) { c.BodyTimeout = deadline })
	for _, c := range []struct{ path, partial string }{
		{"/completion", ``},
		{"/v1/chat/completions", `{"messages":`},
		{"/tokenize", `{"content":`},
	} {
		req := "POST " + c.path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n" + c.partial
		res := raw(t, f.url, req, 5*time.Second)
		if res.err != nil || res.status != 408 {
			t.Fatalf("%s: %d %v %s after %v", c.path, res.status, res.err, res.body, res.elapsed)
		}
		errorShape(t, res.body, 408, typeInvalidRequest)
		if res.elapsed < deadline || res.elapsed > 10*deadline {
			t.Fatalf("%s: 408 after %v, deadline %v", c.path, res.elapsed, deadline)
		}
	}
	if n := len(f.mem.Events()); n != 0 {
		t.Fatalf("bodies that never came made %d events", n)
	}
}

// TestBodyTimeoutEndsWithBody: the deadline bounds the body, not the
// request: a stream that lasts many deadlines after its body arrived is
// served whole (a read deadline left on the connection would cancel it as
// a client gone).
func TestBodyTimeoutEndsWithBody(t *testing.T) {
	const deadline = 100 * time.Millisecond
	// A decoder slow to answer a request marked X-Test-Slow (it has read
	// the whole body first).
	slow := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Test-Slow") != "" {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				select {
				case <-time.After(4 * deadline): // the decoder's slowness, not a synchronisation
				case <-r.Context().Done():
				}
			}
			next.ServeHTTP(w, r)
		})
	}
	dec, _ := simWrap(t, func(c *decodersim.Config) { c.TokenDelay = 20 * time.Millisecond }, slow)
	f := newFront(t, dec.URL, func(c *Config) { c.BodyTimeout = deadline })
	start := time.Now()
	resp, err := http.Post(f.url+"/completion", "application/json",
		strings.NewReader(`{"prompt":" the cache","n_predict":30,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	last := ""
	for sc.Scan() {
		if l := sc.Text(); l != "" {
			last = l
		}
	}
	if resp.StatusCode != 200 || !strings.Contains(last, `"stop":true`) || time.Since(start) < 3*deadline {
		t.Fatalf("%d after %v, last event %q", resp.StatusCode, time.Since(start), last)
	}
	evs := settled(t, f.mem)
	if len(evs) != 2 || evs[1].To != "done" {
		t.Fatalf("events %+v", evs)
	}
	// Nor a proxied request whose answer comes after the deadline.
	res := raw(t, f.url, "POST /tokenize HTTP/1.1\r\nHost: x\r\nX-Test-Slow: 1\r\nContent-Length: 17\r\nConnection: close\r\n\r\n{\"content\":\"the\"}", 5*time.Second)
	if res.status != 200 || !strings.Contains(string(res.body), `"tokens"`) || res.elapsed < 3*deadline {
		t.Fatalf("slow proxied answer: %d %v %s after %v", res.status, res.err, res.body, res.elapsed)
	}
	// And a proxied GET (no body at all) is not cut either.
	res = raw(t, f.url, "GET /props HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 5*time.Second)
	if res.status != 200 {
		t.Fatalf("GET /props: %d %v", res.status, res.err)
	}
}
