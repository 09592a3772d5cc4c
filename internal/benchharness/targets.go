package benchharness

import (
	"fmt"
	"strings"
	"time"

	"github.com/onebitd/onebitd/machine"
)

// Targets of issue 11 (the shared route pays) and of issue 6 (onebitd's
// own share of the time), as `make bench` checks them.
const (
	// Decoder-facing handoff, shared / file (per-round ratio): ≤ 1 at the
	// shortest prompt, ≤ 1/10 at the longest.
	TargetSharedVsFileShort = 1.0
	TargetSharedVsFileLong  = 0.1
	// Share phase 12 722 : 251 (per-round ratio).
	TargetShareFlat = 1.2
	// Whole shared handoff (share + adopt phases), median, at the
	// shortest and the longest prompt.
	TargetSharedShort = 1 * time.Millisecond
	TargetSharedLong  = 2600 * time.Microsecond
	// onebitd's own shared handling (listen + share + adopt, outside calls
	// subtracted), median at every length, and its 12 722 : 251 ratio.
	TargetHandling      = 150 * time.Microsecond
	TargetHandlingRatio = 1.2
	// Warm provider: prefill phase − the provider's reported prefill_ms;
	// whole 251-token request − the provider's own prefill time.
	TargetWarmOverhead = 1 * time.Millisecond
	TargetWarmWhole    = 3 * time.Millisecond
	// Plain proxy at concurrency 1: onebitd's own (onebitd − bare proxy)
	// and the added latency (onebitd − direct), medians of per-round
	// differences.
	TargetProxyOwn   = 100 * time.Microsecond
	TargetProxyAdded = 300 * time.Microsecond
	// Throughput via onebitd / direct at concurrency 64.
	TargetThroughput64 = 0.90
	TargetTransition   = 5 * time.Microsecond // event log + NATS on
	TargetReplay       = 1e6                  // events/s
	TargetRSS          = 40 << 20             // bytes after RSSRequests requests
)

// Target is one line of the targets table.
type Target struct {
	What     string
	Measured string // the median (or the single figure), or why it was not measured
	CI       string // its 95 % confidence interval; "" when the figure has none
	Test     string // side by side: benchmath's comparison of the two samples; "" when none
	Goal     string // "" for a figure shown without a goal
	Met      bool
	// NotMeasured: the run could not take this figure (Measured says why).
	NotMeasured bool
	// Unsure: the confidence interval contains the goal, or there is none
	// (HasCI false), so met or not met may be noise.
	Unsure bool
	HasCI  bool
}

// Verdict is the table's last column.
func (t Target) Verdict() string {
	switch {
	case t.NotMeasured:
		return "not measured"
	case t.Goal == "":
		return "–"
	}
	v := "met"
	if !t.Met {
		v = "**not met**"
	}
	switch {
	case t.Unsure && t.HasCI:
		v += " (CI crosses the goal)"
	case t.Unsure:
		v += " (no interval)"
	}
	return v
}

// atMost is a target "x ≤ goal" for a measured median with its interval.
func atMost(what string, x, lo, hi, goal float64, hasCI bool) Target {
	return Target{What: what, Met: x <= goal, Unsure: !hasCI || (lo <= goal) != (hi <= goal), HasCI: hasCI}
}

// durTarget is "median ≤ goal" for a sample of durations.
func durTarget(what string, s Summary, goal time.Duration) Target {
	t := atMost(what, float64(s.Median), float64(s.Lo), float64(s.Hi), float64(goal), s.HasCI)
	t.Measured, t.CI, t.Goal = fmtMed(s), fmtCI(s), "≤ "+fmtDur(goal)
	if s.N == 0 {
		t = Target{What: what, Measured: "no sample", Goal: t.Goal, NotMeasured: true}
	}
	return t
}

