package benchharness

import (
	"errors"
	"log/slog"
	"math"
	"math/bits"
	"slices"
	"strings"
	"testing"
	"time"
)

// The golden numbers below were checked twice: by hand (order statistics
// of the sorted values) and against benchstat on the same files
// (go run golang.org/x/perf/cmd/benchstat testdata/gobench-old.txt
// testdata/gobench-new.txt), which printed:
//
//	      │ gobench-old.txt │          gobench-new.txt           │
//	      │     sec/op      │   sec/op     vs base               │
//	Foo-2      1015.0n ± 8%   935.0n ± 7%  -7.88% (p=0.009 n=10)
//	B/op      64.00 ± 0%   64.00 ± 0%  ~ (p=1.000 n=10)
//
// old sorted: 950 980 990 1000 1010 1020 1040 1060 1100 1500 → median
// (1010+1020)/2 = 1015; for n = 10 the 95 % interval of the median is
// order statistics 2 and 9 (confidence 1 − 2·11/1024 = 0.979): 980 – 1100,
// and benchstat's ± is max(1100/1015−1, 1−980/1015) = 8 %.
// new sorted: 870 900 910 920 930 940 960 985 1005 1200 → 935, 900 – 1005,
// ± max(7.5 %, 3.7 %) = 7 %; change 935/1015 − 1 = −7.88 %.

var (
	goldenOld = []float64{1000, 1040, 980, 1100, 1010, 950, 1020, 1500, 990, 1060}
	goldenNew = []float64{900, 930, 1005, 870, 940, 985, 910, 960, 1200, 920}
)

func TestEstimateGolden(t *testing.T) {
	tests := []struct {
		name                string
		in                  []float64
		center, lo, hi, pct float64 // pct: benchstat's ± (rounded to %)
		hasCI               bool
	}{
		{"old", goldenOld, 1015, 980, 1100, 8, true},
		{"new", goldenNew, 935, 900, 1005, 7, true},
		// n = 9: Bin(9, ½) gives order statistics 2 and 8 (confidence 0.961).
		{"1..9", []float64{9, 1, 8, 2, 7, 3, 6, 4, 5}, 5, 2, 8, 60, true},
		// n = 6 is benchmath's smallest with a 95 % interval: 1 and 6.
		{"six", []float64{6, 5, 4, 3, 2, 1}, 3.5, 1, 6, 71, true},
		{"five: no interval", []float64{1, 2, 3, 4, 5}, 3, 0, 0, 0, false},
		{"none", nil, 0, 0, 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.in)
			got := Estimate(tt.in)
			if got.Center != tt.center || got.HasCI != tt.hasCI || got.Lo != tt.lo || got.Hi != tt.hi || got.N != len(tt.in) {
				t.Fatalf("Estimate = %+v, want center %v CI %v [%v, %v]", got, tt.center, tt.hasCI, tt.lo, tt.hi)
			}
			if !slices.Equal(in, tt.in) {
				t.Fatal("Estimate reordered its input")
			}
			if tt.hasCI {
				if pct := math.Round(100 * math.Max(got.Hi/got.Center-1, 1-got.Lo/got.Center)); pct != tt.pct {
					t.Errorf("± %v %%, benchstat prints ± %v %%", pct, tt.pct)
				}
			}
		})
	}
}

func TestSummarizeInterval(t *testing.T) {
	s := Summarize(ms(10, 9, 8, 7, 6, 5, 4, 3, 2, 1))
	want := Summary{N: 10, Median: 5500 * time.Microsecond, Lo: 2 * time.Millisecond, Hi: 9 * time.Millisecond, HasCI: true,
		P99: 10 * time.Millisecond, Min: time.Millisecond, Max: 10 * time.Millisecond}
	if s != want {
		t.Fatalf("Summarize(1..10 ms) = %+v, want %+v", s, want)
	}
}

// exactUTestP is the two-sided exact Mann-Whitney p-value of a against b
// (no ties), by enumerating every way to pick len(a) of the pooled values:
// an independent check of benchmath's test.
func exactUTestP(a, b []float64) float64 {
	pool := append(slices.Clone(a), b...)
	slices.Sort(pool)
	rankOf := map[float64]int{}
	for i, v := range pool {
		rankOf[v] = i + 1
	}
	ra := 0
	for _, v := range a {
		ra += rankOf[v]
	}
	n, m := len(pool), len(a)
	var le, ge, total float64
	for mask := uint32(0); mask < 1<<n; mask++ {
		if bits.OnesCount32(mask) != m {
			continue
		}
		r := 0
		for i := range n {
			if mask&(1<<i) != 0 {
				r += i + 1
			}
		}
		total++
		if r <= ra {
			le++
		}
		if r >= ra {
			ge++
		}
	}
	return min(1, 2*min(le, ge)/total)
}

