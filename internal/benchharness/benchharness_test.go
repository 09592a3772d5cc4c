package benchharness

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if code, ok := BareProxyMain(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func ms(n ...int) []time.Duration {
	out := make([]time.Duration, len(n))
	for i, v := range n {
		out[i] = time.Duration(v) * time.Millisecond
	}
	return out
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name string
		in   []time.Duration
		want Summary
	}{
		{"empty", nil, Summary{}},
		{"one", ms(5), Summary{N: 1, Median: 5 * time.Millisecond, P99: 5 * time.Millisecond, Min: 5 * time.Millisecond, Max: 5 * time.Millisecond}},
		{"odd unsorted", ms(9, 1, 5), Summary{N: 3, Median: 5 * time.Millisecond, P99: 9 * time.Millisecond, Min: time.Millisecond, Max: 9 * time.Millisecond}},
		{"even", ms(1, 2, 3, 4), Summary{N: 4, Median: 2500 * time.Microsecond, P99: 4 * time.Millisecond, Min: time.Millisecond, Max: 4 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]time.Duration(nil), tt.in...)
			if got := Summarize(tt.in); got != tt.want {
				t.Fatalf("Summarize = %+v, want %+v", got, tt.want)
			}
			for i := range in {
				if in[i] != tt.in[i] {
					t.Fatal("Summarize reordered its input")
				}
			}
		})
	}
	// p99 by nearest rank: of 1..200 ms, the 198th.
	var s []time.Duration
	for i := 200; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	if got := Summarize(s).P99; got != 198*time.Millisecond {
		t.Fatalf("p99 of 1..200 ms = %v, want 198ms", got)
	}
}

func TestParseGoBench(t *testing.T) {
	out := `goos: linux
pkg: github.com/onebitd/onebitd/fdpass
cpu: AMD EPYC
BenchmarkReceive-2      	   11394	     91919 ns/op	  50.75 MB/s	   15609 B/op	      37 allocs/op
BenchmarkReceive-2      	   13975	     84904 ns/op	  54.94 MB/s	   15609 B/op	      37 allocs/op
BenchmarkReceive-2      	   14412	     83914 ns/op	  55.59 MB/s	   15609 B/op	      37 allocs/op
BenchmarkParseFrame
BenchmarkParseFrame-2   	   60277	     18618 ns/op
PASS
ok  	github.com/onebitd/onebitd/fdpass	10.1s
pkg: github.com/onebitd/onebitd/eventlog
BenchmarkEmit/batch-2 	 1000000	      1203 ns/op	 0 dropped	 12 B/op	 0 allocs/op
BenchmarkReplay-8 	 3	 600000000 ns/op	 1500000 events/s
`
	got, err := ParseGoBench(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		pkg, name string
		runs      int
		ns        float64
		extra     string
		extraV    float64
	}{
		{"github.com/onebitd/onebitd/fdpass", "BenchmarkReceive", 3, 84904, "MB/s", 54.94},
		{"github.com/onebitd/onebitd/fdpass", "BenchmarkParseFrame", 1, 18618, "", 0},
		{"github.com/onebitd/onebitd/eventlog", "BenchmarkEmit/batch", 1, 1203, "dropped", 0},
		{"github.com/onebitd/onebitd/eventlog", "BenchmarkReplay", 1, 6e8, "events/s", 1.5e6},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d benchmarks: %+v", len(got), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Pkg != w.pkg || g.Name != w.name || g.Runs != w.runs || g.NsPerOp() != w.ns {
			t.Errorf("benchmark %d = %+v, want %+v", i, g, w)
		}
		if w.extra != "" && g.Metrics[w.extra] != w.extraV {
			t.Errorf("%s %s = %v, want %v", w.name, w.extra, g.Metrics[w.extra], w.extraV)
		}
	}
	if _, err := ParseGoBench(strings.NewReader("BenchmarkX-2 10 abc ns/op\n")); err == nil {
		t.Fatal("a bad value parsed")
	}
}

func TestPromptText(t *testing.T) {
	for _, n := range append([]int{2, ProxyPromptTokens}, HandoffSizes...) {
		if got := promptTokens(promptText(n)); got != n {
			t.Errorf("promptText(%d) has %d tokens", n, got)
		}
	}
}

