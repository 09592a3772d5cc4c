package machine

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
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
	t.Parallel()
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
	t.Parallel()
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

// TestRefusedTransition: an illegal event is refused with fsm's
// InvalidEventError (matched by value, as STYLE says), the error names the
// request, the event and the state, the machine does not move and no event
// is emitted; the same for a fallback without a reason (ErrNoReason).
func TestRefusedTransition(t *testing.T) {
	t.Parallel()
	cases := []struct {
		path []Event
		ev   Event
		a    Attrs
		want error // a sentinel; nil: fsm.InvalidEventError
	}{
		{nil, EvAdopt, Attrs{}, nil},
		{nil, EvFinish, Attrs{}, nil},
		{[]Event{EvListen}, EvPrefill, Attrs{}, nil},
		{[]Event{EvPrefill}, EvShare, Attrs{}, nil},
		{[]Event{EvFallback}, EvFallback, Attrs{Reason: "again"}, nil},
		{[]Event{EvForward, EvFinish}, EvFail, Attrs{}, nil},
		{nil, EvFallback, Attrs{}, ErrNoReason},
		{[]Event{EvListen, EvShare}, EvFallback, Attrs{Step: "peer"}, ErrNoReason},
	}
	for _, tc := range cases {
		var mem event.Mem
		m := walk(t, &mem, tc.path...)
		from, before := m.State(), len(mem.Events())
		err := m.Fire(tc.ev, tc.a)
		if tc.want != nil {
			if !errors.Is(err, tc.want) {
				t.Errorf("%s from %s: %v, want %v", tc.ev, from, err, tc.want)
			}
		} else {
			var inv fsm.InvalidEventError
			if !errors.As(err, &inv) || inv.Event != string(tc.ev) || inv.State != string(from) {
				t.Errorf("%s from %s: %T %v, want fsm.InvalidEventError for it", tc.ev, from, err, err)
			}
			if err != nil && !strings.Contains(err.Error(), "r1") {
				t.Errorf("error %q does not name the request", err)
			}
		}
		if m.State() != from || len(mem.Events()) != before {
			t.Errorf("%s from %s: refused, yet the machine is in %s with %d events (was %d)", tc.ev, from, m.State(), len(mem.Events()), before)
		}
	}
}

// TestFireCarriesAttrs: every fact given to Fire lands on its event, with
// the request's id, slot and route, from and to, and a non-negative
// elapsed time; a fallback turns the route to fallback for it and after.
func TestFireCarriesAttrs(t *testing.T) {
	t.Parallel()
	var mem event.Mem
	m := New("r42", 3, RouteShared, &mem, nil)
	if m.ID() != "r42" || m.Slot() != 3 || m.Route() != RouteShared || m.State() != Received {
		t.Fatalf("new machine: %s %d %s %s", m.ID(), m.Slot(), m.Route(), m.State())
	}
	id, exit := int64(7), 0
	cl := &event.Cleanup{FDsClosed: 3, FilesRemoved: 2}
	steps := []struct {
		ev Event
		a  Attrs
	}{
		{EvListen, Attrs{}},
		{EvShare, Attrs{ShareID: &id, NFDs: 3, BytesMapped: 1 << 20}},
		{EvPrefill, Attrs{NTokens: 250, ProviderExit: &exit}},
		{EvFallback, Attrs{Reason: "the decoder answered adopt with 400", Step: StepAdopt, HTTPStatus: 400, Cleanup: cl}},
		{EvForward, Attrs{}},
	}
	for _, s := range steps {
		if err := m.Fire(s.ev, s.a); err != nil {
			t.Fatal(err)
		}
	}
	evs := mem.Events()
	if len(evs) != len(steps) {
		t.Fatalf("%d events, want %d", len(evs), len(steps))
	}
	wantRoute := []Route{RouteShared, RouteShared, RouteShared, RouteFallback, RouteFallback}
	from := Received
	for i, e := range evs {
		a := steps[i].a
		to := State(e.To)
		if e.RequestID != "r42" || e.Slot != 3 || e.Route != string(wantRoute[i]) || e.Event != string(steps[i].ev) ||
			e.From != string(from) || !Legal(from, steps[i].ev, to) || e.ElapsedUS < 0 || e.Time.IsZero() {
			t.Errorf("event %d: %+v", i, e)
		}
		if e.ShareID != a.ShareID || e.NFDs != a.NFDs || e.BytesMapped != a.BytesMapped || e.NTokens != a.NTokens ||
			e.ProviderExit != a.ProviderExit || e.Reason != a.Reason || e.Step != a.Step || e.HTTPStatus != a.HTTPStatus || e.Cleanup != a.Cleanup {
			t.Errorf("event %d lost an attribute: %+v, fired with %+v", i, e, a)
		}
		from = to
	}
	if m.State() != Forwarding || m.Route() != RouteFallback || m.Elapsed() < 0 {
		t.Fatalf("end: %s %s %v", m.State(), m.Route(), m.Elapsed())
	}
	// A machine without a sink moves all the same.
	n := New("r43", 0, RoutePlain, nil, nil)
	if err := n.Fire(EvForward, Attrs{}); err != nil || n.State() != Forwarding {
		t.Fatalf("no sink: %v %s", err, n.State())
	}
}

// TestTerminalAndLeavesHandoff: Terminal is exactly the states the table
// leaves no way out of; LeavesHandoff exactly the states that adopt,
// restore and fallback enter (where the cleanup facts travel).
func TestTerminalAndLeavesHandoff(t *testing.T) {
	t.Parallel()
	out := map[State]bool{}
	for _, tr := range Transitions {
		for _, f := range tr.From {
			out[f] = true
		}
	}
	leaves := map[State]bool{}
	for _, tr := range Transitions {
		if tr.Event == EvAdopt || tr.Event == EvRestore || tr.Event == EvFallback {
			leaves[tr.To] = true
		}
	}
	for _, s := range allStates {
		if Terminal(s) == out[s] {
			t.Errorf("Terminal(%s) = %v, but the table has transitions out of it: %v", s, Terminal(s), out[s])
		}
		if LeavesHandoff(s) != leaves[s] {
			t.Errorf("LeavesHandoff(%s) = %v, want %v", s, LeavesHandoff(s), leaves[s])
		}
	}
}