func TestCompareGolden(t *testing.T) {
	c := Compare(goldenOld, goldenNew)
	want := exactUTestP(goldenOld, goldenNew)
	if math.Abs(c.P-want) > 1e-9 {
		t.Fatalf("p = %v, exact enumeration %v", c.P, want)
	}
	if math.Abs(c.P-0.009) > 0.0005 || !c.Significant() || c.N1 != 10 || c.N2 != 10 {
		t.Fatalf("Compare = %+v, benchstat prints p=0.009 n=10", c)
	}
	if got := c.String(); got != "p=0.009 n=10" {
		t.Errorf("String = %q", got)
	}
	same := Compare([]float64{1, 2, 3, 4, 5, 6}, []float64{1.5, 2.5, 3.5, 4.5, 5.5, 6.5})
	if same.Significant() || !strings.Contains(same.String(), "no significant difference") {
		t.Errorf("interleaved samples: %+v %q", same, same)
	}
	if math.Abs(same.P-exactUTestP([]float64{1, 2, 3, 4, 5, 6}, []float64{1.5, 2.5, 3.5, 4.5, 5.5, 6.5})) > 1e-9 {
		t.Errorf("p = %v, exact enumeration differs", same.P)
	}
	if empty := Compare(nil, goldenNew); empty.Significant() || empty.String() != "–" {
		t.Errorf("no sample: %+v", empty)
	}
}

func TestPairedRatio(t *testing.T) {
	a, b := Rounds{}, Rounds{}
	for r := range 10 {
		b[r] = time.Millisecond
		a[r] = time.Duration(r+1) * time.Millisecond // ratio r+1
	}
	delete(b, 9) // round 9 fell back on one side: not paired
	b[42] = time.Millisecond
	got := PairedRatio(a, b)
	// Ratios 1..9: median 5, order statistics 2 and 8.
	if want := (Stat{N: 9, Center: 5, Lo: 2, Hi: 8, HasCI: true}); got != want {
		t.Fatalf("PairedRatio = %+v, want %+v", got, want)
	}
	if v := a.Values(); len(v) != 10 || v[0] != time.Millisecond || v[9] != 10*time.Millisecond {
		t.Fatalf("Values not in round order: %v", v)
	}
}

func TestParseGoBenchGolden(t *testing.T) {
	old, err := ParseGoBenchFile("testdata/gobench-old.txt")
	if err != nil {
		t.Fatal(err)
	}
	cur, err := ParseGoBenchFile("testdata/gobench-new.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(old) != 1 || old[0].Pkg != "example.com/x" || old[0].Name != "BenchmarkFoo" || old[0].Runs != 10 {
		t.Fatalf("parsed %+v", old)
	}
	if st := old[0].Stats["ns/op"]; st != (Stat{N: 10, Center: 1015, Lo: 980, Hi: 1100, HasCI: true}) {
		t.Fatalf("ns/op = %+v", st)
	}
	ds := CompareGoBench(old, cur)
	got := map[string]GoBenchDelta{}
	for _, d := range ds {
		got[d.Unit] = d
	}
	if len(ds) != 3 {
		t.Fatalf("%d deltas: %+v", len(ds), ds)
	}
	if d := got["ns/op"]; d.Delta() != "-7.88 %" || d.After.Center != 935 || d.Cmp.String() != "p=0.009 n=10" {
		t.Errorf("ns/op: %s %+v %s", d.Delta(), d.After, d.Cmp)
	}
	if d := got["B/op"]; d.Delta() != "~" {
		t.Errorf("B/op: %s (%s), benchstat prints ~", d.Delta(), d.Cmp)
	}
}

func TestParseGoBenchSyntaxErrors(t *testing.T) {
	in := "pkg: p\nBenchmarkA-2 10 5 ns/op\nBenchmarkB-2 10 abc ns/op\nBenchmarkC-2 x 5 ns/op\nBenchmarkA-2 10 7 ns/op\n"
	got, err := ParseGoBench(strings.NewReader(in))
	if !errors.Is(err, ErrGoBenchSyntax) {
		t.Fatalf("err = %v, want ErrGoBenchSyntax", err)
	}
	if !strings.Contains(err.Error(), ":3:") || !strings.Contains(err.Error(), ":4:") {
		t.Errorf("error does not name lines 3 and 4: %v", err)
	}
	if len(got) != 1 || got[0].Runs != 2 || got[0].NsPerOp() != 6 {
		t.Fatalf("the good lines: %+v", got)
	}
}

