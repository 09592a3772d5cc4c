package dashboard

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/machine"
)

// Errors.
var (
	// ErrTooManyClients: the hub already streams to Config.MaxClients pages.
	ErrTooManyClients = errors.New("dashboard: too many live clients")
	// ErrClosed: the hub was closed.
	ErrClosed = errors.New("dashboard: hub closed")
)

// Defaults of Config.
const (
	DefaultMaxRequests   = 500
	DefaultClientBuffer  = 1024
	DefaultHistory       = 4096
	DefaultMaxClients    = 64
	DefaultStatsInterval = 500 * time.Millisecond
	DefaultHeartbeat     = 15 * time.Second

	maxEventsPerRequest = 32  // a request has at most 7 transitions
	maxLifecycle        = 200 // decoder/provider/eventlog events kept
	maxPoints           = 500 // chart points kept
	maxReasons          = 64  // distinct (step, reason) pairs counted; then "(other reasons)"
	maxReasonLen        = 300
	otherReasons        = "(other reasons)"
)

// Config bounds a Hub. Zero fields take the defaults.
type Config struct {
	MaxRequests   int           // requests kept (rows and timelines)
	ClientBuffer  int           // frames queued per SSE client before it is resynced
	History       int           // ev frames kept for Last-Event-ID resume
	MaxClients    int           // concurrent /api/events streams
	StatsInterval time.Duration // stats frame period (while something changed)
	Heartbeat     time.Duration // SSE comment period, keeps proxies from closing the stream
	Logger        *slog.Logger  // nil: discard
	// CheckKey, if set, guards /api/*: a request passes with a session
	// cookie from POST /api/session, or with a key CheckKey accepts in
	// "Authorization: Bearer KEY" or "X-Api-Key: KEY" (scripts). The page
	// itself (/ui/, no data) stays open and asks for the key. nil: open.
	CheckKey func(key string) bool
}

func (c Config) withDefaults() Config {
	if c.MaxRequests <= 0 {
		c.MaxRequests = DefaultMaxRequests
	}
	if c.ClientBuffer <= 0 {
		c.ClientBuffer = DefaultClientBuffer
	}
	if c.History <= 0 {
		c.History = DefaultHistory
	}
	if c.MaxClients <= 0 {
		c.MaxClients = DefaultMaxClients
	}
	if c.StatsInterval <= 0 {
		c.StatsInterval = DefaultStatsInterval
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

type reqKey struct{ node, boot, id string }

// request is what the hub keeps of one request.
type request struct {
	key     reqKey
	slot    int
	route   string
	state   string
	elapsed int64
	events  []json.RawMessage
}

// frame is one encoded SSE ev frame.
type frame struct {
	seq uint64
	b   []byte
}

type nodeStats struct {
	Events   uint64    `json:"events"`
	Gaps     uint64    `json:"gaps"` // events missing between seqs of one boot
	Boots    int       `json:"boots"`
	Last     time.Time `json:"last"` // time of the last event
	Decoder  string    `json:"decoder,omitempty"`
	Provider string    `json:"provider,omitempty"`
	LogLost  uint64    `json:"eventlog_lost"` // events the node's event log could not keep (its running total)

	lastBoot string
	lastSeq  uint64
}

type reasonKey struct{ Step, Reason string }

// Stats is the body of a stats frame.
type Stats struct {
	Routes    map[string]map[string]uint64 `json:"routes"` // route → outcome (done, failed, in_flight) → requests
	Fallbacks []ReasonCount                `json:"fallbacks"`
	Nodes     map[string]*nodeStats        `json:"nodes"`
	Evicted   uint64                       `json:"evicted"`      // requests the hub no longer holds
	NATSDrops uint64                       `json:"nats_dropped"` // messages nats.go dropped (slow consumer)
	Bad       uint64                       `json:"bad_payloads"` // messages that were not events
	Client    ClientStats                  `json:"client"`
}

// ReasonCount is one fallback reason's count.
type ReasonCount struct {
	Step   string `json:"step"`
	Reason string `json:"reason"`
	Count  uint64 `json:"count"`
}

// ClientStats is one SSE client's own losses.
type ClientStats struct {
	Dropped uint64 `json:"dropped"` // frames it could not take in time
	Resyncs uint64 `json:"resyncs"` // snapshots sent after a drop
}

// Hub keeps the recent requests and fans events out to SSE clients. It is an
// event.Sink, safe for concurrent use.
type Hub struct {
	cfg   Config
	epoch string

	mu       sync.Mutex
	closed   bool
	done     chan struct{}
	seq      uint64
	hist     []frame // ring of the last cfg.History frames
	histHead int     // index of the oldest frame when full
	reqs     map[reqKey]*request
	order    []reqKey // first-seen order, ring of cfg.MaxRequests
	lifecyc  [][]byte
	points   [][]byte
	routes   map[string]map[string]uint64
	reasons  map[reasonKey]uint64
	nodes    map[string]*nodeStats
	evicted  uint64
	bad      uint64
	version  uint64 // bumped by every change that a stats frame shows
	clients  map[*client]struct{}
	natsDrop func() uint64
	sessions map[string]time.Time // session token → expiry
}

var _ event.Sink = (*Hub)(nil)

// NewHub returns an empty hub.
func NewHub(cfg Config) *Hub {
	cfg = cfg.withDefaults()
	return &Hub{
		cfg:      cfg,
		epoch:    event.NewBoot()[:8],
		done:     make(chan struct{}),
		reqs:     make(map[reqKey]*request),
		routes:   make(map[string]map[string]uint64),
		reasons:  make(map[reasonKey]uint64),
		nodes:    make(map[string]*nodeStats),
		clients:  make(map[*client]struct{}),
		sessions: make(map[string]time.Time),
	}
}

// Close ends every SSE stream (so an http.Server can shut down) and makes
// later streams fail. Events are still taken.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		close(h.done)
	}
}

