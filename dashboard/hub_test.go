package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
	"github.com/onebitd/onebitd/internal/obtest"
)

// logEvents reads testdata/events.jsonl (a copy of
// cmd/onebitd/testdata/replay/events.jsonl).
func logEvents(t testing.TB) [][]byte {
	t.Helper()
	b, err := os.ReadFile("testdata/events.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		out = append(out, []byte(l))
	}
	return out
}

// sseFrame is one parsed SSE frame.
type sseFrame struct{ id, kind, data string }

// sseStream reads frames from a live /api/events response.
type sseStream struct {
	resp   *http.Response
	frames chan sseFrame
}

func openSSE(t *testing.T, url, lastID string) *sseStream {
	t.Helper()
	req, err := http.NewRequest("GET", url+"/api/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		resp.Body.Close()
		t.Fatalf("/api/events: %s", resp.Status)
	}
	s := &sseStream{resp: resp, frames: make(chan sseFrame, 1<<16)}
	go func() {
		defer close(s.frames)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		var f sseFrame
		for sc.Scan() {
			l := sc.Text()
			switch {
			case l == "":
				if f.kind != "" {
					s.frames <- f
				}
				f = sseFrame{}
			case strings.HasPrefix(l, "id: "):
				f.id = l[4:]
			case strings.HasPrefix(l, "event: "):
				f.kind = l[7:]
			case strings.HasPrefix(l, "data: "):
				f.data = l[6:]
			}
		}
	}()
	t.Cleanup(func() { resp.Body.Close() })
	return s
}

// next returns the next frame of kind (others skipped).
func (s *sseStream) next(t *testing.T, kind string) sseFrame {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case f, ok := <-s.frames:
			if !ok {
				t.Fatalf("stream ended waiting for %s", kind)
			}
			if f.kind == kind {
				return f
			}
		case <-timeout:
			t.Fatalf("no %s frame in 10s", kind)
		}
	}
}

func TestSnapshotThenDeltasThenResume(t *testing.T) {
	h := NewHub(Config{StatsInterval: 20 * time.Millisecond})
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	defer h.Close() // ends the streams, then srv.Close can return
	lines := logEvents(t)
	for _, l := range lines[:10] {
		if err := h.EmitJSON(l); err != nil {
			t.Fatal(err)
		}
	}
	s := openSSE(t, srv.URL, "")
	f := s.next(t, "snapshot")
	var snap snapshot
	if err := json.Unmarshal([]byte(f.data), &snap); err != nil {
		t.Fatal(err)
	}
	if snap.Seq != 10 || len(snap.Requests) != 2 || len(snap.Lifecycle) != 2 {
		t.Fatalf("snapshot seq %d, %d requests, %d lifecycle; want 10, 2, 2", snap.Seq, len(snap.Requests), len(snap.Lifecycle))
	}
	if got := snap.Stats.Routes["shared"]["done"]; got != 1 {
		t.Errorf("snapshot counts shared/done = %d", got)
	}
	for _, l := range lines[10:20] {
		if err := h.EmitJSON(l); err != nil {
			t.Fatal(err)
		}
	}
	var last sseFrame
	for i := 10; i < 20; i++ {
		last = s.next(t, "ev")
		if last.data != string(lines[i]) {
			t.Fatalf("ev %d = %s, want the published bytes %s", i, last.data, lines[i])
		}
	}
	if want := h.epoch + "-20"; last.id != want {
		t.Fatalf("last id %q, want %q", last.id, want)
	}
	st := s.next(t, "stats")
	if !strings.Contains(st.data, `"reason":"the decoder refused the adopt`) {
		t.Errorf("stats lack the fallback reason: %s", st.data)
	}
	s.resp.Body.Close()

	// Resume: the frames after id 15, not a snapshot.
	for _, l := range lines[20:] {
		if err := h.EmitJSON(l); err != nil {
			t.Fatal(err)
		}
	}
	r := openSSE(t, srv.URL, h.epoch+"-15")
	for i := 15; i < len(lines); i++ {
		f := <-r.frames
		for f.kind == "stats" {
			f = <-r.frames
		}
		if f.kind != "ev" || f.data != string(lines[i]) {
			t.Fatalf("resumed frame %d: %s %s", i, f.kind, f.data)
		}
	}
	// Another epoch, or an id the hub no longer holds: a snapshot.
	for _, id := range []string{"deadbeef-3", "garbage", h.epoch + "-999"} {
		o := openSSE(t, srv.URL, id)
		if f := <-o.frames; f.kind != "snapshot" {
			t.Errorf("Last-Event-ID %q: first frame %s, want snapshot", id, f.kind)
		}
	}
}

