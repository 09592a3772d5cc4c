package eventlog

import (
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/machine"
)

type opt func(*event.Event)

func share(id int64) opt  { return func(e *event.Event) { e.ShareID = &id } }
func fds(n int) opt       { return func(e *event.Event) { e.NFDs = n } }
func reason(r string) opt { return func(e *event.Event) { e.Reason = r } }
func noCleanup() opt      { return func(e *event.Event) { e.Cleanup = nil } }
func cleanup(f, r int) opt {
	return func(e *event.Event) { e.Cleanup = &event.Cleanup{FDsClosed: f, FilesRemoved: r} }
}

// ev is one request event; adopt, restore and fallback get a plausible
// cleanup unless an opt changes it.
func ev(id string, name machine.Event, from, to machine.State, opts ...opt) event.Event {
	e := event.Event{RequestID: id, Route: "shared", Event: string(name), From: string(from), To: string(to)}
	switch name {
	case machine.EvAdopt, machine.EvFallback:
		e.Cleanup = &event.Cleanup{FDsClosed: 4, FilesRemoved: 3}
	case machine.EvRestore:
		e.Route = "file"
		e.Cleanup = &event.Cleanup{FilesRemoved: 2}
	}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func lifecycle(name string) event.Event { return event.Event{Event: name} }

// sharedOK is a clean shared-route request.
func sharedOK(id string, sid int64) []event.Event {
	return []event.Event{
		ev(id, machine.EvListen, machine.Received, machine.Listening),
		ev(id, machine.EvShare, machine.Listening, machine.Shared, share(sid), fds(4)),
		ev(id, machine.EvPrefill, machine.Shared, machine.Prefilled),
		ev(id, machine.EvAdopt, machine.Prefilled, machine.Adopted, share(sid)),
		ev(id, machine.EvForward, machine.Adopted, machine.Forwarding),
		ev(id, machine.EvFinish, machine.Forwarding, machine.Done),
	}
}

func fileOK(id string) []event.Event {
	return []event.Event{
		ev(id, machine.EvPrefill, machine.Received, machine.Prefilled),
		ev(id, machine.EvRestore, machine.Prefilled, machine.Restored),
		ev(id, machine.EvForward, machine.Restored, machine.Forwarding),
		ev(id, machine.EvFinish, machine.Forwarding, machine.Done),
	}
}

func fallbackOK(id string) []event.Event {
	return []event.Event{
		ev(id, machine.EvListen, machine.Received, machine.Listening),
		ev(id, machine.EvShare, machine.Listening, machine.Shared, share(9), fds(4)),
		ev(id, machine.EvFallback, machine.Shared, machine.Fallback, reason("provider exited with status 1: oom"),
			func(e *event.Event) { e.Step = "prefill" }),
		ev(id, machine.EvForward, machine.Fallback, machine.Forwarding),
		ev(id, machine.EvFail, machine.Forwarding, machine.Failed, reason("client went away")),
	}
}

func plainOK(id string) []event.Event {
	return []event.Event{
		ev(id, machine.EvForward, machine.Received, machine.Forwarding),
		ev(id, machine.EvFinish, machine.Forwarding, machine.Done),
	}
}

func cat(parts ...[]event.Event) []event.Event { return slices.Concat(parts...) }

// stamp gives the events node, boot and seq through a Recorder, as the
// daemon does; boot changes at every "restart" marker (an event with
// Event "restart", not emitted).
func stamp(evs []event.Event) []event.Event {
	var out []event.Event
	mem := new(event.Mem)
	rec := event.NewRecorder("n1", mem)
	rec.Now = func() time.Time { return t0 }
	for _, e := range evs {
		if e.Event == "restart" {
			out = append(out, mem.Events()...)
			mem = new(event.Mem)
			rec = event.NewRecorder("n1", mem)
			rec.Now = func() time.Time { return t0 }
			continue
		}
		rec.Emit(&e)
	}
	return append(out, mem.Events()...)
}

var restart = event.Event{Event: "restart"}

func audit(evs []event.Event) Report {
	a := NewAuditor()
	a.SetSource("test.jsonl")
	for i, e := range evs {
		a.Add(i+1, e)
	}
	return a.Finish()
}

func TestAuditRules(t *testing.T) {
	type want struct {
		rule, request string
		line          int
	}
	tests := []struct {
		name     string
		events   []event.Event
		raw      bool // do not stamp (seq tests)
		want     []want
		inFlight []string
	}{
		{name: "clean routes", events: cat(
			[]event.Event{lifecycle(DecoderStarting), lifecycle(DecoderReady)},
			sharedOK("a", 1), fileOK("b"), fallbackOK("c"), plainOK("d"), sharedOK("e", 2))},
		{name: "warm provider and prefill server lifecycle", events: cat(
			[]event.Event{lifecycle(DecoderStarting), lifecycle(DecoderReady), lifecycle("provider.starting"), lifecycle("provider.ready"),
				lifecycle("prefill.starting"), lifecycle("prefill.ready")},
			sharedOK("a", 1), []event.Event{lifecycle("provider.exited"), lifecycle("provider.starting"), lifecycle("provider.ready")},
			fileOK("b"), []event.Event{lifecycle("prefill.exited")})},
		{name: "unknown event without request_id", events: []event.Event{lifecycle("provider.bogus")},
			want: []want{{RuleIllegalTransition, "", 1}}},
		{name: "interleaved requests", events: func() []event.Event {
			a, b := sharedOK("a", 1), sharedOK("b", 2)
			var out []event.Event
			for i := range a {
				out = append(out, a[i], b[i])
			}
			return out
		}()},
		{name: "in flight at the end is not a violation",
			events:   cat(sharedOK("a", 1), sharedOK("b", 2)[:3], plainOK("c")[:1]),
			inFlight: []string{"b", "c"}},
		{name: "illegal transition", events: cat(sharedOK("a", 1)[:2],
			[]event.Event{ev("a", machine.EvAdopt, machine.Shared, machine.Adopted, share(1))}),
			want: []want{{RuleIllegalTransition, "a", 3}}, inFlight: []string{"a"}},
		{name: "from is not the current state", events: []event.Event{
			ev("a", machine.EvListen, machine.Received, machine.Listening),
			ev("a", machine.EvPrefill, machine.Shared, machine.Prefilled)},
			want: []want{{RuleIllegalTransition, "a", 2}}, inFlight: []string{"a"}},
		{name: "first event must leave received", events: sharedOK("a", 1)[2:],
			want: []want{{RuleIllegalTransition, "a", 1}}},
		{name: "event after done", events: cat(plainOK("a"),
			[]event.Event{ev("a", machine.EvFinish, machine.Forwarding, machine.Done)}),
			want: []want{{RuleIllegalTransition, "a", 3}}},
		{name: "unknown event without request", events: []event.Event{{Event: "decoder.exploded"}},
			want: []want{{RuleIllegalTransition, "", 1}}},
		{name: "share id reused", events: cat(sharedOK("a", 7), sharedOK("b", 7)),
			want: []want{{RuleShareIDReused, "b", 10}}},
		{name: "share id reused in flight", events: cat(sharedOK("a", 7)[:4], sharedOK("b", 7)[:4]),
			want: []want{{RuleShareIDReused, "b", 8}}, inFlight: []string{"a", "b"}},
		{name: "share id after a decoder restart is new", events: cat(sharedOK("a", 7),
			[]event.Event{lifecycle(DecoderExited), lifecycle(DecoderStarting)}, sharedOK("b", 7))},
		{name: "share id after a daemon restart is new", events: cat(sharedOK("a", 7), []event.Event{restart}, sharedOK("a", 7))},
		{name: "adopt without share id", events: cat(sharedOK("a", 1)[:3],
			[]event.Event{ev("a", machine.EvAdopt, machine.Prefilled, machine.Adopted)}),
			want: []want{{RuleShareIDMismatch, "a", 4}}, inFlight: []string{"a"}},
		{name: "adopt of another share id", events: cat(sharedOK("a", 1)[:3],
			[]event.Event{ev("a", machine.EvAdopt, machine.Prefilled, machine.Adopted, share(2))}),
			want: []want{{RuleShareIDMismatch, "a", 4}}, inFlight: []string{"a"}},
		{name: "adopt without cleanup", events: cat(sharedOK("a", 1)[:3],
			[]event.Event{ev("a", machine.EvAdopt, machine.Prefilled, machine.Adopted, share(1), noCleanup())}),
			want: []want{{RuleMissingCleanup, "a", 4}}, inFlight: []string{"a"}},
		{name: "fds not all closed", events: cat(sharedOK("a", 1)[:3],
			[]event.Event{ev("a", machine.EvAdopt, machine.Prefilled, machine.Adopted, share(1), cleanup(3, 3))}),
			want: []want{{RuleMissingCleanup, "a", 4}}, inFlight: []string{"a"}},
		{name: "restore removed no file", events: []event.Event{
			ev("a", machine.EvPrefill, machine.Received, machine.Prefilled),
			ev("a", machine.EvRestore, machine.Prefilled, machine.Restored, cleanup(0, 0))},
			want: []want{{RuleMissingCleanup, "a", 2}}, inFlight: []string{"a"}},
		{name: "fallback without cleanup", events: []event.Event{
			ev("a", machine.EvFallback, machine.Received, machine.Fallback, reason("x"), noCleanup())},
			want: []want{{RuleMissingCleanup, "a", 1}}, inFlight: []string{"a"}},
		{name: "fallback from received may remove nothing", events: []event.Event{
			ev("a", machine.EvFallback, machine.Received, machine.Fallback, reason("x"), cleanup(0, 0)),
			ev("a", machine.EvForward, machine.Fallback, machine.Forwarding),
			ev("a", machine.EvFinish, machine.Forwarding, machine.Done)}},
		{name: "fallback without reason", events: []event.Event{
			ev("a", machine.EvFallback, machine.Received, machine.Fallback)},
			want: []want{{RuleFallbackReasons, "a", 1}}, inFlight: []string{"a"}},
		{name: "two fallback reasons", events: []event.Event{
			ev("a", machine.EvFallback, machine.Received, machine.Fallback, reason("x")),
			ev("a", machine.EvForward, machine.Fallback, machine.Forwarding, reason("y"))},
			want: []want{{RuleFallbackReasons, "a", 2}}, inFlight: []string{"a"}},
		{name: "two fallbacks", events: []event.Event{
			ev("a", machine.EvFallback, machine.Received, machine.Fallback, reason("x")),
			ev("a", machine.EvFallback, machine.Received, machine.Fallback, reason("y"))},
			want: []want{{RuleIllegalTransition, "a", 2}}, inFlight: []string{"a"}},
		{name: "seq gap", raw: true, events: func() []event.Event {
			evs := stamp(plainOK("a"))
			evs = append(evs, stamp(plainOK("b"))...) // a second boot: no gap
			evs[1].Seq = 5
			return evs
		}(), want: []want{{RuleSeqGap, "a", 2}}},
		{name: "seq duplicated", raw: true, events: func() []event.Event {
			evs := stamp(plainOK("a"))
			evs[1].Seq = 1
			return evs
		}(), want: []want{{RuleSeqGap, "a", 2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs := tt.events
			if !tt.raw {
				evs = stamp(evs)
			}
			rep := audit(evs)
			var got []want
			for _, v := range rep.Violations {
				got = append(got, want{v.Rule, v.RequestID, v.Line})
				if v.Source != "test.jsonl" || v.Detail == "" {
					t.Errorf("violation %+v", v)
				}
				t.Log(v)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("violations %+v, want %+v", got, tt.want)
			}
			if !slices.Equal(rep.InFlight, tt.inFlight) && len(rep.InFlight)+len(tt.inFlight) > 0 {
				t.Fatalf("in flight %q, want %q", rep.InFlight, tt.inFlight)
			}
			if rep.Events != len(evs) {
				t.Fatalf("report counts %d events of %d", rep.Events, len(evs))
			}
		})
	}
}

func TestAuditCountsAndTimelines(t *testing.T) {
	evs := stamp(cat(sharedOK("a", 1)[:2], fallbackOK("c"), sharedOK("a", 1)[2:], plainOK("d")[:1]))
	a := NewAuditor()
	a.KeepTimelines = true
	var ended []string
	a.OnRequest = func(id string, evs []event.Event) { ended = append(ended, id+":"+strconv.Itoa(len(evs))) }
	a.Filter = func(id string) bool { return id != "c" }
	for i, e := range evs {
		a.Add(i+1, e)
	}
	rep := a.Finish()
	if !rep.OK() || rep.Requests != 3 || rep.Done != 1 || rep.Failed != 1 || rep.Fallbacks != 1 || rep.Boots != 1 {
		t.Fatalf("report %+v", rep)
	}
	if !slices.Equal(ended, []string{"a:6", "d:1"}) || !slices.Equal(rep.InFlight, []string{"d"}) {
		t.Fatalf("ended %q, in flight %q", ended, rep.InFlight)
	}
	if len(rep.Timelines) != 2 || len(rep.Timelines["a"]) != 6 || rep.Timelines["a"][5].To != "done" {
		t.Fatalf("timelines %+v", rep.Timelines)
	}
}

// randomWalk emits a random legal walk of machine.Transitions from received
// to a terminal state, with the fields the audit rules ask for.
func randomWalk(rng *rand.Rand, id string, sid int64) []event.Event {
	var out []event.Event
	state, nFDs := machine.Received, 0
	for !machine.Terminal(state) {
		var choices []machine.Transition
		for _, tr := range machine.Transitions {
			if slices.Contains(tr.From, state) {
				choices = append(choices, tr)
			}
		}
		tr := choices[rng.IntN(len(choices))]
		e := event.Event{RequestID: id, Route: "shared", Event: string(tr.Event), From: string(state), To: string(tr.To)}
		switch tr.Event {
		case machine.EvShare:
			nFDs = 1 + rng.IntN(8)
			e.ShareID, e.NFDs = &sid, nFDs
		case machine.EvAdopt:
			e.ShareID = &sid
		case machine.EvFallback, machine.EvFail:
			e.Reason, e.Step = "something failed", "prefill"
		}
		if machine.LeavesHandoff(tr.To) {
			e.Cleanup = &event.Cleanup{FDsClosed: nFDs, FilesRemoved: 1 + rng.IntN(3)}
		}
		out = append(out, e)
		state = tr.To
	}
	return out
}

func TestAuditRandomLegalWalks(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var evs []event.Event
	for i := range 2000 {
		evs = append(evs, randomWalk(rng, "r-"+strconv.Itoa(i), int64(i))...)
	}
	rep := audit(stamp(evs))
	if !rep.OK() || len(rep.InFlight) != 0 || rep.Requests != 2000 || rep.Done+rep.Failed != 2000 {
		t.Fatalf("report %+v", rep)
	}
}

func TestReplayFiles(t *testing.T) {
	dir := t.TempDir()
	p1, p2 := filepath.Join(dir, "1.jsonl"), filepath.Join(dir, "2.jsonl")
	writeLog(t, p1, 60)
	writeLog(t, p2, 60)
	// A torn tail on the first file is a warning; replay goes on to the next.
	appendFile(t, p1, `{"v":1,"boot":"`)
	var torn []TornTail
	rep, err := Replay(Files([]string{p1, p2}, func(tt TornTail) { torn = append(torn, tt) }), NewAuditor())
	if err != nil || !rep.OK() || rep.Events != 120 || rep.Boots != 2 || len(torn) != 1 || torn[0].Path != p1 {
		t.Fatalf("report %+v, torn %+v, err %v", rep, torn, err)
	}
	// A missing file is an error.
	if _, err := Replay(Files([]string{p1, filepath.Join(dir, "nope")}, nil), NewAuditor()); err == nil {
		t.Fatal("missing file: no error")
	}
	// Stopping early releases the file.
	for range Files([]string{p1}, nil) {
		break
	}
}

func BenchmarkAudit(b *testing.B) {
	path := filepath.Join(b.TempDir(), "events.jsonl")
	const n = 1_000_000
	size := writeLog(b, path, n)
	b.SetBytes(size)
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		rep, err := Replay(Files([]string{path}, nil), NewAuditor())
		if err != nil || rep.Events != n || !rep.OK() {
			b.Fatalf("%v %+v", err, rep.Violations[:min(3, len(rep.Violations))])
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(n*b.N)/(cpuTime()-cpu0).Seconds(), "events/cpu-s")
}
