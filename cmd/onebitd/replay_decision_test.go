package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/event"
)

// TestReplayShowsDecisions: a timeline shows each request's handoff
// decision and its inputs (issue 13), and the audit flags a request that
// both skipped and handed over.
func TestReplayShowsDecisions(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	base := event.Event{V: 1, Boot: "b1", Node: "n", Time: t0, Slot: 0}
	mk := func(seq uint64, id, route, ev, from, to string, f func(*event.Event)) event.Event {
		e := base
		e.Seq, e.RequestID, e.Route, e.Event, e.From, e.To = seq, id, route, ev, from, to
		if f != nil {
			f(&e)
		}
		return e
	}
	ok := []event.Event{
		mk(1, "r1", "plain", "forward", "received", "forwarding", func(e *event.Event) {
			e.Decision, e.DecisionBasis, e.PredictedDecoder, e.PredictedHandoff, e.TokensHeld, e.TokensPrefill =
				"skip", "model", 4200, 21500, 300, 12
		}),
		mk(2, "r1", "plain", "finish", "forwarding", "done", nil),
	}
	bad := []event.Event{
		mk(1, "r2", "shared", "listen", "received", "listening", func(e *event.Event) { e.Decision, e.DecisionBasis = "skip", "floor" }),
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		evs  []event.Event
		code int
		want string
	}{
		{"skip", ok, 0, "decision=skip (model, decoder 4.2ms vs handoff 21.5ms)  held=300  prefill=12"},
		{"skip then handoff", bad, 1, "skip-and-handoff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".jsonl")
			if err := os.WriteFile(path, encodeLog(tc.evs), 0o600); err != nil {
				t.Fatal(err)
			}
			out, errs, code := replayRun(t, path)
			if code != tc.code || !strings.Contains(out+errs, tc.want) {
				t.Fatalf("exit %d (want %d), output lacks %q:\n%s%s", code, tc.code, tc.want, out, errs)
			}
		})
	}
}
