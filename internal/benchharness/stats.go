package benchharness

import (
	"math"
	"slices"
	"time"
)

// Summary describes one sample of durations.
type Summary struct {
	N      int
	Median time.Duration
	P99    time.Duration
	Min    time.Duration
	Max    time.Duration
}

// Summarize returns the median, p99 (nearest rank), min and max of ds; a
// zero Summary for no samples. ds is not modified.
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return Summary{N: len(s), Median: median(s), P99: rank(s, 0.99), Min: s[0], Max: s[len(s)-1]}
}

// median of sorted s (the mean of the middle two for an even count).
func median(s []time.Duration) time.Duration {
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// rank is the nearest-rank q-quantile of sorted s.
func rank(s []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// MedianFloat is the median of xs (0 for none).
func MedianFloat(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Ratio is a/b, or 0 when b is 0.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// durRatio is a/b of two durations.
func durRatio(a, b time.Duration) float64 { return Ratio(float64(a), float64(b)) }
