package benchharness

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/handoff"
	"github.com/onebitd/onebitd/provider"
)

// Operations the in-process onebitd's outside calls are filed under.
const (
	opTokenize   = "tokenize"
	opShare      = "share"
	opAdopt      = "adopt"
	opRestore    = "restore"
	opCompletion = "completion"
	opProvider   = "provider"
	// opPrefillReported carries a warm provider's own prefill_ms (in
	// call.reported) of the job in flight.
	opPrefillReported = "prefill reported"
	opOther           = "other"
)

// call is one timed outside call: an HTTP round trip to the decoder
// (request written to the reply's last byte read) or a provider run (exec
// to exit), with the decoder's own reported time for slot actions.
type call struct {
	op       string
	d        time.Duration
	reported time.Duration // timings.{share,adopt,restore}_ms of the reply; 0 if none
}

// callLog collects the calls of the request in flight (section a sends one
// request at a time, so every call belongs to it).
type callLog struct {
	mu    sync.Mutex
	calls []call
}

func (l *callLog) add(c call) {
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

// take returns the calls so far and starts a new list.
func (l *callLog) take() []call {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.calls
	l.calls = nil
	return c
}

// sum is the total duration of the calls with op (and their reported time).
func sum(cs []call, op string) (d, reported time.Duration) {
	for _, c := range cs {
		if c.op == op {
			d += c.d
			reported += c.reported
		}
	}
	return d, reported
}

// timedTransport times every round trip to the decoder up to the last byte
// of the reply.
type timedTransport struct {
	base http.RoundTripper
	log  *callLog
}

func opOf(r *http.Request) string {
	switch p := r.URL.Path; {
	case p == "/tokenize":
		return opTokenize
	case strings.HasPrefix(p, "/slots/"):
		switch a := r.URL.Query().Get("action"); a {
		case opShare, opAdopt, opRestore:
			return a
		}
	case strings.Contains(p, "completion"):
		return opCompletion
	}
	return opOther
}

func (t *timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	op := opOf(r)
	start := time.Now()
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		t.log.add(call{op: op, d: time.Since(start)})
		return nil, err
	}
	resp.Body = &timedBody{rc: resp.Body, op: op, start: start, log: t.log, keep: op == opShare || op == opAdopt || op == opRestore}
	return resp, nil
}

// timedBody records its call at EOF or Close, whichever comes first.
type timedBody struct {
	rc    io.ReadCloser
	op    string
	start time.Time
	log   *callLog
	keep  bool // keep the bytes to read the decoder's reported timings
	buf   []byte
	once  sync.Once
}

func (b *timedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if b.keep && len(b.buf) < 64<<10 {
		b.buf = append(b.buf, p[:n]...)
	}
	if err == io.EOF {
		b.finish()
	}
	return n, err
}

func (b *timedBody) Close() error {
	b.finish()
	return b.rc.Close()
}

func (b *timedBody) finish() {
	b.once.Do(func() {
		c := call{op: b.op, d: time.Since(b.start)}
		if b.keep {
			c.reported = reportedTime(b.buf)
		}
		b.log.add(c)
	})
}

// reportedTime reads timings.{share,adopt,restore}_ms of a slot action reply.
func reportedTime(body []byte) time.Duration {
	var r struct {
		Timings map[string]float64 `json:"timings"`
	}
	if json.Unmarshal(body, &r) != nil {
		return 0
	}
	var ms float64
	for _, v := range r.Timings {
		ms += v
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// timedProvider times every provider run (exec to exit, or a warm job).
type timedProvider struct {
	p   handoff.Provider
	log *callLog
}

var _ handoff.Provider = (*timedProvider)(nil)

func (p *timedProvider) Prefill(ctx context.Context, job *handoff.Job) (provider.Result, error) {
	t0 := time.Now()
	res, err := p.p.Prefill(ctx, job)
	p.log.add(call{op: opProvider, d: time.Since(t0)})
	return res, err
}

// reportedPrefill is the in-process warm provider's logger: it files the
// prefill_ms of each job's reply (the provider's own prefill time, DESIGN
// §2c), which provider.Warm logs with the job, as a call of the request in
// flight. provider.Result does not carry it.
type reportedPrefill struct{ log *callLog }

var _ slog.Handler = (*reportedPrefill)(nil)

func (h *reportedPrefill) Enabled(context.Context, slog.Level) bool { return true }

func (h *reportedPrefill) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "prefill_ms" || a.Value.Kind() != slog.KindFloat64 {
			return true
		}
		h.log.add(call{op: opPrefillReported, reported: time.Duration(a.Value.Float64() * float64(time.Millisecond))})
		return false
	})
	return nil
}

func (h *reportedPrefill) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *reportedPrefill) WithGroup(string) slog.Handler      { return h }

// eventsByRequest keeps a copy of every event, per request id.
type eventsByRequest struct {
	mu sync.Mutex
	m  map[string][]event.Event
}

func (s *eventsByRequest) Emit(e *event.Event) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string][]event.Event{}
	}
	s.m[e.RequestID] = append(s.m[e.RequestID], *e)
	s.mu.Unlock()
}

func (s *eventsByRequest) get(id string) []event.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[id]
}
