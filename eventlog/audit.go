package eventlog

import (
	"fmt"
	"slices"
	"strings"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/machine"
)

// Audit rules: the Rule of a Violation (doc.go explains each).
const (
	// RuleIllegalTransition: from→to by event is not in machine.Transitions,
	// or from is not the request's current state (a request starts in
	// received), or an event has no request id and is not a decoder
	// lifecycle event.
	RuleIllegalTransition = "illegal-transition"
	// RuleShareIDReused: an adopt used a share_id already adopted on the same
	// node, boot and decoder lifetime.
	RuleShareIDReused = "share-id-reused"
	// RuleShareIDMismatch: an adopt has no share_id, or not the one its
	// request's share event received.
	RuleShareIDMismatch = "share-id-mismatch"
	// RuleMissingCleanup: the event that leaves the handoff (to adopted,
	// restored or fallback) lacks cleanup, closed fewer fds than the request
	// received, or (adopted, restored) removed no file.
	RuleMissingCleanup = "missing-cleanup"
	// RuleFallbackReasons: a fallback event without a reason, or a reason on
	// an event other than fallback and fail.
	RuleFallbackReasons = "fallback-reasons"
	// RuleSeqGap: within one node and boot, seq did not grow by exactly one.
	RuleSeqGap = "seq-gap"
)

// Decoder lifecycle events (no request fields). A starting or exited decoder
// begins a new share_id lifetime.
const (
	DecoderStarting = "decoder.starting"
	DecoderReady    = "decoder.ready"
	DecoderExited   = "decoder.exited"
)

// Violation is one broken rule.
type Violation struct {
	RequestID string `json:"request_id,omitempty"`
	Rule      string `json:"rule"`
	Detail    string `json:"detail"`
	Source    string `json:"source,omitempty"` // the file (or stream) of Line
	Line      int    `json:"line"`
}

// String is "request r-1: share-id-reused at events.jsonl:12: detail".
func (v Violation) String() string {
	var b strings.Builder
	if v.RequestID != "" {
		fmt.Fprintf(&b, "request %s: ", v.RequestID)
	}
	b.WriteString(v.Rule)
	if v.Source != "" {
		fmt.Fprintf(&b, " at %s:%d", v.Source, v.Line)
	} else {
		fmt.Fprintf(&b, " at line %d", v.Line)
	}
	b.WriteString(": ")
	b.WriteString(v.Detail)
	return b.String()
}

// Report is the outcome of an audit.
type Report struct {
	Events     int         `json:"events"`
	Boots      int         `json:"boots"`
	Requests   int         `json:"requests"`
	Done       int         `json:"done"`
	Failed     int         `json:"failed"`
	Fallbacks  int         `json:"fallbacks"`
	InFlight   []string    `json:"in_flight"` // request ids, in order of first event
	Violations []Violation `json:"violations"`
	// Timelines holds each request's events when Auditor.KeepTimelines is set.
	Timelines map[string][]event.Event `json:"timelines,omitempty"`
}

// OK reports whether the audit found no violation.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

type bootKey struct{ node, boot string }

// bootState is what the audit knows of one node's boot: requests and
// share ids live within a boot.
type bootState struct {
	lastSeq uint64
	decoder int                  // bumped by each decoder lifecycle start/exit: share_id lifetime
	reqs    map[string]*reqState // requests not ended yet
	ended   map[uint64]struct{}  // hashes (hashID) of the ended requests' ids
	adopted map[shareKey]uint64  // adopted share ids, 64 per bitmap word
}

