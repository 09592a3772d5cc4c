package decoder

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// server answers every request with status and body (llama-server's shapes).
func server(t *testing.T, status int, body string) *Client {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write([]byte(body))
	}))
	t.Cleanup(ts.Close)
	c, err := New(ts.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestErrors(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		status int
		body   string
		call   func(c *Client) error
		is     error
		substr string
	}{
		{"upstream has no share", 400, `{"error":{"code":400,"message":"Invalid action","type":"invalid_request_error"}}`,
			func(c *Client) error { _, err := c.Share(ctx, 0, "/x.sock"); return err }, ErrNoShare, "no shared route"},
		{"recurrent 501", 501, `{"error":{"code":501,"message":"no shareable region","type":"not_supported_error"}}`,
			func(c *Client) error { _, err := c.Share(ctx, 0, "/x.sock"); return err }, nil, "501 not_supported_error: no shareable region"},
		{"share without id", 200, `{"id_slot":0}`,
			func(c *Client) error { _, err := c.Share(ctx, 0, "/x.sock"); return err }, ErrBadReply, "no share_id"},
		{"adopt refused", 400, `{"error":{"code":400,"message":"share_id 3 was already adopted","type":"invalid_request_error"}}`,
			func(c *Client) error { return c.Adopt(ctx, 0, []int{1, 2}, 3) }, nil, "share_id 3 was already adopted"},
		{"restore failed", 400, `{"error":{"code":400,"message":"Unable to restore slot: bad file","type":"invalid_request_error"}}`,
			func(c *Client) error { _, err := c.Restore(ctx, 0, "x.bin"); return err }, nil, "Unable to restore slot"},
		{"not the error shape", 502, `<html>bad gateway</html>`,
			func(c *Client) error { _, err := c.Tokenize(ctx, "x"); return err }, nil, "502: <html>bad gateway</html>"},
		{"malformed tokens", 200, `{"tokens": "x"}`,
			func(c *Client) error { _, err := c.Tokenize(ctx, "x"); return err }, ErrBadReply, "tokenize"},
		{"template without prompt", 200, `{}`,
			func(c *Client) error { _, err := c.ApplyTemplate(ctx, []byte(`{}`)); return err }, ErrBadReply, "no prompt"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(server(t, tc.status, tc.body))
			if err == nil || !strings.Contains(err.Error(), tc.substr) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("got %v, want %q (is %v)", err, tc.substr, tc.is)
			}
			if tc.status >= 400 && !IsStatus(err, tc.status) {
				t.Fatalf("IsStatus(%d) false for %v", tc.status, err)
			}
		})
	}
}

func TestTimeoutAndUnreachable(t *testing.T) {
	block := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer ts.Close()
	defer close(block)
	c, _ := New(ts.URL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Adopt(ctx, 0, []int{1}, 1); err == nil || !strings.Contains(err.Error(), "did not answer adopt in time") {
		t.Fatalf("got %v", err)
	}
	dead, _ := New("http://127.0.0.1:1", nil)
	if err := dead.Health(context.Background()); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("got %v", err)
	}
}

func TestBadURL(t *testing.T) {
	for _, u := range []string{"", "localhost:8080", "ftp://x", "http://"} {
		if _, err := New(u, nil); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
}

// TestAdoptJSONBody: the pre-encoded adopt body is the same JSON object as
// Adopt's.
func TestAdoptJSONBody(t *testing.T) {
	bodies := make(chan string, 2)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.RequestURI() != "/slots/3?action=adopt" || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("request %s %q", r.URL.RequestURI(), r.Header.Get("Content-Type"))
		}
		bodies <- string(b)
	}))
	defer ts.Close()
	c, _ := New(ts.URL, nil)
	ctx := context.Background()
	if err := c.Adopt(ctx, 3, []int{1, 1003, 42}, 7); err != nil {
		t.Fatal(err)
	}
	if err := c.AdoptJSON(ctx, 3, json.RawMessage(`[1,1003,42]`), 7); err != nil {
		t.Fatal(err)
	}
	var a, b any
	json.Unmarshal([]byte(<-bodies), &a)
	json.Unmarshal([]byte(<-bodies), &b)
	if !reflect.DeepEqual(a, b) || a == nil {
		t.Fatalf("Adopt sent %v, AdoptJSON %v", a, b)
	}
}
