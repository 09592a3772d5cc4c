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

// Recorder stamps events with v, boot, seq, node and time, then hands them to
// its sinks in order (the event log first, then the bus: persist before
// publish). Seq grows by one per event within one boot, in the order the
// sinks see them.
type Recorder struct {
	Node  string
	Boot  string
	Now   func() time.Time
	sinks []Sink

	mu  sync.Mutex
	seq uint64
}

// NewRecorder returns a Recorder with a fresh random boot id.
func NewRecorder(node string, sinks ...Sink) *Recorder {
	return &Recorder{Node: node, Boot: NewBoot(), Now: time.Now, sinks: sinks}
}

// NewBoot draws a random boot id (16 hex digits).
func NewBoot() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Emit stamps e and passes it to every sink.
func (r *Recorder) Emit(e *Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	e.V = Version
	e.Boot = r.Boot
	e.Seq = r.seq
	e.Node = r.Node
	if e.Time.IsZero() {
		e.Time = r.Now()
	}
	for _, s := range r.sinks {
		s.Emit(e)
	}
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
