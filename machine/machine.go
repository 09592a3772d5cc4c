package machine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/looplab/fsm"

	"github.com/onebitd/onebitd/event"
)

// Route is how a request's KV reaches the decoder.
type Route string

// Routes (X-Onebit-Route values).
const (
	RoutePlain    Route = "plain"
	RouteFile     Route = "file"
	RouteShared   Route = "shared"
	RouteFallback Route = "fallback"
)

// Errors of this package.
var (
	// ErrNoReason: a fallback must say why.
	ErrNoReason = errors.New("machine: fallback without a reason")
)

// Attrs are the per-event facts of DESIGN §5.
type Attrs struct {
	ShareID      *int64
	NTokens      int
	NFDs         int
	BytesMapped  int64
	Reason       string
	Step         string
	HTTPStatus   int
	ProviderExit *int
	Cleanup      *event.Cleanup
}

// Machine is one request's state machine. It is not safe for concurrent
// use: one request, one goroutine drives it.
type Machine struct {
	id    string
	slot  int
	route Route
	f     *fsm.FSM
	sink  event.Sink
	start time.Time
	log   *slog.Logger

	// last is recorded by the after_event callback (the only callback: it
	// records, it does no I/O).
	last struct{ from, to State }
}

// New returns a machine in state received for request id on slot.
func New(id string, slot int, route Route, sink event.Sink, log *slog.Logger) *Machine {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Machine{id: id, slot: slot, route: route, sink: sink, start: time.Now(), log: log}
	m.f = fsm.NewFSM(string(Received), fsmEvents(), fsm.Callbacks{
		"after_event": func(_ context.Context, e *fsm.Event) {
			m.last.from, m.last.to = State(e.Src), State(e.Dst)
		},
	})
	return m
}

// ID is the request id.
func (m *Machine) ID() string { return m.id }

// Slot is the decoder slot the request holds.
func (m *Machine) Slot() int { return m.slot }

// Route is the request's route (RouteFallback once it fell back).
func (m *Machine) Route() Route { return m.route }

// State is the current state.
func (m *Machine) State() State { return State(m.f.Current()) }

// Elapsed is the time since the request was received.
func (m *Machine) Elapsed() time.Duration { return time.Since(m.start) }

// Fire takes transition ev and emits its event with a. It never runs inside
// an fsm callback and always with a context that cannot be cancelled (a
// cancelled ctx would wedge looplab/fsm in InTransitionError).
func (m *Machine) Fire(ev Event, a Attrs) error {
	if ev == EvFallback && a.Reason == "" {
		return ErrNoReason
	}
	if err := m.f.Event(context.WithoutCancel(context.Background()), string(ev)); err != nil {
		return fmt.Errorf("machine: request %s: %s from %s: %w", m.id, ev, m.State(), err)
	}
	if ev == EvFallback {
		m.route = RouteFallback
	}
	e := event.Event{
		Time:         time.Now(),
		RequestID:    m.id,
		Slot:         m.slot,
		Route:        string(m.route),
		Event:        string(ev),
		From:         string(m.last.from),
		To:           string(m.last.to),
		ElapsedUS:    time.Since(m.start).Microseconds(),
		ShareID:      a.ShareID,
		NTokens:      a.NTokens,
		NFDs:         a.NFDs,
		BytesMapped:  a.BytesMapped,
		Reason:       a.Reason,
		Step:         a.Step,
		HTTPStatus:   a.HTTPStatus,
		ProviderExit: a.ProviderExit,
		Cleanup:      a.Cleanup,
	}
	if m.sink != nil {
		m.sink.Emit(&e)
	}
	return nil
}

// Visualize is the Graphviz diagram of the transition table.
func Visualize() (string, error) {
	return fsm.VisualizeWithType(fsm.NewFSM(string(Received), fsmEvents(), nil), fsm.GRAPHVIZ)
}