// Emit takes one event of this process (event.Sink).
func (h *Hub) Emit(e *event.Event) {
	h.add(e, e.AppendJSON(make([]byte, 0, 384)))
}

// EmitJSON takes one event as it came off the wire: it is parsed, and
// stored and forwarded as these bytes. A payload that is not an event is
// counted (bad_payloads) and returns the parse error.
func (h *Hub) EmitJSON(data []byte) error {
	e, err := event.Parse(data)
	if err != nil {
		h.mu.Lock()
		h.bad++
		h.version++
		h.mu.Unlock()
		return err
	}
	if bytes.ContainsAny(data, "\r\n") {
		data = e.AppendJSON(nil) // an SSE data line cannot hold a newline
	} else {
		data = bytes.Clone(data)
	}
	h.add(&e, data)
	return nil
}

func (h *Hub) add(e *event.Event, raw []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.version++
	h.noteNode(e)
	if e.RequestID == "" {
		h.lifecyc = pushCapped(h.lifecyc, raw, maxLifecycle)
	} else {
		h.noteRequest(e, raw)
	}
	h.seq++
	f := frame{seq: h.seq, b: encodeFrame(h.epoch, h.seq, "ev", raw)}
	if len(h.hist) < h.cfg.History {
		h.hist = append(h.hist, f)
	} else {
		h.hist[h.histHead] = f
		h.histHead = (h.histHead + 1) % len(h.hist)
	}
	for c := range h.clients {
		c.push(f.b)
	}
}

func pushCapped(s [][]byte, b []byte, n int) [][]byte {
	if len(s) >= n {
		copy(s, s[1:])
		s = s[:len(s)-1]
	}
	return append(s, b)
}

func (h *Hub) noteNode(e *event.Event) {
	ns := h.nodes[e.Node]
	if ns == nil {
		if len(h.nodes) >= 1024 {
			return // a bounded table even if names are garbage
		}
		ns = &nodeStats{}
		h.nodes[e.Node] = ns
	}
	ns.Events++
	ns.Last = e.Time
	if e.Boot != ns.lastBoot {
		ns.Boots++
		ns.lastBoot = e.Boot
	} else if e.Seq > ns.lastSeq+1 {
		ns.Gaps += e.Seq - ns.lastSeq - 1
	}
	ns.lastSeq = e.Seq
	if kind, what, ok := strings.Cut(e.Event, "."); ok && e.RequestID == "" {
		switch kind {
		case "decoder":
			ns.Decoder = what
		case "provider":
			ns.Provider = what
		}
	}
}

