package handlers

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/obtest"
)

// TestQueryStringForwarded (issue 9): a completion's query string reaches
// the decoder.
func TestQueryStringForwarded(t *testing.T) {
	rec := &recorder{}
	dec, _ := simWrap(t, nil, rec.wrap)
	f := newFront(t, dec.URL, nil)
	resp, raw := post(t, f.url+"/v1/completions?model=m&x=%2F", `{"prompt":" the","max_tokens":1}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	var got []string
	for _, r := range rec.all() {
		if r.Path == "/v1/completions" {
			got = append(got, r.RawQuery)
		}
	}
	if len(got) != 1 || got[0] != "model=m&x=%2F" {
		t.Fatalf("the decoder saw queries %q", got)
	}
}

// TestPoolClosed (issue 9): a request that meets a closing slot pool is
// answered 503 in llama-server's shape, not left without an answer.
func TestPoolClosed(t *testing.T) {
	f := newFront(t, sim(t, nil).URL, nil)
	f.pool.Close()
	resp, raw := post(t, f.url+"/completion", `{"prompt":" the","n_predict":1}`)
	if resp.StatusCode != 503 {
		t.Fatalf("%d %q", resp.StatusCode, raw)
	}
	errorShape(t, raw, 503, typeUnavailable)
}

// TestClientGoneWhileTokenizing (issue 10 §6): a client that leaves while
// its prompt is being tokenized is reported as gone at step tokenize, not
// as a decoder that did not answer; it takes no slot.
func TestClientGoneWhileTokenizing(t *testing.T) {
	started := make(chan struct{}, 1)
	block := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/tokenize" {
				io.Copy(io.Discard, r.Body) // read: the server then notices the caller leave
				select {
				case started <- struct{}{}:
				default:
				}
				<-r.Context().Done() // a decoder busy until the caller gives up
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	dec, sc := simWrap(t, nil, block)
	route, _ := fileRoute(t, dec.URL, sc)
	log, buf := logTo()
	f := newFront(t, dec.URL, func(c *Config) { route(c); c.Logger = log })

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/completion", strings.NewReader(`{"prompt":" the cache","n_predict":1}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-started
	cancel()
	<-done
	obtest.WaitFor(t, 5*time.Second, "a client-gone line at step tokenize", func() bool {
		return logHas(buf, ReasonClientGone, "step=tokenize")
	})
	for _, e := range f.mem.Events() {
		t.Errorf("event for a request whose client left before it had a slot: %+v", e)
	}
	if strings.Contains(buf.String(), "did not answer") {
		t.Fatalf("reported as a decoder timeout:\n%s", buf)
	}
	if st := f.pool.Stats(); st.Free != 1 {
		t.Fatalf("pool %+v", st)
	}
}

// TestClientGoneWhileQueued (issue 10 §6): a client that leaves while it
// waits for a slot is reported as gone at step queue.
func TestClientGoneWhileQueued(t *testing.T) {
	log, buf := logTo()
	f := newFront(t, sim(t, nil).URL, func(c *Config) { c.Logger = log })
	held, err := f.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer f.pool.Release(held)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/completion", strings.NewReader(`{"prompt":" the","n_predict":1}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	obtest.WaitFor(t, 5*time.Second, "the request to queue", func() bool { return f.pool.Stats().Waiting == 1 })
	cancel()
	<-done
	obtest.WaitFor(t, 5*time.Second, "a client-gone line at step queue", func() bool {
		return logHas(buf, ReasonClientGone, "step=queue")
	})
	if st := f.pool.Stats(); st.Waiting != 0 {
		t.Fatalf("pool %+v", st)
	}
}
