// Package event is the handoff event: one JSON object per state transition,
// the same bytes on NATS and as one line of the event log (DESIGN §5,
// schemas/event.json). It has no dependencies so that every part (machine,
// eventlog, bus, replay) can share it.
package event

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"
)

// Version is the "v" of events this build writes.
const Version = 1

// Event is one transition of one request (or a decoder lifecycle event, whose
// Event is "decoder.starting|ready|exited" and whose RequestID is empty).
type Event struct {
	V         int       `json:"v"`
	Boot      string    `json:"boot"`
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Node      string    `json:"node"`
	RequestID string    `json:"request_id"`
	Slot      int       `json:"slot"`
	Route     string    `json:"route"`
	Event     string    `json:"event"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	ElapsedUS int64     `json:"elapsed_us"` // since the request was received

	ShareID      *int64   `json:"share_id,omitempty"`
	NTokens      int      `json:"n_tokens,omitempty"`
	NFDs         int      `json:"n_fds,omitempty"`
	BytesMapped  int64    `json:"bytes_mapped,omitempty"`
	Reason       string   `json:"reason,omitempty"`
	Step         string   `json:"step,omitempty"` // the handoff step that failed (fallback only)
	HTTPStatus   int      `json:"http_status,omitempty"`
	ProviderExit *int     `json:"provider_exit,omitempty"`
	Cleanup      *Cleanup `json:"cleanup,omitempty"`

	// The handoff decision (issue 13) travels on the event that leaves
	// received, and only there: Decision is "handoff" or "skip" (a skipped
	// handoff is the plain route, not a fallback), DecisionBasis what
	// decided it (always, never, floor, model, explore, held), the
	// predicted µs of each side (0 before the cost model has data), the
	// prompt tokens the slot held (a confirmed prefix) and the tokens left
	// to prefill.
	Decision         string `json:"decision,omitempty"`
	DecisionBasis    string `json:"decision_basis,omitempty"`
	PredictedDecoder int64  `json:"predicted_decoder_us,omitempty"`
	PredictedHandoff int64  `json:"predicted_handoff_us,omitempty"`
	TokensHeld       int    `json:"tokens_held,omitempty"`
	TokensPrefill    int    `json:"tokens_prefill,omitempty"`

	// InFlight is set on the Shutdown line only: the requests still in the
	// handoff or being forwarded when the process stopped cleanly.
	InFlight *int `json:"in_flight,omitempty"`
	// Lost is set on the event log's LostEvent marker only.
	Lost *Lost `json:"lost,omitempty"`
}

// Lines that are not transitions (eventlog/doc.go, "Marker lines").
const (
	// Shutdown is the last event of a boot that stopped cleanly
	// (Recorder.Shutdown): it carries in_flight, so that a reader can tell
	// a clean stop from a crash and count the requests whose last events
	// are missing.
	Shutdown = "eventlog.shutdown"
	// LostEvent is the line the event log writes, once it can write again,
	// for events it could not keep (seq 0: it is not a transition; boot and
	// node are those of the lost events).
	LostEvent = "eventlog.lost"
)

// Lost is what a LostEvent marker says: Events events of its boot, with
// seq from FirstSeq to LastSeq, never reached the log (Events may be less
// than LastSeq-FirstSeq+1 when some in between were written).
type Lost struct {
	Events   uint64 `json:"events"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
}

// Cleanup is what a request's handoff released; it travels on the event that
// leaves the handoff (adopt, restore, fallback).
type Cleanup struct {
	FDsClosed    int `json:"fds_closed"`
	FilesRemoved int `json:"files_removed"`
}