func TestTargetVerdict(t *testing.T) {
	us := func(n ...int) []time.Duration {
		out := make([]time.Duration, len(n))
		for i, v := range n {
			out[i] = time.Duration(v) * time.Microsecond
		}
		return out
	}
	tests := []struct {
		name    string
		in      []time.Duration
		verdict string
	}{
		{"all below", us(80, 81, 82, 83, 84, 85, 86, 87, 88, 89), "met"},
		{"all above", us(120, 121, 122, 123, 124, 125, 126, 127, 128, 129), "**not met**"},
		{"median below, interval across", us(60, 70, 80, 90, 95, 99, 104, 108, 130, 140), "met (CI crosses the goal)"},
		{"median above, interval across", us(60, 97, 99, 101, 102, 103, 104, 105, 106, 140), "**not met** (CI crosses the goal)"},
		{"too few for an interval", us(10, 20, 30), "met (no interval)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tg := durTarget("x", Summarize(tt.in), 100*time.Microsecond)
			if got := tg.Verdict(); got != tt.verdict {
				t.Fatalf("verdict %q, want %q (%+v)", got, tt.verdict, tg)
			}
		})
	}
	if got := durTarget("x", Summary{}, time.Millisecond).Verdict(); got != "not measured" {
		t.Fatalf("no sample: %q", got)
	}
}

// FuzzParseGoBench: any bytes parse without a panic; every benchmark has
// runs, at most one value per run and unit, and a median within its values.
func FuzzParseGoBench(f *testing.F) {
	f.Add("pkg: p\nBenchmarkA-2 10 5 ns/op 3 B/op\nBenchmarkA-2 10 7 ns/op 3 B/op\n")
	f.Add("BenchmarkX\nBenchmarkX-8 1 1e9 ns/op 2.5 MB/s\nPASS\n")
	f.Add("Unit ns/op assume=exact\nBenchmarkY 3 1 ns/op\n")
	f.Add("BenchmarkZ-2 10 abc ns/op\n")
	f.Fuzz(func(t *testing.T, in string) {
		bs, err := ParseGoBench(strings.NewReader(in))
		if err != nil && !errors.Is(err, ErrGoBenchSyntax) {
			t.Fatalf("error without the sentinel: %v", err)
		}
		for _, b := range bs {
			if b.Runs < 1 {
				t.Fatalf("%s: %d runs", b.Name, b.Runs)
			}
			for u, vs := range b.Values {
				if len(vs) > b.Runs || len(vs) == 0 {
					t.Fatalf("%s %s: %d values in %d runs", b.Name, u, len(vs), b.Runs)
				}
				lo, hi := slices.Min(vs), slices.Max(vs)
				if m := b.Metrics[u]; !(m >= lo && m <= hi) && !math.IsNaN(m) && !math.IsInf(lo, 0) && !math.IsInf(hi, 0) {
					t.Fatalf("%s %s: median %v outside [%v, %v]", b.Name, u, m, lo, hi)
				}
			}
		}
	})
}

func TestFmtRatio(t *testing.T) {
	for x, want := range map[float64]string{0: "0.00", 0.0016: "0.0016", 0.06: "0.06", 0.25: "0.25", 1.854: "1.85", 12: "12.00"} {
		if got := fmtRatio(x); got != want {
			t.Errorf("fmtRatio(%v) = %q, want %q", x, got, want)
		}
	}
	if got := fmtRatioCI(Stat{N: 9, Lo: 0.0011, Hi: 0.0029, HasCI: true}); got != "0.0011 – 0.0029" {
		t.Errorf("fmtRatioCI = %q", got)
	}
}

// TestReportedPrefill: the warm provider's job log line gives the request
// in flight its provider-reported prefill time; other records are ignored.
func TestReportedPrefill(t *testing.T) {
	calls := &callLog{}
	log := slog.New(&reportedPrefill{log: calls}).With("path", "/bin/p")
	log.Debug("warm provider job done", "n_tokens", 251, "prefill_ms", 8.5, "elapsed", time.Millisecond)
	log.Info("unrelated", "prefill_ms", "not a number")
	got := calls.take()
	if len(got) != 1 || got[0].op != opPrefillReported || got[0].reported != 8500*time.Microsecond {
		t.Fatalf("calls = %+v", got)
	}
	if _, r := sum(got, opPrefillReported); r != 8500*time.Microsecond {
		t.Fatalf("sum = %v", r)
	}
}

func TestWarmResult(t *testing.T) {
	h := &HandoffResult{}
	if w := warmResult(h, false); !strings.Contains(w.NotMeasured, "no warm provider configured") {
		t.Errorf("without the mode: %+v", w)
	}
	if w := warmResult(h, true); w.NotMeasured == "" {
		t.Errorf("no warm rows: %+v", w)
	}
	over := Summarize(ms(1, 1, 1, 1, 1, 1))
	h.Rows = append(h.Rows, HandoffRow{Route: RouteSharedWarm, Tokens: HandoffSizes[0], ProviderReported: over, PrefillOverhead: over, WholeOverReported: over})
	w := warmResult(h, true)
	if w.NotMeasured != "" || w.Overhead != over {
		t.Fatalf("measured: %+v", w)
	}
	ts := w.targets()
	if len(ts) != 2 || ts[0].Verdict() != "met" || ts[1].Verdict() != "met" || ts[0].CI != "1.00 ms – 1.00 ms" {
		t.Fatalf("targets: %+v", ts)
	}
}
