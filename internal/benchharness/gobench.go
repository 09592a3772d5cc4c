package benchharness

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/perf/benchfmt"
)

// GoBench is one Go benchmark's runs (-count N), parsed by
// golang.org/x/perf/benchfmt, with benchmath's median and 95 % confidence
// interval per unit.
type GoBench struct {
	Pkg     string // import path (the "pkg:" line)
	Name    string // "Benchmark…" without the -GOMAXPROCS suffix
	Runs    int
	Metrics map[string]float64   // unit → median: "ns/op", "B/op", "allocs/op", "MB/s", custom units
	Stats   map[string]Stat      // unit → median with its confidence interval
	Values  map[string][]float64 // unit → every run's value, in file order
}

// NsPerOp is the median ns/op.
func (b GoBench) NsPerOp() float64 { return b.Metrics["ns/op"] }

// ParseGoBenchFile parses `go test -bench` output saved in path.
func ParseGoBenchFile(path string) ([]GoBench, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseGoBench(f, path)
}

// ParseGoBench parses `go test -bench` output (the Go benchmark format, read
// by benchfmt): "pkg:" lines name the package of the benchmark lines that
// follow; each benchmark line is a name, an iteration count and value-unit
// pairs, in the units as printed (not benchfmt's tidied ones). A name alone
// on its line and other lines are skipped. The result keeps the order of
// first appearance. Malformed benchmark lines are reported as one error
// wrapping ErrGoBenchSyntax alongside the benchmarks that did parse.
func ParseGoBench(r io.Reader) ([]GoBench, error) { return parseGoBench(r, "") }

func parseGoBench(r io.Reader, name string) ([]GoBench, error) {
	type key struct{ pkg, name string }
	var order []key
	byKey := map[key]*GoBench{}
	var bad []error
	rd := benchfmt.NewReader(r, name)
	for rd.Scan() {
		switch rec := rd.Result().(type) {
		case *benchfmt.SyntaxError:
			bad = append(bad, rec)
		case *benchfmt.Result:
			k := key{rec.GetConfig("pkg"), "Benchmark" + trimProcs(rec.Name)}
			b := byKey[k]
			if b == nil {
				b = &GoBench{Pkg: k.pkg, Name: k.name, Metrics: map[string]float64{}, Stats: map[string]Stat{}, Values: map[string][]float64{}}
				byKey[k] = b
				order = append(order, k)
			}
			b.Runs++
			seen := map[string]bool{}
			for i := len(rec.Values) - 1; i >= 0; i-- { // a unit twice on a line: the last one counts
				v := rec.Values[i]
				u, x := v.Unit, v.Value
				if v.OrigUnit != "" { // benchfmt tidied ns/op into sec/op: keep what go test printed
					u, x = v.OrigUnit, v.OrigValue
				}
				if !seen[u] {
					seen[u] = true
					b.Values[u] = append(b.Values[u], x)
				}
			}
		}
	}
	if err := rd.Err(); err != nil {
		return nil, err
	}
	out := make([]GoBench, 0, len(order))
	for _, k := range order {
		b := byKey[k]
		for u, xs := range b.Values {
			b.Stats[u] = Estimate(xs)
			b.Metrics[u] = b.Stats[u].Center
		}
		out = append(out, *b)
	}
	if len(bad) > 0 {
		return out, fmt.Errorf("%w: %w", ErrGoBenchSyntax, errors.Join(bad...))
	}
	return out, nil
}

// trimProcs drops the "-N" GOMAXPROCS suffix of a benchmark name (benchfmt
// keeps it as the name's last part).
func trimProcs(n benchfmt.Name) string {
	base, parts := n.Parts()
	s := string(base)
	for _, p := range parts {
		if len(p) > 0 && p[0] == '-' {
			continue
		}
		s += string(p)
	}
	return s
}

// GoBenchDelta is one benchmark and unit in two `go test -bench` outputs
// (before → after), compared as benchstat does.
type GoBenchDelta struct {
	Pkg, Name, Unit string
	Before, After   Stat
	Cmp             Comparison
}

// Delta is benchstat's delta column: the change of the medians in percent,
// or "~" when the samples do not differ significantly.
func (d GoBenchDelta) Delta() string {
	if !d.Cmp.Significant() {
		return "~"
	}
	if d.Before.Center == 0 {
		return "?"
	}
	return fmt.Sprintf("%+.2f %%", 100*(d.After.Center/d.Before.Center-1))
}

// CompareGoBench pairs the benchmarks of before and after by package, name
// and unit (ns/op, B/op, allocs/op and custom units), in after's order.
func CompareGoBench(before, after []GoBench) []GoBenchDelta {
	type key struct{ pkg, name string }
	old := map[key]GoBench{}
	for _, b := range before {
		old[key{b.Pkg, b.Name}] = b
	}
	var out []GoBenchDelta
	for _, a := range after {
		b, ok := old[key{a.Pkg, a.Name}]
		if !ok {
			continue
		}
		units := sortedUnits(a.Metrics)
		slices.SortStableFunc(units, func(x, y string) int { return unitRank(x) - unitRank(y) })
		for _, u := range units {
			bv, ok := b.Values[u]
			if !ok {
				continue
			}
			out = append(out, GoBenchDelta{Pkg: a.Pkg, Name: a.Name, Unit: u, Before: b.Stats[u], After: a.Stats[u], Cmp: Compare(bv, a.Values[u])})
		}
	}
	return out
}

// unitRank puts time first, then bytes and allocations, then custom units
// (as benchstat's tables).
func unitRank(u string) int {
	switch u {
	case "ns/op":
		return 0
	case "B/op":
		return 1
	case "allocs/op":
		return 2
	}
	return 3
}