// hashID is FNV-1a 64 of a request id. The set of ended requests holds
// hashes rather than strings: smaller, and no pointer to chase on lookup; a
// false "after the request ended" needs a 64-bit collision.
func hashID(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

type reqState struct {
	id        string
	order     int // first-seen order
	state     machine.State
	shareID   *int64 // from the share event
	nFDs      int    // fds the request received
	fallbacks int
	events    []event.Event
}

// shareKey is a word of the adopted-share-ids bitmap: ids 64*word to
// 64*word+63 of one decoder lifetime (share ids are small counters, so a
// lifetime's ids fill few words).
type shareKey struct {
	decoder int
	word    int64
}

// Auditor rebuilds each request's machine from events in log order and
// checks the rules. Requests are keyed by node, boot and request id, so
// request ids may repeat across nodes and restarts. Set the exported fields
// before the first Add. An Auditor is not safe for concurrent use.
type Auditor struct {
	// KeepTimelines fills Report.Timelines (memory grows with the log).
	KeepTimelines bool
	// Filter, if set, limits kept timelines and OnRequest to the requests
	// for which it returns true.
	Filter func(requestID string) bool
	// OnRequest, if set, receives each request's events when it ends (done
	// or failed) and, at Finish, those of requests still in flight. Memory
	// then grows with the requests in flight, not with the log. The slice
	// belongs to the callee.
	OnRequest func(requestID string, events []event.Event)

	sources  []string // sources[len-1] is the current one
	report   Report
	boots    map[bootKey]*bootState
	bootList []*bootState // in first-seen order
	lastBoot bootKey
	lastBS   *bootState
	order    int
	free     []*reqState // ended requests' states, for reuse
}

func (a *Auditor) newReq() *reqState {
	if n := len(a.free); n > 0 {
		r := a.free[n-1]
		a.free = a.free[:n-1]
		return r
	}
	return new(reqState)
}

// NewAuditor returns an empty Auditor.
func NewAuditor() *Auditor {
	return &Auditor{boots: make(map[bootKey]*bootState), sources: []string{""}}
}

// SetSource names the file (or stream) of the lines that follow; it labels
// violations.
func (a *Auditor) SetSource(name string) { a.sources = append(a.sources, name) }

func (a *Auditor) source() string { return a.sources[len(a.sources)-1] }

func (a *Auditor) violate(line int, id, rule, format string, args ...any) {
	a.report.Violations = append(a.report.Violations, Violation{
		RequestID: id, Rule: rule, Detail: fmt.Sprintf(format, args...), Source: a.source(), Line: line,
	})
}

// Add audits one event read at line of the current source.
func (a *Auditor) Add(line int, e event.Event) {
	a.report.Events++
	bs := a.boot(e.Node, e.Boot)
	if bs.lastSeq != 0 && e.Seq != bs.lastSeq+1 {
		if e.Seq > bs.lastSeq {
			a.violate(line, e.RequestID, RuleSeqGap, "boot %s seq %d follows %d: %d events missing",
				e.Boot, e.Seq, bs.lastSeq, e.Seq-bs.lastSeq-1)
		} else {
			a.violate(line, e.RequestID, RuleSeqGap, "boot %s seq %d follows %d: duplicated or out of order",
				e.Boot, e.Seq, bs.lastSeq)
		}
	}
	bs.lastSeq = e.Seq

	if e.RequestID == "" {
		switch e.Event {
		case DecoderStarting, DecoderExited:
			bs.decoder++
		case DecoderReady:
		default:
			a.violate(line, "", RuleIllegalTransition, "event %q has no request_id", e.Event)
		}
		return
	}

	r := bs.reqs[e.RequestID]
	if r == nil {
		if _, ok := bs.ended[hashID(e.RequestID)]; ok {
			a.violate(line, e.RequestID, RuleIllegalTransition, "%s after the request ended", e.Event)
			return
		}
		r = a.newReq()
		*r = reqState{id: e.RequestID, order: a.order, state: machine.Received}
		a.order++
		bs.reqs[e.RequestID] = r
		a.report.Requests++
	}
	if a.keep(r.id) {
		r.events = append(r.events, e)
	}
	from, to, ev := machine.State(e.From), machine.State(e.To), machine.Event(e.Event)
	switch {
	case !machine.Legal(from, ev, to):
		a.violate(line, r.id, RuleIllegalTransition, "%s: %s → %s is not in the transition table", e.Event, e.From, e.To)
	case from != r.state:
		a.violate(line, r.id, RuleIllegalTransition, "%s from %s, but the request is in %s", e.Event, e.From, r.state)
	}
	r.state = to // follow the log so that one bad line gives one violation

	switch ev {
	case machine.EvShare:
		if e.ShareID != nil {
			id := *e.ShareID
			r.shareID = &id
		}
		r.nFDs = max(r.nFDs, e.NFDs)
	case machine.EvAdopt:
		a.checkAdopt(line, bs, r, &e)
	case machine.EvFallback:
		r.fallbacks++
		a.report.Fallbacks++
	}
	if machine.LeavesHandoff(to) {
		a.checkCleanup(line, r, &e)
	}
	switch {
	case ev == machine.EvFallback && e.Reason == "":
		a.violate(line, r.id, RuleFallbackReasons, "fallback without a reason")
	case ev != machine.EvFallback && ev != machine.EvFail && e.Reason != "":
		a.violate(line, r.id, RuleFallbackReasons, "%s carries a reason (%q): only fallback and fail may", e.Event, e.Reason)
	}
	if machine.Terminal(to) {
		if to == machine.Done {
			a.report.Done++
		} else {
			a.report.Failed++
		}
		a.end(r)
		delete(bs.reqs, r.id)
		bs.ended[hashID(r.id)] = struct{}{}
		a.free = append(a.free, r)
	}
}

func (a *Auditor) keep(id string) bool {
	return (a.KeepTimelines || a.OnRequest != nil) && (a.Filter == nil || a.Filter(id))
}

// boot returns the state of a node's boot, caching the last one (events of
// one boot come in runs).
func (a *Auditor) boot(node, boot string) *bootState {
	k := bootKey{node, boot}
	if a.lastBS != nil && k == a.lastBoot {
		return a.lastBS
	}
	bs := a.boots[k]
	if bs == nil {
		bs = &bootState{reqs: make(map[string]*reqState), ended: make(map[uint64]struct{}),
			adopted: make(map[shareKey]uint64)}
		a.boots[k] = bs
		a.bootList = append(a.bootList, bs)
		a.report.Boots++
	}
	a.lastBoot, a.lastBS = k, bs
	return bs
}

func (a *Auditor) checkAdopt(line int, bs *bootState, r *reqState, e *event.Event) {
	if e.ShareID == nil {
		a.violate(line, r.id, RuleShareIDMismatch, "adopt without a share_id")
		return
	}
	id := *e.ShareID
	if r.shareID != nil && *r.shareID != id {
		a.violate(line, r.id, RuleShareIDMismatch, "adopt of share_id %d, but the request's share received %d", id, *r.shareID)
	}
	k, bit := shareKey{bs.decoder, id >> 6}, uint64(1)<<(id&63)
	word := bs.adopted[k]
	if word&bit != 0 {
		a.violate(line, r.id, RuleShareIDReused, "share_id %d was already adopted in this decoder lifetime (node %s, boot %s)",
			id, e.Node, e.Boot)
		return
	}
	bs.adopted[k] = word | bit
}

func (a *Auditor) checkCleanup(line int, r *reqState, e *event.Event) {
	c := e.Cleanup
	switch {
	case c == nil:
		a.violate(line, r.id, RuleMissingCleanup, "%s leaves the handoff without cleanup facts", e.Event)
	case c.FDsClosed < r.nFDs:
		a.violate(line, r.id, RuleMissingCleanup, "%s closed %d fds of the %d the request received", e.Event, c.FDsClosed, r.nFDs)
	case c.FilesRemoved < 1 && machine.State(e.To) != machine.Fallback:
		a.violate(line, r.id, RuleMissingCleanup, "%s removed no file (the %s route always writes one)", e.Event, e.Route)
	}
}

// end hands a finished request's timeline over and drops its events.
func (a *Auditor) end(r *reqState) {
	if r.events == nil {
		return
	}
	if a.KeepTimelines {
		if a.report.Timelines == nil {
			a.report.Timelines = make(map[string][]event.Event)
		}
		a.report.Timelines[r.id] = append(a.report.Timelines[r.id], r.events...)
	}
	if a.OnRequest != nil {
		a.OnRequest(r.id, r.events)
	}
	r.events = nil
}

// Finish ends the audit: requests that did not reach done or failed are
// reported in flight (their timelines handed over in first-seen order), and
// the report is returned. Call it once.
func (a *Auditor) Finish() Report {
	var open []*reqState
	for _, bs := range a.bootList {
		for _, r := range bs.reqs {
			open = append(open, r)
		}
	}
	slices.SortFunc(open, func(x, y *reqState) int { return x.order - y.order })
	a.report.InFlight = make([]string, 0, len(open))
	for _, r := range open {
		a.report.InFlight = append(a.report.InFlight, r.id)
		a.end(r)
	}
	if a.report.Violations == nil {
		a.report.Violations = []Violation{}
	}
	return a.report
}