// TestSlowClientIsResynced: a client that takes nothing has a queue of
// ClientBuffer frames; beyond it the hub counts drops and owes it a
// snapshot, and memory stays bounded.
func TestSlowClientIsResynced(t *testing.T) {
	h := NewHub(Config{ClientBuffer: 8, History: 64, MaxRequests: 50, StatsInterval: 10 * time.Millisecond})
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	defer h.Close() // ends the streams, then srv.Close can return
	// A raw connection that reads nothing after the headers.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	e := event.Event{Node: "n", Boot: "b", Route: "shared", Event: "listen", From: "received", To: "listening",
		Reason: strings.Repeat("x", 1000)}
	for i := range 20000 {
		e.RequestID = fmt.Sprintf("r%d", i)
		e.Seq = uint64(i + 1)
		h.Emit(&e)
	}
	reqs, hist, queued := h.Memory()
	if reqs > 50 || hist > 64 || queued > 8 {
		t.Fatalf("hub holds %d requests, %d history frames, %d queued; want ≤ 50, 64, 8", reqs, hist, queued)
	}
	h.mu.Lock()
	var dropped uint64
	for c := range h.clients {
		dropped += c.dropped
	}
	evicted := h.evicted
	inflight := h.routes["shared"]["in_flight"]
	h.mu.Unlock()
	if dropped == 0 {
		t.Fatal("a client that read nothing dropped nothing")
	}
	if evicted != 20000-50 || inflight != 50 {
		t.Errorf("evicted %d, in flight %d; want %d, 50", evicted, inflight, 20000-50)
	}
	// Now read: a snapshot arrives whose stats count the drops.
	br := bufio.NewReader(resp.Body)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if l == "event: snapshot\n" {
			d, _ := br.ReadString('\n')
			var snap snapshot
			if err := json.Unmarshal([]byte(strings.TrimPrefix(d, "data: ")), &snap); err != nil {
				t.Fatal(err)
			}
			if snap.Stats.Client.Resyncs >= 1 && snap.Stats.Client.Dropped > 0 {
				return
			}
		}
	}
	t.Fatal("no resync snapshot reporting the drops")
}

