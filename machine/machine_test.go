package machine

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/looplab/fsm"

	"github.com/onebitd/onebitd/event"
)

var update = flag.Bool("update", false, "rewrite golden files")

var allStates = []State{Received, Listening, Shared, Prefilled, Adopted, Restored, Fallback, Forwarding, Done, Failed}
var allEvents = []Event{EvListen, EvShare, EvPrefill, EvAdopt, EvRestore, EvFallback, EvForward, EvFinish, EvFail}

// walk drives a fresh machine along path and returns it.
func walk(t *testing.T, sink event.Sink, path ...Event) *Machine {
	t.Helper()
	m := New("r1", 0, RouteShared, sink, nil)
	for _, ev := range path {
		a := Attrs{}
		if ev == EvFallback {
			a.Reason = "test"
		}
		if err := m.Fire(ev, a); err != nil {
			t.Fatalf("walk %v: %v", path, err)
		}
	}
	return m
}

// pathTo is a legal way to reach each state.
var pathTo = map[State][]Event{
	Received:   nil,
	Listening:  {EvListen},
	Shared:     {EvListen, EvShare},
	Prefilled:  {EvListen, EvShare, EvPrefill},
	Adopted:    {EvListen, EvShare, EvPrefill, EvAdopt},
	Restored:   {EvPrefill, EvRestore},
	Fallback:   {EvFallback},
	Forwarding: {EvForward},
	Done:       {EvForward, EvFinish},
	Failed:     {EvForward, EvFail},
}

// TestTransitionMatrix fires every event from every state: exactly the
// table's transitions succeed, everything else is refused and leaves the
// state unchanged.
func TestTransitionMatrix(t *testing.T) {
	want := map[State]map[Event]State{
		Received:   {EvListen: Listening, EvPrefill: Prefilled, EvFallback: Fallback, EvForward: Forwarding},
		Listening:  {EvShare: Shared, EvFallback: Fallback},
		Shared:     {EvPrefill: Prefilled, EvFallback: Fallback},
		Prefilled:  {EvAdopt: Adopted, EvRestore: Restored, EvFallback: Fallback},
		Adopted:    {EvForward: Forwarding},
		Restored:   {EvForward: Forwarding},
		Fallback:   {EvForward: Forwarding},
		Forwarding: {EvFinish: Done, EvFail: Failed},
		Done:       {},
		Failed:     {},
	}
	for _, from := range allStates {
		for _, ev := range allEvents {
			t.Run(string(from)+"/"+string(ev), func(t *testing.T) {
				var mem event.Mem
				m := walk(t, &mem, pathTo[from]...)
				before := len(mem.Events())
				a := Attrs{Reason: "r"}
				err := m.Fire(ev, a)
				to, ok := want[from][ev]
				if ok != (err == nil) {
					t.Fatalf("Fire(%s) from %s: err=%v, want legal=%v", ev, from, err, ok)
				}
				if Legal(from, ev, to) != ok && ok {
					t.Fatalf("Legal(%s,%s,%s) disagrees with the machine", from, ev, to)
				}
				if !ok {
					if m.State() != from || len(mem.Events()) != before {
						t.Fatalf("refused event moved the machine or emitted")
					}
					var inv fsm.InvalidEventError
					if !errors.As(err, &inv) {
						t.Fatalf("want InvalidEventError, got %T %v", err, err)
					}
					return
				}
				if m.State() != to {
					t.Fatalf("state %s, want %s", m.State(), to)
				}
				evs := mem.Events()
				last := evs[len(evs)-1]
				if last.From != string(from) || last.To != string(to) || last.Event != string(ev) || last.RequestID != "r1" {
					t.Fatalf("event %+v", last)
				}
			})
		}
	}
}

func TestFallbackNeedsReason(t *testing.T) {
	m := New("r", 0, RouteFile, nil, nil)
	if err := m.Fire(EvFallback, Attrs{}); !errors.Is(err, ErrNoReason) {
		t.Fatalf("got %v", err)
	}
	if m.State() != Received {
		t.Fatal("moved")
	}
	if err := m.Fire(EvFallback, Attrs{Reason: "x"}); err != nil || m.Route() != RouteFallback {
		t.Fatalf("err %v route %s", err, m.Route())
	}
}

func TestVisualizeGolden(t *testing.T) {
	got, err := Visualize()
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "machine.dot")
	if *update {
		os.WriteFile(golden, []byte(got), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if got != string(want) {
		t.Fatalf("transition diagram changed; if intended run go test ./machine -update\n%s", got)
	}
}