func (h *Hub) noteRequest(e *event.Event, raw []byte) {
	k := reqKey{e.Node, e.Boot, e.RequestID}
	r := h.reqs[k]
	if r == nil {
		r = &request{key: k, slot: e.Slot}
		h.evictFor()
		h.reqs[k] = r
		h.order = append(h.order, k)
		h.count(e.Route, "in_flight", 1)
	}
	if len(r.events) < maxEventsPerRequest {
		r.events = append(r.events, raw)
	}
	prevRoute := r.route
	r.route, r.state, r.elapsed = e.Route, e.To, e.ElapsedUS
	if prevRoute != "" && prevRoute != e.Route && !machine.Terminal(machine.State(e.To)) {
		h.count(prevRoute, "in_flight", -1)
		h.count(e.Route, "in_flight", 1)
	}
	if machine.Terminal(machine.State(e.To)) {
		if prevRoute == "" {
			prevRoute = e.Route
		}
		h.count(prevRoute, "in_flight", -1)
		h.count(e.Route, e.To, 1)
	}
	if e.To == string(machine.Fallback) {
		reason := e.Reason
		if len(reason) > maxReasonLen {
			reason = reason[:maxReasonLen] + "…"
		}
		rk := reasonKey{e.Step, reason}
		if _, ok := h.reasons[rk]; !ok && len(h.reasons) >= maxReasons {
			rk = reasonKey{"", otherReasons}
		}
		h.reasons[rk]++
	}
	if machine.LeavesHandoff(machine.State(e.To)) && e.NTokens > 0 {
		p := []byte("[")
		p = strconv.AppendInt(p, int64(e.NTokens), 10)
		p = append(p, ',')
		p = strconv.AppendInt(p, e.ElapsedUS, 10)
		p = append(p, ',')
		p = appendJSONString(p, e.Route)
		p = append(p, ',')
		p = appendJSONString(p, e.Node)
		p = append(p, ']')
		h.points = pushCapped(h.points, p, maxPoints)
	}
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s)
	return append(b, q...)
}

// count moves a request's count; in_flight never goes below zero (a
// request first seen mid-way, or evicted).
func (h *Hub) count(route, outcome string, d int) {
	if route == "" {
		route = "-"
	}
	m := h.routes[route]
	if m == nil {
		if len(h.routes) >= 16 {
			route = "other"
			if m = h.routes[route]; m == nil {
				m = make(map[string]uint64)
				h.routes[route] = m
			}
		} else {
			m = make(map[string]uint64)
			h.routes[route] = m
		}
	}
	if d < 0 {
		if m[outcome] > 0 {
			m[outcome]--
		}
		return
	}
	m[outcome]++
}

// evictFor makes room for one request: the oldest one goes (it stays in the
// counts; an in-flight one leaves in_flight for "evicted").
func (h *Hub) evictFor() {
	if len(h.reqs) < h.cfg.MaxRequests {
		return
	}
	for len(h.order) > 0 && len(h.reqs) >= h.cfg.MaxRequests {
		k := h.order[0]
		h.order = h.order[1:]
		r := h.reqs[k]
		if r == nil {
			continue
		}
		delete(h.reqs, k)
		h.evicted++
		if !machine.Terminal(machine.State(r.state)) {
			h.count(r.route, "in_flight", -1)
		}
	}
	if cap(h.order) > 4*h.cfg.MaxRequests {
		h.order = append([]reqKey(nil), h.order...)
	}
}

func encodeFrame(epoch string, seq uint64, kind string, data []byte) []byte {
	b := make([]byte, 0, len(data)+48)
	if seq != 0 {
		b = append(b, "id: "...)
		b = append(b, epoch...)
		b = append(b, '-')
		b = strconv.AppendUint(b, seq, 10)
		b = append(b, '\n')
	}
	b = append(b, "event: "...)
	b = append(b, kind...)
	b = append(b, "\ndata: "...)
	b = append(b, data...)
	return append(b, '\n', '\n')
}

