package eventlog

import (
	"cmp"
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
	// RuleSeqGap: within one node and boot, seq did not grow by exactly one,
	// and no loss marker of the log names the missing events.
	RuleSeqGap = "seq-gap"
	// RuleEventsLost: the log says it lost events (a loss marker: "N events
	// lost between seq A and B"), a request's events no longer follow on
	// from each other after such a loss, or a boot that stopped cleanly
	// (its shutdown line) left more requests unfinished than it said were in
	// flight: their last events were lost.
	RuleEventsLost = "events-lost"
	// RuleSkipAndHandoff: a request both skipped the handoff and handed
	// over (issue 13): its decision "skip" is followed by a handoff step
	// (listen, share, prefill, adopt, restore) or is not the plain route's
	// forward; a decision "handoff" is forwarded straight from received; or
	// a decision travels on an event that does not leave received.
	RuleSkipAndHandoff = "skip-and-handoff"
)

// Decoder lifecycle events (no request fields). A starting or exited decoder
// begins a new share_id lifetime.
const (
	DecoderStarting = "decoder.starting"
	DecoderReady    = "decoder.ready"
	DecoderExited   = "decoder.exited"
)

// otherLifecycle is the lifecycle of the other supervised processes: a warm
// provider (provider.*) and a prefill server (prefill.*). They say nothing
// about share ids.
var otherLifecycle = map[string]bool{
	"provider.starting": true, "provider.ready": true, "provider.exited": true,
	"prefill.starting": true, "prefill.ready": true, "prefill.exited": true,
}

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
	Events    int `json:"events"`
	Boots     int `json:"boots"`
	Requests  int `json:"requests"`
	Done      int `json:"done"`
	Failed    int `json:"failed"`
	Fallbacks int `json:"fallbacks"`
	// InFlight: requests without a final event at the end of a boot that
	// may still be running (the last boot of its node, no shutdown line),
	// or that its shutdown line counted in flight. Ids in first-event order.
	InFlight []string `json:"in_flight"`
	// Interrupted: requests without a final event in a boot that ended
	// without a shutdown line and was followed by a later boot of its node
	// (a crash, a kill -9, or a disk that stayed full to the end).
	Interrupted []string `json:"interrupted"`
	// Incomplete: requests without a final event in a boot whose shutdown
	// line counted fewer in flight: their last events were lost
	// (RuleEventsLost names the boot).
	Incomplete []string `json:"incomplete"`
	// Lost: the log's loss markers, in order.
	Lost       []LostRange `json:"lost"`
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
	key      bootKey
	lastSeq  uint64
	lost     [][2]uint64 // seq ranges named by loss markers
	shutdown *int        // in_flight of the shutdown line, if one was seen
	shutLine int
	shutSrc  string
	decoder  int                  // bumped by each decoder lifecycle start/exit: share_id lifetime
	reqs     map[string]*reqState // requests not ended yet
	ended    map[uint64]struct{}  // hashes (hashID) of the ended requests' ids
	adopted  map[shareKey]uint64  // adopted share ids, 64 per bitmap word
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
	decision  string // "handoff" or "skip", from the event that left received
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
	bs := a.boot(e.Node, e.Boot)
	if e.Event == event.LostEvent {
		a.addLoss(line, bs, &e)
		return
	}
	a.report.Events++
	if bs.lastSeq != 0 && e.Seq != bs.lastSeq+1 && !(e.Seq > bs.lastSeq && bs.covered(bs.lastSeq+1, e.Seq-1)) {
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
		case event.Shutdown:
			n := 0
			if e.InFlight != nil {
				n = *e.InFlight
			}
			bs.shutdown, bs.shutLine, bs.shutSrc = &n, line, a.source()
		default:
			if !otherLifecycle[e.Event] {
				a.violate(line, "", RuleIllegalTransition, "event %q has no request_id", e.Event)
			}
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
	case from != r.state && len(bs.lost) > 0:
		a.violate(line, r.id, RuleEventsLost, "%s from %s, but the log last saw the request in %s: its events in between were lost",
			e.Event, e.From, r.state)
	case from != r.state:
		a.violate(line, r.id, RuleIllegalTransition, "%s from %s, but the request is in %s", e.Event, e.From, r.state)
	}
	r.state = to // follow the log so that one bad line gives one violation
	a.checkDecision(line, r, &e)

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