func TestRequestTimeline(t *testing.T) {
	h := NewHub(Config{})
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	defer h.Close() // ends the streams, then srv.Close can return
	for _, l := range logEvents(t) {
		if err := h.EmitJSON(l); err != nil {
			t.Fatal(err)
		}
	}
	get := func(id string) (int, string) {
		resp, err := http.Get(srv.URL + "/api/requests/" + id)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("req-adopt-refused")
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var out struct {
		Timelines []struct {
			Node, Route, Outcome string
			ElapsedUS            int64 `json:"elapsed_us"`
			Events               []event.Event
		}
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Timelines) != 1 || len(out.Timelines[0].Events) != 6 || out.Timelines[0].Outcome != "done" ||
		out.Timelines[0].Route != "fallback" || out.Timelines[0].ElapsedUS != 7500 {
		t.Fatalf("timeline %+v", out.Timelines)
	}
	if e := out.Timelines[0].Events[3]; e.Step != "adopt" || e.HTTPStatus != 409 {
		t.Errorf("fallback event %+v", e)
	}
	code, body = get("req-interrupted")
	if code != 200 || !strings.Contains(body, `"outcome":"in flight (prefilled)"`) {
		t.Errorf("in-flight request: %d %s", code, body)
	}
	if code, body = get("nope"); code != 404 || !strings.Contains(body, "onebitd replay --request nope") {
		t.Errorf("unknown request: %d %s", code, body)
	}
}

func TestBadPayloadCounted(t *testing.T) {
	h := NewHub(Config{})
	for _, bad := range []string{"", "junk", `{"v":99}`} {
		if err := h.EmitJSON([]byte(bad)); err == nil {
			t.Errorf("EmitJSON(%q) took it", bad)
		}
	}
	// Pretty JSON is re-encoded: an SSE data line holds no newline.
	pretty := "{\n\"v\":1,\"node\":\"n\",\"boot\":\"b\",\"seq\":1,\"request_id\":\"r\",\"route\":\"plain\",\"event\":\"forward\",\"from\":\"received\",\"to\":\"forwarding\"}"
	if err := h.EmitJSON([]byte(pretty)); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bad != 3 {
		t.Errorf("bad = %d", h.bad)
	}
	if f := h.hist[0].b; strings.Count(string(f), "\n") != 4 {
		t.Errorf("frame %q has a newline in its data", f)
	}
}

func FuzzEmitJSON(f *testing.F) {
	for _, l := range logEvents(f) {
		f.Add(l)
	}
	f.Add([]byte("{\"v\":1,\"node\":\"a\\nb\",\"request_id\":\"\\u2028\"}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h := NewHub(Config{MaxRequests: 4, History: 4})
		if h.EmitJSON(data) != nil {
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		fr := string(h.hist[0].b)
		if !strings.HasSuffix(fr, "\n\n") || strings.Count(fr, "\n") != 4 || strings.Contains(fr, "\r") {
			t.Fatalf("frame %q is not one id, event and data line", fr)
		}
		if _, err := json.Marshal(h.statsLocked(nil)); err != nil {
			t.Fatal(err)
		}
		_ = h.snapshotLocked(nil)
	})
}

// BenchmarkHubEmit is one event into a hub with two live clients (the cost
// `onebitd serve` pays per transition with the dashboard on).
func BenchmarkHubEmit(b *testing.B) {
	h := NewHub(Config{ClientBuffer: 1 << 20})
	for range 2 {
		h.clients[&client{ch: make(chan []byte, 1<<20), kick: make(chan struct{}, 1)}] = struct{}{}
	}
	e := event.Event{Node: "n", Boot: "b", Route: "shared", Event: "adopt", From: "prefilled", To: "adopted", ElapsedUS: 4500, NTokens: 512}
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%016x", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		e.RequestID = ids[i%len(ids)]
		i++
		h.Emit(&e)
		if i%(1<<19) == 0 {
			for c := range h.clients {
				for len(c.ch) > 0 {
					<-c.ch
				}
			}
		}
	}
}

func FuzzLastEventID(f *testing.F) {
	f.Add("abc-1")
	f.Add("-")
	f.Add("x-18446744073709551615")
	f.Fuzz(func(t *testing.T, id string) {
		h := NewHub(Config{History: 4})
		for _, l := range logEvents(t)[:6] {
			if err := h.EmitJSON(l); err != nil {
				t.Fatal(err)
			}
		}
		epoch, seq, ok := parseLastEventID(id)
		if !ok {
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		frames, resumed := h.framesSinceLocked(seq)
		if resumed && uint64(len(frames)) != h.seq-seq {
			t.Fatalf("resume after %d of %d: %d frames", seq, h.seq, len(frames))
		}
		_ = epoch
	})
}

// TestSubscribeEventlogLost: the daemon publishes eventlog.Loss (not an
// event) on onebit.<node>.eventlog.lost; the hub counts it for the node
// instead of calling it a bad payload.
func TestSubscribeEventlogLost(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	h := NewHub(Config{})
	defer h.Close()
	if _, err := h.Subscribe(nc, ""); err != nil {
		t.Fatal(err)
	}
	for _, l := range logEvents(t)[:3] {
		if err := nc.Publish("onebit.node-a.handoff.x", l); err != nil {
			t.Fatal(err)
		}
	}
	loss, _ := json.Marshal(eventlog.Loss{Node: "node-a", Boot: "b", Events: 3, FirstSeq: 4, LastSeq: 6, Total: 7, Error: "no space left on device"})
	if err := nc.Publish("onebit.node-a.eventlog.lost", loss); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("onebit.node-a.eventlog.lost", []byte("junk")); err != nil {
		t.Fatal(err)
	}
	obtest.WaitFor(t, 5*time.Second, "the loss counted", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		ns := h.nodes["node-a"]
		return ns != nil && ns.Events == 3 && ns.LogLost == 7 && h.bad == 1
	})
}

// TestCounts: the replay log's requests per route and outcome (a request
// that falls back moves from its route's in_flight to fallback), and its
// fallback reasons with their steps.
func TestCounts(t *testing.T) {
	h := NewHub(Config{})
	for _, l := range logEvents(t) {
		if err := h.EmitJSON(l); err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	want := map[string]map[string]uint64{
		"shared":   {"done": 1, "failed": 1, "in_flight": 0},
		"file":     {"done": 1, "in_flight": 1},
		"fallback": {"done": 2, "in_flight": 0},
		"plain":    {"done": 1, "in_flight": 0},
	}
	for route, outs := range want {
		for o, n := range outs {
			if got := h.routes[route][o]; got != n {
				t.Errorf("%s/%s = %d, want %d", route, o, got, n)
			}
		}
	}
	if len(h.routes) != len(want) {
		t.Errorf("routes %v", h.routes)
	}
	if n := h.reasons[reasonKey{"adopt", "the decoder refused the adopt: 409 share id 2 is not the slot's last share"}]; n != 1 {
		t.Errorf("adopt reason counted %d times: %v", n, h.reasons)
	}
	if n := h.reasons[reasonKey{"provider", "provider exited with status 3: model file not found"}]; n != 1 {
		t.Errorf("provider reason counted %d times: %v", n, h.reasons)
	}
	ns := h.nodes["node-a"]
	if ns.Boots != 2 || ns.Gaps != 0 || ns.Decoder != "ready" || ns.Events != 33 {
		t.Errorf("node-a %+v", ns)
	}
}