// statsLocked builds a stats body for c (nil: no client part).
func (h *Hub) statsLocked(c *client) Stats {
	s := Stats{Routes: h.routes, Nodes: h.nodes, Evicted: h.evicted, Bad: h.bad}
	if h.natsDrop != nil {
		s.NATSDrops = h.natsDrop()
	}
	for k, n := range h.reasons {
		s.Fallbacks = append(s.Fallbacks, ReasonCount{Step: k.Step, Reason: k.Reason, Count: n})
	}
	if c != nil {
		s.Client = ClientStats{Dropped: c.dropped, Resyncs: c.resyncs}
	}
	return s
}

type snapshot struct {
	Epoch     string              `json:"epoch"`
	Seq       uint64              `json:"seq"`
	Requests  [][]json.RawMessage `json:"requests"`
	Lifecycle []json.RawMessage   `json:"lifecycle"`
	Points    []json.RawMessage   `json:"points"`
	Stats     Stats               `json:"stats"`
}

// snapshotLocked encodes the hub's state as a snapshot frame.
func (h *Hub) snapshotLocked(c *client) []byte {
	s := snapshot{Epoch: h.epoch, Seq: h.seq, Requests: make([][]json.RawMessage, 0, len(h.reqs)),
		Lifecycle: rawList(h.lifecyc), Points: rawList(h.points), Stats: h.statsLocked(c)}
	for _, k := range h.order {
		if r := h.reqs[k]; r != nil {
			s.Requests = append(s.Requests, r.events)
		}
	}
	b, err := json.Marshal(s)
	if err != nil {
		h.cfg.Logger.Error("dashboard snapshot", "error", err)
		b = []byte(`{}`)
	}
	return encodeFrame(h.epoch, h.seq, "snapshot", b)
}

func rawList(s [][]byte) []json.RawMessage {
	out := make([]json.RawMessage, len(s))
	for i, b := range s {
		out[i] = b
	}
	return out
}

// framesSince returns the ev frames after seq, or false if the hub no
// longer holds them all.
func (h *Hub) framesSinceLocked(seq uint64) ([][]byte, bool) {
	if seq > h.seq {
		return nil, false
	}
	if seq == h.seq {
		return nil, true
	}
	n := len(h.hist)
	oldest := h.hist[h.histHead%n].seq
	if seq+1 < oldest {
		return nil, false
	}
	out := make([][]byte, 0, h.seq-seq)
	for i := 0; i < n; i++ {
		f := h.hist[(h.histHead+i)%n]
		if f.seq > seq {
			out = append(out, f.b)
		}
	}
	return out, true
}

// NoteEventlogLoss records that node's event log has lost total events
// since it opened (eventlog.Loss.Total; the daemon publishes it on
// onebit.<node>.eventlog.lost). The in-process hub of `onebitd serve` can be
// told the same from the event log's loss callback.
func (h *Hub) NoteEventlogLoss(node string, total uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ns := h.nodes[node]
	if ns == nil {
		if len(h.nodes) >= 1024 {
			return
		}
		ns = &nodeStats{}
		h.nodes[node] = ns
	}
	if total > ns.LogLost {
		ns.LogLost = total
		h.version++
	}
}

// Timeline is one request's events on one node and boot.
type Timeline struct {
	Node      string            `json:"node"`
	Boot      string            `json:"boot"`
	Slot      int               `json:"slot"`
	Route     string            `json:"route"`
	Outcome   string            `json:"outcome"` // done, failed, or "in flight (<state>)"
	ElapsedUS int64             `json:"elapsed_us"`
	Events    []json.RawMessage `json:"events"`
}

// Timelines returns the timelines of every request with this id the hub
// still holds, oldest first.
func (h *Hub) Timelines(id string) []Timeline {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Timeline
	for _, k := range h.order {
		if k.id != id {
			continue
		}
		r := h.reqs[k]
		if r == nil {
			continue
		}
		outcome := r.state
		if !machine.Terminal(machine.State(r.state)) {
			outcome = "in flight (" + r.state + ")"
		}
		out = append(out, Timeline{Node: k.node, Boot: k.boot, Slot: r.slot, Route: r.route, Outcome: outcome,
			ElapsedUS: r.elapsed, Events: append([]json.RawMessage(nil), r.events...)})
	}
	return out
}

// Memory is what the hub holds, for tests and /debug: requests, history
// frames, and frames queued for clients.
func (h *Hub) Memory() (requests, history, queued int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.clients {
		queued += len(c.ch)
	}
	return len(h.reqs), len(h.hist), queued
}