func TestProcParsers(t *testing.T) {
	if got := cpuModel("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t: x\n"); got != "AMD EPYC 7B13" {
		t.Errorf("cpuModel = %q", got)
	}
	if got := memTotal("MemTotal:       24683620 kB\nMemFree: 1 kB\n"); got != 24683620<<10 {
		t.Errorf("memTotal = %d", got)
	}
	if r, err := RSS(os.Getpid()); err != nil || r <= 0 {
		t.Errorf("RSS(self) = %d, %v", r, err)
	}
	if _, err := CPUTime(os.Getpid()); err != nil {
		t.Errorf("CPUTime(self): %v", err)
	}
	if _, err := RSS(-1); err == nil {
		t.Error("RSS of no process succeeded")
	}
}

// fakeHandoff is a HandoffResult with a flat shared route and a growing
// file route.
func fakeHandoff() *HandoffResult {
	h := &HandoffResult{Rounds: 3, SlotFS: "tmpfs at /dev/shm"}
	for i, n := range HandoffSizes {
		d := time.Duration(i+1) * time.Millisecond
		h.Rows = append(h.Rows,
			HandoffRow{Route: "file", Tokens: n, Handoff: Summary{N: 3, Median: 4 * d}, Handling: Summary{N: 3, Median: d}},
			HandoffRow{Route: "shared", Tokens: n, Handoff: Summary{N: 3, Median: time.Millisecond}, Handling: Summary{N: 3, Median: 100 * time.Microsecond}})
	}
	return h
}

func TestPlotIsWellFormedSVG(t *testing.T) {
	var b bytes.Buffer
	if err := fakeHandoff().Plot(&b); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(&b)
	lines := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("plot is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != 4 {
		t.Fatalf("%d polylines, want 4 (2 routes x raw/own)", lines)
	}
}

func TestTargets(t *testing.T) {
	r := &Results{Handoff: fakeHandoff(), Proxy: &ProxyResult{
		Added:      Summary{N: 1, Median: 250 * time.Microsecond},
		Throughput: []ThroughputRow{{Concurrency: 64, RPS: map[string]float64{TargetDirect: 1000, TargetOnebitd: 950}}},
	}}
	met := map[string]bool{}
	for _, tg := range r.Targets() {
		met[tg.What] = tg.Met
	}
	checks := map[string]bool{
		"shared route: share + adopt handling": true, // 100 µs everywhere
		"shared route: handling 12 722 : 251":  true, // flat
		"plain proxy: added latency":           false,
		"plain proxy: throughput":              true, // 95 %
	}
	for prefix, want := range checks {
		found := false
		for what, m := range met {
			if strings.HasPrefix(what, prefix) {
				found = true
				if m != want {
					t.Errorf("%s: met = %v, want %v", what, m, want)
				}
			}
		}
		if !found {
			t.Errorf("no target %q in %v", prefix, met)
		}
	}
	var md bytes.Buffer
	if err := r.Markdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"## Targets", "**not met**", "## a. Handoff", "## b. Proxy", PlotFile} {
		if !strings.Contains(md.String(), s) {
			t.Errorf("report lacks %q", s)
		}
	}
}

// TestRun runs every section with tiny counts against freshly built
// binaries: processes start, requests take their routes, the report renders,
// and no child is left behind.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and starts processes")
	}
	bin := t.TempDir()
	for _, c := range []string{"onebitd", "onebit-decoder-sim", "onebit-provider-sim"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, c), "./cmd/"+c)
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", c, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{BinDir: bin, WorkDir: t.TempDir(), SlotBase: t.TempDir(), Scale: 0.02})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range res.Handoff.Rows {
		if row.Fallbacks != 0 || row.Handoff.N == 0 || row.Handling.N == 0 {
			t.Errorf("%s route at %d tokens: %d fallbacks, %d samples", row.Route, row.Tokens, row.Fallbacks, row.Handoff.N)
		}
	}
	if len(res.Proxy.Throughput) != len(ProxyConcurrency) || res.Proxy.Latency[TargetBare].N == 0 {
		t.Errorf("proxy section incomplete: %+v", res.Proxy)
	}
	if p := res.Pipeline; len(p.Transition) != len(SinkConfigs) || p.ReplayCmdRate <= 0 || len(p.RSSSamples) == 0 {
		t.Errorf("pipeline section incomplete: %+v", p)
	}
	var md bytes.Buffer
	if err := res.Markdown(&md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "## c. Event pipeline") {
		t.Error("report lacks section c")
	}
}

func TestMissingBinary(t *testing.T) {
	_, err := Run(context.Background(), Config{BinDir: t.TempDir(), WorkDir: t.TempDir(), Sections: []string{"proxy"}})
	if !errors.Is(err, ErrNoBinary) {
		t.Fatalf("Run without binaries = %v, want ErrNoBinary", err)
	}
}
