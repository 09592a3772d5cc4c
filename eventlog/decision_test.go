package eventlog

import (
	"testing"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/machine"
)

func decided(choice string) opt {
	return func(e *event.Event) { e.Decision, e.DecisionBasis = choice, "model" }
}

func plainRoute() opt { return func(e *event.Event) { e.Route = "plain" } }

// TestAuditSkipAndHandoff: issue 13's rule, a request never both skips the
// handoff and hands over.
func TestAuditSkipAndHandoff(t *testing.T) {
	skipped := func(id string) []event.Event {
		return []event.Event{
			ev(id, machine.EvForward, machine.Received, machine.Forwarding, decided("skip"), plainRoute()),
			ev(id, machine.EvFinish, machine.Forwarding, machine.Done, plainRoute()),
		}
	}
	handed := func(id string) []event.Event {
		evs := sharedOK(id, 1)
		decided("handoff")(&evs[0])
		return evs
	}
	tests := []struct {
		name   string
		events []event.Event
		bad    int // line of the violation, 0: none
	}{
		{"skip, plain", skipped("a"), 0},
		{"handoff, shared", handed("a"), 0},
		{"no decision (no provider, or tokenize fell back)", plainOK("a"), 0},
		{"skip, then a handoff", []event.Event{
			ev("a", machine.EvListen, machine.Received, machine.Listening, decided("skip")),
			ev("a", machine.EvShare, machine.Listening, machine.Shared, share(1), fds(4)),
		}, 1},
		{"skip on the shared route's forward", []event.Event{
			ev("a", machine.EvForward, machine.Received, machine.Forwarding, decided("skip")),
		}, 1},
		{"handoff forwarded straight", []event.Event{
			ev("a", machine.EvForward, machine.Received, machine.Forwarding, decided("handoff"), plainRoute()),
		}, 1},
		{"decision on a later event", func() []event.Event {
			evs := sharedOK("a", 1)
			decided("skip")(&evs[2])
			return evs
		}(), 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := audit(stamp(tc.events))
			var got []Violation
			for _, v := range rep.Violations {
				if v.Rule == RuleSkipAndHandoff {
					got = append(got, v)
				}
			}
			switch {
			case tc.bad == 0 && len(got) != 0:
				t.Fatalf("violations %v", got)
			case tc.bad != 0 && (len(got) != 1 || got[0].Line != tc.bad || got[0].RequestID != "a"):
				t.Fatalf("got %v, want one %s at line %d", got, RuleSkipAndHandoff, tc.bad)
			}
		})
	}
}
