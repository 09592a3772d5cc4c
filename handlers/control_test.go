package handlers

import (
	"encoding/json"
	"net/url"
	"path"
	"strings"
	"testing"
	"time"
)

// slotsReached reports the requests that reached the decoder's /slots tree,
// read as llama-server reads a path (percent-decoded, any case, cleaned).
func slotsReached(rec *recorder) []seenReq {
	var out []seenReq
	for _, r := range rec.all() {
		p := r.Path
		for i := 0; i < 3; i++ { // decode as often as anyone might
			if d, err := url.PathUnescape(p); err == nil {
				p = d
			}
		}
		p = strings.ToLower(path.Clean("/" + p))
		if p == "/slots" || strings.HasPrefix(p, "/slots/") {
			out = append(out, r)
		}
	}
	return out
}

// TestSlotsAPIClosed (issue 10 §1): a client of onebitd cannot reach the
// decoder's /slots tree: share, save, restore, erase, adopt and the GET
// list are 403 permission_error in llama-server's shape, whatever the
// spelling of the path, and nothing of it reaches the decoder.
func TestSlotsAPIClosed(t *testing.T) {
	rec := &recorder{}
	dec, _ := simWrap(t, nil, rec.wrap)
	f := newFront(t, dec.URL, nil)
	body := `{"filename":"x.bin","socket":"/tmp/mine.sock","tokens":[1,2],"share_id":0}`
	cases := []struct{ method, target string }{
		{"POST", "/slots/0?action=share"},
		{"POST", "/slots/0?action=save"},
		{"POST", "/slots/0?action=restore"},
		{"POST", "/slots/0?action=erase"},
		{"POST", "/slots/0?action=adopt"},
		{"GET", "/slots"},
		{"GET", "/slots?fail_on_no_slot=1"},
		{"GET", "/slots/"},
		{"POST", "//slots/0?action=erase"},
		{"POST", "/slots/../slots/0?action=erase"},
		{"POST", "/x/../slots/0?action=erase"},
		{"POST", "/./slots/0?action=erase"},
		{"POST", "/SLOTS/0?action=erase"},
		{"POST", "/Slots/0?action=erase"},
		{"POST", "/slots%2F0?action=erase"},
		{"POST", "/slots%2f0?action=erase"},
		{"POST", "/%73lots/0?action=erase"},
		{"POST", "/slots%252F0?action=erase"},
		{"POST", "/slots/0/?action=erase"},
		{"POST", "/slots/0?action=erase&action=save"},
		{"POST", "/slots/0?ACTION=erase"},
		{"POST", "/slots/0"},
		{"HEAD", "/slots"},
		{"OPTIONS", "/slots/0?action=erase"},
		{"POST", "http://onebitd/slots/0?action=erase"}, // absolute form
	}
	for _, c := range cases {
		req := c.method + " " + c.target + " HTTP/1.1\r\nHost: onebitd\r\nContent-Type: application/json\r\n" +
			"Content-Length: " + itoa(len(body)) + "\r\nConnection: close\r\n\r\n" + body
		res := raw(t, f.url, req, 5*time.Second)
		if res.err != nil || res.status != 403 {
			t.Errorf("%s %s: %d %v %s", c.method, c.target, res.status, res.err, res.body)
			continue
		}
		if c.method != "HEAD" {
			msg := errorShape(t, res.body, 403, typePermission)
			if !strings.Contains(msg, "--expose-slots-api") {
				t.Errorf("%s %s: the message should name the opt-in flag: %q", c.method, c.target, msg)
			}
		}
	}
	if got := slotsReached(rec); len(got) != 0 {
		t.Fatalf("the decoder's /slots tree was reached: %+v", got)
	}
	if n := len(f.mem.Events()); n != 0 {
		t.Fatalf("refused requests made %d events", n)
	}
}

// TestSlotsAPIExposed: an operator who opts in gets the decoder's /slots
// tree verbatim.
func TestSlotsAPIExposed(t *testing.T) {
	rec := &recorder{}
	dec, _ := simWrap(t, nil, rec.wrap)
	f := newFront(t, dec.URL, func(c *Config) { c.ExposeSlotsAPI = true })
	res := raw(t, f.url, "GET /slots HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 5*time.Second)
	var list []map[string]any
	if res.status != 200 || json.Unmarshal(res.body, &list) != nil || len(list) != 1 {
		t.Fatalf("GET /slots exposed: %d %v %s", res.status, res.err, res.body)
	}
	res = raw(t, f.url, "POST /slots/0?action=erase HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", 5*time.Second)
	if res.status != 200 || len(slotsReached(rec)) != 2 {
		t.Fatalf("erase exposed: %d %v %s; decoder saw %+v", res.status, res.err, res.body, rec.all())
	}
}

// TestPathForwardedAsChecked: a path with escapes is forwarded decoded and
// cleaned, so that what onebitd checked and routed is what the decoder
// routes: an escaped completion path gets the completion handler (slot,
// route header, events), not the verbatim proxy.
func TestPathForwardedAsChecked(t *testing.T) {
	rec := &recorder{}
	dec, _ := simWrap(t, nil, rec.wrap)
	f := newFront(t, dec.URL, nil)
	body := `{"prompt":" the cache","n_predict":2,"id_slot":7}`
	res := raw(t, f.url, "POST /v1%2Fcompletions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+
		itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body, 5*time.Second)
	if res.status != 200 || res.header.Get(HeaderRoute) != "plain" {
		t.Fatalf("escaped completion path: %d %v %s", res.status, res.header, res.body)
	}
	for _, r := range rec.all() {
		if r.RawPath != "" || strings.Contains(r.Path, "%") {
			t.Fatalf("the decoder got an escaped path: %+v", r)
		}
	}
	res = raw(t, f.url, "GET //props HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 5*time.Second)
	if res.status != 200 {
		t.Fatalf("GET //props: %d %s", res.status, res.body)
	}
}