// Sink takes events. Emit must not block for long and must not keep a
// reference to e's pointer fields after returning unless it copies them.
type Sink interface {
	Emit(e *Event)
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(e *Event)

// Emit calls f(e).
func (f SinkFunc) Emit(e *Event) { f(e) }

// LineSink is a Sink that also takes the event already encoded: the
// Recorder encodes each event once (AppendJSON plus '\n') and hands every
// LineSink the same line. line is immutable and shared: a LineSink may keep
// it (without the '\n' it is the NATS payload) but must not modify it.
// EmitLine has Emit's contract otherwise.
type LineSink interface {
	Sink
	EmitLine(e *Event, line []byte)
}

// Committer is a LineSink whose lines become durable later, the event log
// under --event-log-sync always. The Recorder calls AppendLine under its
// lock (in seq order; AppendLine must not do I/O) and, after releasing the
// lock, Commit with the ticket AppendLine returned; Commit returns once the
// line is durable, or lost and counted by the Committer. Ticket 0 means
// nothing to wait for. Tickets grow in AppendLine order, and Commit(t)
// makes every line up to t durable, so one caller's write and fsync serves
// every line appended before it (group commit).
type Committer interface {
	LineSink
	AppendLine(e *Event, line []byte) (ticket uint64)
	Commit(ticket uint64)
}

// Recorder stamps events with v, boot, seq, node and time, encodes each
// once, and hands it to its sinks in the order given to NewRecorder, which
// is seq order for every sink.
//
// The first Committer among the sinks (the event log) is the persistence
// point: sinks before it get the event at once, under the Recorder's lock;
// sinks after it (the bus) get it once the Committer made it durable
// (persist before publish), still in seq order. The lock is never held
// across the Committer's write or fsync: concurrent emitters append under
// the lock, then one of them writes and fsyncs for all (group commit), and
// each returns once its own event was handed to every sink.
type Recorder struct {
	Node string
	Boot string
	Now  func() time.Time

	before []Sink    // sinks before the committer
	after  []Sink    // sinks after it
	commit Committer // nil: every sink is in before

	mu    sync.Mutex
	seq   uint64
	queue []queued // appended to the committer, not yet handed to after

	pubMu sync.Mutex // one handOn at a time: the sinks after see seq order
}

// queued is an event waiting for its commit before the sinks after the
// committer see it. e stays valid: its emitter does not return before the
// event is handed over.
type queued struct {
	e    *Event
	line []byte
}

// NewRecorder returns a Recorder with a fresh random boot id.
func NewRecorder(node string, sinks ...Sink) *Recorder {
	r := &Recorder{Node: node, Boot: NewBoot(), Now: time.Now}
	for _, s := range sinks {
		if c, ok := s.(Committer); ok && r.commit == nil {
			r.commit = c
			continue
		}
		if r.commit == nil {
			r.before = append(r.before, s)
		} else {
			r.after = append(r.after, s)
		}
	}
	return r
}

// NewBoot draws a random boot id (16 hex digits).
func NewBoot() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// lineBytes is the initial capacity of an event's line (most are shorter).
const lineBytes = 384

// Emit stamps e, encodes it once and passes it to every sink. Under a
// Committer that waits (the log's always policy) it returns once e is
// durable and every sink after the Committer has it.
func (r *Recorder) Emit(e *Event) {
	r.mu.Lock()
	r.seq++
	seq := r.seq
	e.V = Version
	e.Boot = r.Boot
	e.Seq = seq
	e.Node = r.Node
	if e.Time.IsZero() {
		e.Time = r.Now()
	}
	line := append(e.AppendJSON(make([]byte, 0, lineBytes)), '\n')
	for _, s := range r.before {
		emit(s, e, line)
	}
	if r.commit == nil {
		r.mu.Unlock()
		return
	}
	ticket := r.commit.AppendLine(e, line)
	if ticket == 0 && len(r.queue) == 0 {
		// Nothing to wait for and nothing before it waiting: hand it on
		// now, still in seq order.
		for _, s := range r.after {
			emit(s, e, line)
		}
		r.mu.Unlock()
		return
	}
	if len(r.after) > 0 {
		r.queue = append(r.queue, queued{e: e, line: line})
	}
	r.mu.Unlock()
	r.commit.Commit(ticket)
	if len(r.after) > 0 {
		r.handOn(seq)
	}
}

// handOn passes every queued event up to seq, all durable once the caller's
// Commit returned, to the sinks after the committer, in seq order.
func (r *Recorder) handOn(seq uint64) {
	r.pubMu.Lock()
	defer r.pubMu.Unlock()
	r.mu.Lock()
	n := 0
	for n < len(r.queue) && r.queue[n].e.Seq <= seq {
		n++
	}
	batch := append([]queued(nil), r.queue[:n]...)
	clear(r.queue[:n])
	r.queue = append(r.queue[:0], r.queue[n:]...)
	r.mu.Unlock()
	for _, q := range batch {
		for _, s := range r.after {
			emit(s, q.e, q.line)
		}
	}
}

func emit(s Sink, e *Event, line []byte) {
	if ls, ok := s.(LineSink); ok {
		ls.EmitLine(e, line)
		return
	}
	s.Emit(e)
}

// Shutdown emits the Shutdown event, the last of a clean stop: inFlight is
// the number of requests still in flight (0 after a full drain). Call it
// after the last request event and before closing the sinks.
func (r *Recorder) Shutdown(inFlight int) {
	r.Emit(&Event{Event: Shutdown, InFlight: &inFlight})
}

// Mem is an in-memory Sink for tests and small tools.
type Mem struct {
	mu     sync.Mutex
	events []Event
}

// Emit appends a copy of e.
func (m *Mem) Emit(e *Event) {
	m.mu.Lock()
	m.events = append(m.events, *e)
	m.mu.Unlock()
}

// Events returns a copy of what was emitted.
func (m *Mem) Events() []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Event(nil), m.events...)
}
