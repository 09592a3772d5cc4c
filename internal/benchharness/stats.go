package benchharness

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"golang.org/x/perf/benchmath"
)

// Confidence is the level of every confidence interval in the report.
const Confidence = 0.95

// thresholds are benchmath's defaults: α = 0.05 for a comparison.
var thresholds = &benchmath.DefaultThresholds

// Summary describes one sample of durations. Median and its confidence
// interval come from golang.org/x/perf/benchmath, assuming nothing about
// the distribution (the median with an order-statistics interval, as
// benchstat prints); p99, min and max are order statistics.
type Summary struct {
	N      int
	Median time.Duration
	// Lo and Hi bound Median at Confidence when HasCI; with fewer than 6
	// values benchmath has no finite 95 % interval and HasCI is false.
	Lo, Hi time.Duration
	HasCI  bool
	P99    time.Duration
	Min    time.Duration
	Max    time.Duration
}

// Summarize returns the median with its 95 % confidence interval, p99
// (nearest rank), min and max of ds; a zero Summary for no samples. ds is
// not modified.
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	xs := make([]float64, len(s))
	for i, d := range s {
		xs[i] = float64(d)
	}
	e := Estimate(xs)
	out := Summary{N: len(s), Median: time.Duration(math.Round(e.Center)), P99: rank(s, 0.99), Min: s[0], Max: s[len(s)-1]}
	if e.HasCI {
		out.Lo, out.Hi, out.HasCI = time.Duration(e.Lo), time.Duration(e.Hi), true
	}
	return out
}

// rank is the nearest-rank q-quantile of sorted s.
func rank(s []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Stat is a median with its confidence interval: benchmath's Summary of a
// sample of plain numbers (ratios, rates, Go benchmark values).
type Stat struct {
	N              int
	Center, Lo, Hi float64
	HasCI          bool // false: too few values for a finite interval
}

// Estimate is the median of xs with its 95 % confidence interval
// (benchmath.AssumeNothing); the zero Stat for no values. xs is not
// modified.
func Estimate(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{}
	}
	s := benchmath.AssumeNothing.Summary(benchmath.NewSample(slices.Clone(xs), thresholds), Confidence)
	st := Stat{N: len(xs), Center: s.Center}
	if !math.IsInf(s.Lo, 0) && !math.IsInf(s.Hi, 0) {
		st.Lo, st.Hi, st.HasCI = s.Lo, s.Hi, true
	}
	return st
}

// Comparison is benchmath's test of two samples measured side by side
// (Mann-Whitney U, as benchstat): P is the p-value of "same distribution".
type Comparison struct {
	P      float64
	N1, N2 int
	Alpha  float64
	// Note is benchmath's warning (too few samples to tell a difference),
	// or "".
	Note string
}

// Significant reports whether the two samples differ at Alpha.
func (c Comparison) Significant() bool { return c.N1 > 0 && c.N2 > 0 && c.P <= c.Alpha }

// String is "p=0.002 n=30" (benchstat's form), with the verdict.
func (c Comparison) String() string {
	if c.N1 == 0 || c.N2 == 0 {
		return "–"
	}
	s := fmt.Sprintf("p=%.3f n=%d+%d", c.P, c.N1, c.N2)
	if c.N1 == c.N2 {
		s = fmt.Sprintf("p=%.3f n=%d", c.P, c.N1)
	}
	if !c.Significant() {
		s += ", no significant difference"
	}
	return s
}

// Compare tests whether a and b come from the same distribution.
func Compare(a, b []float64) Comparison {
	if len(a) == 0 || len(b) == 0 {
		return Comparison{N1: len(a), N2: len(b), Alpha: thresholds.CompareAlpha, P: 1}
	}
	c := benchmath.AssumeNothing.Compare(benchmath.NewSample(slices.Clone(a), thresholds), benchmath.NewSample(slices.Clone(b), thresholds))
	out := Comparison{P: c.P, N1: c.N1, N2: c.N2, Alpha: c.Alpha}
	if len(c.Warnings) > 0 {
		out.Note = c.Warnings[0].Error()
	}
	return out
}

// CompareDurations is Compare of two samples of durations.
func CompareDurations(a, b []time.Duration) Comparison { return Compare(floats(a), floats(b)) }

func floats(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d)
	}
	return out
}

// Rounds is one measurement per round of an interleaved run (round index
// → value); rounds whose request fell back are absent.
type Rounds map[int]time.Duration

// Values is the sample, in round order.
func (r Rounds) Values() []time.Duration {
	keys := slices.Sorted(maps.Keys(r))
	out := make([]time.Duration, len(keys))
	for i, k := range keys {
		out[i] = r[k]
	}
	return out
}

// PairedRatio is the median of a/b over the rounds both measured, with
// its 95 % confidence interval: the two sides were taken in the same round,
// so a busy moment slows both.
func PairedRatio(a, b Rounds) Stat {
	var xs []float64
	for k, va := range a {
		if vb, ok := b[k]; ok && vb > 0 {
			xs = append(xs, float64(va)/float64(vb))
		}
	}
	return Estimate(xs)
}

// MedianFloat is the median of xs (0 for none).
func MedianFloat(xs []float64) float64 { return Estimate(xs).Center }

// Ratio is a/b, or 0 when b is 0.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