// ratioTarget is "ratio ≤ goal" for a paired ratio; goal 0 shows the
// figure without a goal.
func ratioTarget(what string, st Stat, goal float64, detail string) Target {
	t := atMost(what, st.Center, st.Lo, st.Hi, goal, st.HasCI)
	t.Measured, t.CI = fmtRatio(st.Center), fmtRatioCI(st)
	if detail != "" {
		t.Measured += " (" + detail + ")"
	}
	if goal > 0 {
		t.Goal = fmt.Sprintf("≤ %.3g", goal)
	} else {
		t.Met, t.Unsure = false, false
	}
	if st.N == 0 {
		t = Target{What: what, Measured: "no paired sample", Goal: t.Goal, NotMeasured: true}
	}
	return t
}

func notMeasured(what, why string, goal time.Duration) Target {
	return Target{What: what, Measured: "not measured: " + why, Goal: "≤ " + fmtDur(goal), NotMeasured: true}
}

// Targets evaluates every target whose section ran, issue 11's first.
func (r *Results) Targets() []Target {
	var ts []Target
	if h := r.Handoff; h != nil {
		ts = append(ts, h.targets()...)
	}
	if p := r.Proxy; p != nil {
		own := durTarget("plain proxy: onebitd's own (onebitd − bare proxy, per round) at concurrency 1", p.AddedOwn, TargetProxyOwn)
		own.Test = "onebitd vs bare proxy: " + p.OwnCmp.String()
		added := durTarget("plain proxy: added latency (onebitd − direct, per round) at concurrency 1", p.Added, TargetProxyAdded)
		added.Test = "onebitd vs direct: " + p.AddedCmp.String()
		ts = append(ts, own, added)
		for _, t := range p.Throughput {
			if t.Concurrency == 64 {
				q := Ratio(t.RPS[TargetOnebitd], t.RPS[TargetDirect])
				ts = append(ts, Target{What: "plain proxy: throughput through onebitd / direct at concurrency 64 (one closed-loop window per side)",
					Measured: fmt.Sprintf("%.0f %%", 100*q), Goal: fmt.Sprintf("≥ %.0f %%", 100*TargetThroughput64), Met: q >= TargetThroughput64, Unsure: true})
			}
		}
	}
	if p := r.Pipeline; p != nil {
		for _, t := range p.Transition {
			if t.Config == SinkLogNATS {
				ts = append(ts, durTarget("per transition, event log + NATS on, median of runs", t.PerStep, TargetTransition))
			}
		}
		rate := Target{What: fmt.Sprintf("replay of a %s-event log (`onebitd replay`, audit included), at the median run", fmtEvents(p.ReplayN)), Measured: fmtRate(p.ReplayCmdRate),
			Goal: "≥ 1 M events/s", Met: p.ReplayCmdRate >= TargetReplay, Unsure: !p.ReplayCmd.HasCI}
		if s := p.ReplayCmd; s.HasCI {
			// The rate's interval is the time's, inverted.
			n := float64(p.ReplayN)
			rate.CI = fmtRate(n/s.Hi.Seconds()) + " – " + fmtRate(n/s.Lo.Seconds())
			rate.Unsure = (n/s.Hi.Seconds() >= TargetReplay) != (n/s.Lo.Seconds() >= TargetReplay)
			rate.HasCI = true
		}
		ts = append(ts, rate)
		if n := len(p.RSSSamples); n > 0 {
			last := p.RSSSamples[n-1]
			ts = append(ts, Target{What: fmt.Sprintf("onebitd RSS after %d requests (one reading)", last.Requests), Measured: fmtMB(last.RSS),
				Goal: fmt.Sprintf("≤ %d MB", TargetRSS>>20), Met: last.RSS <= TargetRSS, Unsure: true})
		}
	}
	return ts
}

