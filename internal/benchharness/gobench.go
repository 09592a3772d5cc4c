package benchharness

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// GoBench is one Go benchmark's medians over its runs (-count N).
type GoBench struct {
	Pkg     string // import path
	Name    string // without the -GOMAXPROCS suffix
	Runs    int
	Metrics map[string]float64 // unit → median: "ns/op", "B/op", "allocs/op", "MB/s", custom units
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
	return ParseGoBench(f)
}

// ParseGoBench parses `go test -bench` output: "pkg:" lines name the
// package of the benchmark lines that follow; each benchmark line is a
// name, an iteration count and value-unit pairs. Other lines are skipped.
// The result keeps the order of first appearance.
func ParseGoBench(r io.Reader) ([]GoBench, error) {
	type key struct{ pkg, name string }
	var order []key
	runs := map[key]map[string][]float64{}
	count := map[key]int{}
	pkg := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		if !strings.HasPrefix(line, "Benchmark") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || len(f)%2 != 0 {
			continue // "BenchmarkX" alone (a name printed before its output) or a log line
		}
		if _, err := strconv.ParseInt(f[1], 10, 64); err != nil {
			continue
		}
		k := key{pkg, trimProcs(f[0])}
		vals := map[string]float64{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("benchmark line %q: value %q: %w", line, f[i], err)
			}
			vals[f[i+1]] = v
		}
		if _, seen := runs[k]; !seen {
			order = append(order, k)
			runs[k] = map[string][]float64{}
		}
		for u, v := range vals {
			runs[k][u] = append(runs[k][u], v)
		}
		count[k]++
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := make([]GoBench, 0, len(order))
	for _, k := range order {
		b := GoBench{Pkg: k.pkg, Name: k.name, Runs: count[k], Metrics: map[string]float64{}}
		for u, vs := range runs[k] {
			b.Metrics[u] = MedianFloat(vs)
		}
		out = append(out, b)
	}
	return out, nil
}

// trimProcs drops the "-N" GOMAXPROCS suffix of a benchmark name.
func trimProcs(name string) string {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return name
	}
	if _, err := strconv.Atoi(name[i+1:]); err != nil {
		return name
	}
	return name[:i]
}
