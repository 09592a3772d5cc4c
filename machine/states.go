// Package machine is the per-request state machine (looplab/fsm): the
// states, the one transition table (DESIGN §4) and Machine. It does no I/O:
// the runner that drives a machine through a route is package handoff, and
// the offline audit (eventlog) depends on the table alone.
//
//	              listen            share              prefill
//	received ──────────▶ listening ───────▶ shared ───────────▶ prefilled
//	  │  │                   │                 │                 │   │
//	  │  └──── prefill (file route) ───────────┼────────────────▶│   │
//	  │                      │                 │           adopt │   │ restore
//	  │ fallback             │ fallback        │ fallback        ▼   ▼
//	  ├─────────────▶ fallback ◀───────────────┴──────── adopted   restored
//	  │                 │                                   │         │
//	  │ forward (plain) │ forward                   forward │ forward │
//	  └────────────────▶ forwarding ◀───────────────────────┴─────────┘
//	                      │      │
//	               finish ▼      ▼ fail
//	                     done   failed
package machine

import "github.com/looplab/fsm"

// State is a request's state.
type State string

// Event is a transition's name.
type Event string

// States.
const (
	Received   State = "received"
	Listening  State = "listening"
	Shared     State = "shared"
	Prefilled  State = "prefilled"
	Adopted    State = "adopted"
	Restored   State = "restored"
	Fallback   State = "fallback"
	Forwarding State = "forwarding"
	Done       State = "done"
	Failed     State = "failed"
)

// Events.
const (
	EvListen   Event = "listen"
	EvShare    Event = "share"
	EvPrefill  Event = "prefill"
	EvAdopt    Event = "adopt"
	EvRestore  Event = "restore"
	EvFallback Event = "fallback"
	EvForward  Event = "forward"
	EvFinish   Event = "finish"
	EvFail     Event = "fail"
)

// Transition is one row of the table: Event takes a request from any of
// From to To.
type Transition struct {
	Event Event
	From  []State
	To    State
}

// Transitions is DESIGN §4's table, the single source of the fsm.Events
// given to looplab/fsm and of replay's legality audit.
var Transitions = []Transition{
	{EvListen, []State{Received}, Listening},
	{EvShare, []State{Listening}, Shared},
	{EvPrefill, []State{Shared, Received}, Prefilled},
	{EvAdopt, []State{Prefilled}, Adopted},
	{EvRestore, []State{Prefilled}, Restored},
	{EvFallback, []State{Received, Listening, Shared, Prefilled}, Fallback},
	{EvForward, []State{Received, Adopted, Restored, Fallback}, Forwarding},
	{EvFinish, []State{Forwarding}, Done},
	{EvFail, []State{Forwarding}, Failed},
}

// Terminal reports whether s ends a request.
func Terminal(s State) bool { return s == Done || s == Failed }

// LeavesHandoff reports whether entering s ends the handoff (cleanup facts
// travel on the event that enters it).
func LeavesHandoff(s State) bool { return s == Adopted || s == Restored || s == Fallback }

// Legal reports whether ev takes a request in from to to.
func Legal(from State, ev Event, to State) bool {
	for _, t := range Transitions {
		if t.Event != ev || t.To != to {
			continue
		}
		for _, f := range t.From {
			if f == from {
				return true
			}
		}
	}
	return false
}

// fsmEvents builds looplab/fsm's table from Transitions.
func fsmEvents() fsm.Events {
	evs := make(fsm.Events, 0, len(Transitions))
	for _, t := range Transitions {
		src := make([]string, len(t.From))
		for i, f := range t.From {
			src[i] = string(f)
		}
		evs = append(evs, fsm.EventDesc{Name: string(t.Event), Src: src, Dst: string(t.To)})
	}
	return evs
}