// targets are section a's rows: shared vs file, flatness, the whole shared
// handoff, onebitd's own handling, the warm provider.
func (h *HandoffResult) targets() []Target {
	shared, file := string(machine.RouteShared), string(machine.RouteFile)
	first, last := HandoffSizes[0], HandoffSizes[len(HandoffSizes)-1]
	var ts []Target
	for _, n := range HandoffSizes {
		s, f := h.Row(shared, n), h.Row(file, n)
		if s == nil || f == nil {
			continue
		}
		goal := 0.0
		switch n {
		case first:
			goal = TargetSharedVsFileShort
		case last:
			goal = TargetSharedVsFileLong
		}
		t := ratioTarget(fmt.Sprintf("decoder-facing handoff, shared / file at %s tokens (per-round ratio)", fmtTokens(n)),
			PairedRatio(s.HandoffRounds, f.HandoffRounds), goal, fmt.Sprintf("medians: shared %s, file %s", fmtMed(s.Handoff), fmtMed(f.Handoff)))
		t.Test = "shared vs file: " + CompareDurations(s.HandoffRounds.Values(), f.HandoffRounds.Values()).String()
		ts = append(ts, t)
	}
	if lo, hi := h.Row(shared, first), h.Row(shared, last); lo != nil && hi != nil {
		t := ratioTarget(fmt.Sprintf("shared route: share phase %s : %s tokens (per-round ratio)", fmtTokens(last), fmtTokens(first)),
			PairedRatio(hi.RawRounds[PhaseShare], lo.RawRounds[PhaseShare]), TargetShareFlat,
			fmt.Sprintf("medians: %s / %s", fmtMed(hi.Raw[PhaseShare]), fmtMed(lo.Raw[PhaseShare])))
		t.Test = fmt.Sprintf("%s vs %s: %s", fmtTokens(last), fmtTokens(first), CompareDurations(hi.RawRounds[PhaseShare].Values(), lo.RawRounds[PhaseShare].Values()))
		ts = append(ts, t)
		ts = append(ts,
			durTarget(fmt.Sprintf("shared route: whole handoff (share + adopt phases) at %s tokens", fmtTokens(first)), lo.Handoff, TargetSharedShort),
			durTarget(fmt.Sprintf("shared route: whole handoff (share + adopt phases) at %s tokens", fmtTokens(last)), hi.Handoff, TargetSharedLong))
	}
	for _, n := range HandoffSizes {
		if row := h.Row(shared, n); row != nil {
			ts = append(ts, durTarget(fmt.Sprintf("shared route: onebitd's own handling (listen + share + adopt, outside calls subtracted) at %s tokens", fmtTokens(n)),
				row.Handling, TargetHandling))
		}
	}
	if lo, hi := h.Row(shared, first), h.Row(shared, last); lo != nil && hi != nil {
		ts = append(ts, ratioTarget(fmt.Sprintf("shared route: own handling %s : %s tokens (per-round ratio)", fmtTokens(last), fmtTokens(first)),
			PairedRatio(hi.HandlingRounds, lo.HandlingRounds), TargetHandlingRatio, ""))
	}
	ts = append(ts, h.Warm.targets()...)
	return ts
}

// fmtEvents is "1 M" for a million, else the count with spaces.
func fmtEvents(n int) string {
	if n%1_000_000 == 0 && n > 0 {
		return fmt.Sprintf("%d M", n/1_000_000)
	}
	return fmtTokens(n)
}

// fmtTokens writes a token count with a space per thousand (12 722).
func fmtTokens(n int) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteRune(' ')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// fmtCI is a Summary's interval, "lo – hi", or why there is none.
func fmtCI(s Summary) string {
	switch {
	case s.N == 0:
		return ""
	case !s.HasCI:
		return fmt.Sprintf("none (n = %d < 6)", s.N)
	}
	return fmtDur(s.Lo) + " – " + fmtDur(s.Hi)
}

// fmtRatio is a ratio with two decimals, or two significant digits below
// 0.1 (0.0016 rather than 0.00).
func fmtRatio(x float64) string {
	if x != 0 && x < 0.1 && x > -0.1 {
		return fmt.Sprintf("%.2g", x)
	}
	return fmt.Sprintf("%.2f", x)
}

// fmtRatioCI is a ratio's interval, "lo – hi", or why there is none.
func fmtRatioCI(st Stat) string {
	switch {
	case st.N == 0:
		return ""
	case !st.HasCI:
		return fmt.Sprintf("none (n = %d < 6)", st.N)
	}
	return fmtRatio(st.Lo) + " – " + fmtRatio(st.Hi)
}