// checkDecision applies RuleSkipAndHandoff, once per request.
func (a *Auditor) checkDecision(line int, r *reqState, e *event.Event) {
	ev := machine.Event(e.Event)
	if e.Decision != "" {
		bad := ""
		switch {
		case machine.State(e.From) != machine.Received:
			bad = fmt.Sprintf("decision %q on %s from %s: a decision travels on the event that leaves received", e.Decision, e.Event, e.From)
		case e.Decision == "skip" && (ev != machine.EvForward || e.Route != string(machine.RoutePlain)):
			bad = fmt.Sprintf("decision skip, but the request left received by %s on route %s", e.Event, e.Route)
		case e.Decision == "handoff" && ev == machine.EvForward:
			bad = "decision handoff, but the request was forwarded straight from received"
		}
		r.decision = e.Decision
		if bad != "" {
			a.violate(line, r.id, RuleSkipAndHandoff, "%s", bad)
			r.decision = "reported"
		}
		return
	}
	if r.decision == "skip" {
		switch ev {
		case machine.EvListen, machine.EvShare, machine.EvPrefill, machine.EvAdopt, machine.EvRestore:
			a.violate(line, r.id, RuleSkipAndHandoff, "the request skipped the handoff, then %s", e.Event)
			r.decision = "reported"
		}
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
		bs = &bootState{key: k, reqs: make(map[string]*reqState), ended: make(map[uint64]struct{}),
			adopted: make(map[shareKey]uint64)}
		a.boots[k] = bs
		a.bootList = append(a.bootList, bs)
		a.report.Boots++
	}
	a.lastBoot, a.lastBS = k, bs
	return bs
}

// LostRange is a loss marker of the log: Events events of a node's boot, seq
// FirstSeq to LastSeq, never reached it.
type LostRange struct {
	Node     string `json:"node"`
	Boot     string `json:"boot"`
	Events   uint64 `json:"events"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	Reason   string `json:"reason,omitempty"`
	Source   string `json:"source,omitempty"`
	Line     int    `json:"line"`
}

// String is "4979 events lost between seq 1024 and 6002 (node n1, boot b)".
func (l LostRange) String() string {
	return fmt.Sprintf("%d events lost between seq %d and %d (node %s, boot %s)", l.Events, l.FirstSeq, l.LastSeq, l.Node, l.Boot)
}

func (a *Auditor) addLoss(line int, bs *bootState, e *event.Event) {
	l := LostRange{Node: e.Node, Boot: e.Boot, Reason: e.Reason, Source: a.source(), Line: line}
	if e.Lost != nil {
		l.Events, l.FirstSeq, l.LastSeq = e.Lost.Events, e.Lost.FirstSeq, e.Lost.LastSeq
	}
	a.report.Lost = append(a.report.Lost, l)
	bs.lost = append(bs.lost, [2]uint64{l.FirstSeq, l.LastSeq})
	slices.SortFunc(bs.lost, func(x, y [2]uint64) int { return cmp.Compare(x[0], y[0]) })
	reason := ""
	if l.Reason != "" {
		reason = ": " + l.Reason
	}
	a.violate(line, "", RuleEventsLost, "%s; the log could not write them%s", l, reason)
}

// covered reports whether every seq from first to last is in a range a loss
// marker named.
func (bs *bootState) covered(first, last uint64) bool {
	for _, r := range bs.lost {
		if r[0] <= first && r[1] >= first {
			first = r[1] + 1
			if first > last {
				return true
			}
		}
	}
	return false
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
	case c.FilesRemoved < 1 && machine.State(e.To) == machine.Restored:
		// The file route's state file; the shared route writes no file
		// (per-slot sockets, tokens and layout in memfds: DESIGN §2b).
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

// Finish ends the audit and returns the report. Requests that did not
// reach done or failed are sorted by what their boot says (doc.go, "End of
// a boot"): in flight, interrupted (the boot crashed) or incomplete (a
// clean shutdown counted fewer in flight: a violation); their timelines are
// handed over in first-seen order. Call it once.
func (a *Auditor) Finish() Report {
	type openReq struct {
		r    *reqState
		list *[]string
	}
	var open []openReq
	later := make(map[string]bool) // nodes with a later boot, walking backwards
	for i := len(a.bootList) - 1; i >= 0; i-- {
		bs := a.bootList[i]
		list := &a.report.InFlight
		switch {
		case bs.shutdown != nil && len(bs.reqs) > *bs.shutdown:
			list = &a.report.Incomplete
			a.report.Violations = append(a.report.Violations, Violation{Rule: RuleEventsLost, Source: bs.shutSrc, Line: bs.shutLine,
				Detail: fmt.Sprintf("boot %s (node %s) stopped cleanly with %d requests in flight, but %d have no final event: their last events were lost",
					bs.key.boot, bs.key.node, *bs.shutdown, len(bs.reqs))})
		case bs.shutdown == nil && later[bs.key.node]:
			list = &a.report.Interrupted
		}
		later[bs.key.node] = true
		for _, r := range bs.reqs {
			open = append(open, openReq{r, list})
		}
	}
	slices.SortFunc(open, func(x, y openReq) int { return x.r.order - y.r.order })
	a.report.InFlight = make([]string, 0, len(open))
	for _, o := range open {
		*o.list = append(*o.list, o.r.id)
		a.end(o.r)
	}
	if a.report.Interrupted == nil {
		a.report.Interrupted = []string{}
	}
	if a.report.Incomplete == nil {
		a.report.Incomplete = []string{}
	}
	if a.report.Lost == nil {
		a.report.Lost = []LostRange{}
	}
	if a.report.Violations == nil {
		a.report.Violations = []Violation{}
	}
	return a.report
}
