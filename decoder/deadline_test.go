package decoder

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// silent is a real listener that accepts connections and never answers.
func silent(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

// A decoder that accepts and never answers: every control call returns in
// bounded time even when the caller's context has no deadline (issue 9:
// startup hung forever on /props).
func TestControlCallsHaveDeadlines(t *testing.T) {
	c, err := New(silent(t), nil, WithCallTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := New("http://127.0.0.1:1", nil); d.CallTimeout() != DefaultCallTimeout {
		t.Fatalf("default call timeout %v", d.CallTimeout())
	}
	ctx := context.Background()
	calls := map[string]func() error{
		"props":    func() error { _, err := c.Props(ctx); return err },
		"health":   func() error { return c.Health(ctx) },
		"tokenize": func() error { _, err := c.Tokenize(ctx, "x"); return err },
		"share":    func() error { _, err := c.Share(ctx, 0, "/x.sock"); return err },
		"erase":    func() error { return c.Erase(ctx, 0) },
		"call":     func() error { return c.Call(ctx, "slots", "GET", "/slots", nil, nil) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			errc := make(chan error, 1)
			go func() { errc <- call() }()
			select {
			case err := <-errc:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("err %v, want a deadline", err)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("no answer after 3s: the call has no deadline")
			}
		})
	}
}

// A caller's own deadline wins over CallTimeout, and the forward path
// (HTTP()) has no deadline: a completion answers when it is done.
func TestCallerDeadlineAndForwardPath(t *testing.T) {
	const slow = 200 * time.Millisecond // every answer takes this long
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(slow):
		case <-r.Context().Done():
			return
		}
		w.Write([]byte(`{"total_slots":1}`))
	}))
	defer ts.Close()
	c, err := New(ts.URL, nil, WithCallTimeout(slow/4))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, c.BaseURL()+"/completion", strings.NewReader("{}"))
	resp, err := c.HTTP().Do(req)
	if err != nil {
		t.Fatalf("forward path cut short: %v", err)
	}
	resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if p, err := c.Props(ctx); err != nil || p.TotalSlots != 1 {
		t.Fatalf("props with the caller's deadline: %+v %v", p, err)
	}
	if _, err := c.Props(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("props without a deadline: %v, want CallTimeout to cut it", err)
	}
}
