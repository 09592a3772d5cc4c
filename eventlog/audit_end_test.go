package eventlog

import (
	"reflect"
	"slices"
	"testing"

	"github.com/onebitd/onebitd/event"
)

func shutdownLine(inFlight int) event.Event {
	return event.Event{Event: event.Shutdown, InFlight: &inFlight}
}

// lose replaces the stamped events with seq first..last by the writer's
// loss marker (as the log holds them after a failed write).
func lose(evs []event.Event, first, last uint64) []event.Event {
	var out []event.Event
	for _, e := range evs {
		if e.Seq >= first && e.Seq <= last {
			if e.Seq == first {
				out = append(out, event.Event{V: 1, Boot: e.Boot, Node: e.Node, Time: e.Time, Event: event.LostEvent,
					Reason: "no space left on device", Lost: &event.Lost{Events: last - first + 1, FirstSeq: first, LastSeq: last}})
			}
			continue
		}
		out = append(out, e)
	}
	return out
}

// TestAuditEndOfBootAndLosses: how the audit reads the marker lines (loss
// markers, shutdown lines) and sorts the requests left unfinished at the end
// of a boot: in flight, interrupted (crash), or incomplete (lost events).
func TestAuditEndOfBootAndLosses(t *testing.T) {
	type want struct {
		rule, id string
		line     int
	}
	tests := []struct {
		name                              string
		events                            []event.Event
		want                              []want
		inFlight, interrupted, incomplete []string
		lost                              uint64
	}{
		{name: "clean shutdown", events: stamp(cat(plainOK("a"), []event.Event{shutdownLine(0)}))},
		{name: "shutdown counts the one in flight", events: stamp(cat(plainOK("a")[:1], []event.Event{shutdownLine(1)})),
			inFlight: []string{"a"}},
		{name: "shutdown says none in flight, one unfinished",
			events:     stamp(cat(plainOK("a")[:1], plainOK("b"), []event.Event{shutdownLine(0)})),
			want:       []want{{RuleEventsLost, "", 4}},
			incomplete: []string{"a"}},
		{name: "crash then restart", events: stamp(cat(plainOK("a")[:1], []event.Event{restart}, plainOK("b"))),
			interrupted: []string{"a"}},
		{name: "crash then restart, both unfinished",
			events:      stamp(cat(plainOK("a")[:1], []event.Event{restart}, plainOK("b")[:1])),
			interrupted: []string{"a"}, inFlight: []string{"b"}},
		{name: "last boot without shutdown", events: stamp(plainOK("a")[:1]), inFlight: []string{"a"}},
		{name: "marker names the gap", events: lose(stamp(cat(plainOK("a"), plainOK("b"), plainOK("c"))), 3, 4),
			want: []want{{RuleEventsLost, "", 3}}, lost: 2},
		{name: "marker at the end, then shutdown",
			events: lose(stamp(cat(plainOK("a"), plainOK("b"), []event.Event{shutdownLine(0)})), 3, 4),
			want:   []want{{RuleEventsLost, "", 3}}, lost: 2},
		{name: "request cut by a loss",
			events: lose(stamp(cat(sharedOK("a", 1), []event.Event{shutdownLine(0)})), 2, 4),
			want:   []want{{RuleEventsLost, "", 2}, {RuleEventsLost, "a", 3}}, lost: 3},
		{name: "the whole end lost, shutdown from the reserve",
			events: lose(stamp(cat(plainOK("a"), plainOK("b")[:1], plainOK("c"), []event.Event{shutdownLine(0)})), 4, 5),
			want:   []want{{RuleEventsLost, "", 4}, {RuleEventsLost, "", 5}}, incomplete: []string{"b"}, lost: 2},
		{name: "gap the marker does not cover",
			events: lose(stamp(cat(plainOK("a"), plainOK("b"), plainOK("c"))), 3, 3)[:3:3],
			want:   []want{{RuleEventsLost, "", 3}}, lost: 1},
	}
	tests[len(tests)-1].events = append(tests[len(tests)-1].events, stamp(plainOK("z"))...) // another boot
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := audit(tt.events)
			var got []want
			for _, v := range rep.Violations {
				got = append(got, want{v.Rule, v.RequestID, v.Line})
				t.Log(v)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("violations %+v, want %+v", got, tt.want)
			}
			for _, c := range []struct {
				name      string
				got, want []string
			}{{"in flight", rep.InFlight, tt.inFlight}, {"interrupted", rep.Interrupted, tt.interrupted},
				{"incomplete", rep.Incomplete, tt.incomplete}} {
				if !slices.Equal(c.got, c.want) && len(c.got)+len(c.want) > 0 {
					t.Fatalf("%s %q, want %q", c.name, c.got, c.want)
				}
			}
			var lost uint64
			for _, l := range rep.Lost {
				lost += l.Events
			}
			if lost != tt.lost {
				t.Fatalf("lost %d, want %d (%+v)", lost, tt.lost, rep.Lost)
			}
		})
	}
}

// TestAuditSeqGapStillCaught: a gap next to a marker that does not cover it
// is still a seq-gap.
func TestAuditSeqGapStillCaught(t *testing.T) {
	evs := lose(stamp(cat(plainOK("a"), plainOK("b"), plainOK("c"))), 3, 3)
	evs = slices.DeleteFunc(evs, func(e event.Event) bool { return e.Seq == 4 }) // silently gone
	rep := audit(evs)
	var rules []string
	for _, v := range rep.Violations {
		rules = append(rules, v.Rule)
	}
	if !slices.Contains(rules, RuleSeqGap) || !slices.Contains(rules, RuleEventsLost) {
		t.Fatalf("violations %v", rep.Violations)
	}
}
