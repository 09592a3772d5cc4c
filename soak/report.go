package soak

import (
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

func (o outcome) String() string {
	switch o {
	case outIdentical:
		return "answered identical"
	case outCleanError:
		return "clean error"
	case outClientLeft:
		return "client left"
	}
	return "violation"
}

// row is one fault's counts.
type row struct {
	Injected   int
	Outcomes   map[outcome]int
	Routes     map[string]int
	LeakChecks int // requests after which something stayed behind
}

// StackReport is one stack's counts and final checks.
type StackReport struct {
	Baseline fds
	Requests int
	Final    FinalChecks
}

// FinalChecks are the checks made once the requests stopped.
type FinalChecks struct {
	Settled   string   // what stayed wrong at rest ("" when fine)
	FDs       fds      // onebitd's fds at the end
	FDLeak    string   // fds above the baseline ("" when fine)
	Open      []string // requests the event log never ended
	Requests  int      // requests in the event log
	ExitCode  int      // onebitd's exit status on SIGTERM
	AfterExit string   // processes left after onebitd exited
	Replay    string   // onebitd replay: "pass" or why not
}

// Report is the outcome of a soak.
type Report struct {
	Seed     uint64
	Duration time.Duration
	Elapsed  time.Duration
	Dir      string

	mu         sync.Mutex
	rows       map[string]*row
	stacks     map[string]*StackReport
	Violations []string
	Orphans    []string
	shapes     map[string]int // "entry stream=bool" → requests
}

func newReport(cfg Config) *Report {
	return &Report{Seed: cfg.Seed, Duration: cfg.Duration, rows: make(map[string]*row), stacks: make(map[string]*StackReport),
		shapes: make(map[string]int)}
}

func (r *Report) stack(name string) *StackReport {
	if r.stacks[name] == nil {
		r.stacks[name] = &StackReport{}
	}
	return r.stacks[name]
}

func (r *Report) baseline(name string, f fds) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stack(name).Baseline = f
}

// maxViolations bounds the list kept (the counts stay exact).
const maxViolations = 200

func (r *Report) add(stackName string, f *Fault, ep Entry, stream bool, o outcome, route string, leak bool, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shapes[fmt.Sprintf("%s %s", ep, map[bool]string{true: "stream", false: "whole"}[stream])]++
	rw := r.rows[f.Name]
	if rw == nil {
		rw = &row{Outcomes: map[outcome]int{}, Routes: map[string]int{}}
		r.rows[f.Name] = rw
	}
	rw.Injected++
	rw.Outcomes[o]++
	rw.Routes[route]++
	if leak {
		rw.LeakChecks++
	}
	r.stack(stackName).Requests++
	if why != "" && len(r.Violations) < maxViolations {
		r.Violations = append(r.Violations, f.Name+": "+why)
	}
}

func (r *Report) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rw := range r.rows {
		n += rw.Injected
	}
	return n
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failedLocked()
}

func (r *Report) failedLocked() bool {
	if len(r.Violations) > 0 || len(r.Orphans) > 0 {
		return true
	}
	for _, rw := range r.rows {
		if rw.Outcomes[outViolation] > 0 || rw.LeakChecks > 0 {
			return true
		}
	}
	for name, s := range r.stacks {
		if name == "plain" {
			continue
		}
		c := s.Final
		if c.Settled != "" || c.FDLeak != "" || len(c.Open) > 0 || c.ExitCode != 0 || c.AfterExit != "" || c.Replay != "pass" {
			return true
		}
	}
	return false
}

// Markdown writes the report: the fault table, the per-stack checks, and
// every violation.
func (r *Report) Markdown(w io.Writer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	verdict := "PASS"
	if r.failedLocked() {
		verdict = "FAIL"
	}
	total := 0
	for _, rw := range r.rows {
		total += rw.Injected
	}
	fmt.Fprintf(w, "Soak %s: %d requests in %v (asked %v), seed %d, finished %s.\n\n", verdict, total,
		r.Elapsed.Round(time.Second), r.Duration, r.Seed, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(w, "Machine: %s, %d CPUs, Linux %s, %s.\n\n", cpuModel(), runtime.NumCPU(), kernel(), runtime.Version())
	var shapes []string
	for _, k := range slices.Sorted(maps.Keys(r.shapes)) {
		shapes = append(shapes, fmt.Sprintf("%s %d", k, r.shapes[k]))
	}
	fmt.Fprintf(w, "Requests by entry point: %s.\n\n", strings.Join(shapes, ", "))
	fmt.Fprintln(w, "| fault | injected | outcome | routes (fallback@step) | leaks |")
	fmt.Fprintln(w, "|---|---:|---|---|---:|")
	for _, f := range Faults {
		rw := r.rows[f.Name]
		if rw == nil {
			fmt.Fprintf(w, "| %s | 0 | – | – | – |\n", f.Name)
			continue
		}
		var outs []string
		for _, o := range []outcome{outIdentical, outCleanError, outClientLeft, outViolation} {
			if n := rw.Outcomes[o]; n > 0 {
				outs = append(outs, fmt.Sprintf("%s %d", o, n))
			}
		}
		var routes []string
		for _, k := range slices.Sorted(maps.Keys(rw.Routes)) {
			routes = append(routes, fmt.Sprintf("%s %d", k, rw.Routes[k]))
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %d |\n", f.Name, rw.Injected, strings.Join(outs, ", "), strings.Join(routes, ", "), rw.LeakChecks)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| stack | requests | fds at start → end | at rest | open requests | SIGTERM exit | left after exit | replay |")
	fmt.Fprintln(w, "|---|---:|---|---|---:|---:|---|---|")
	for _, name := range []string{"file", "shared", "shared-warm"} {
		s := r.stacks[name]
		if s == nil {
			continue
		}
		c := s.Final
		rest := "ok"
		if c.Settled != "" || c.FDLeak != "" {
			rest = strings.TrimPrefix(c.Settled+"; "+c.FDLeak, "; ")
		}
		left := "none"
		if c.AfterExit != "" {
			left = c.AfterExit
		}
		fmt.Fprintf(w, "| %s | %d | %d → %d | %s | %d | %d | %s | %s |\n", name, s.Requests, s.Baseline.total(), c.FDs.total(),
			rest, len(c.Open), c.ExitCode, left, c.Replay)
	}
	fmt.Fprintln(w)
	if len(r.Orphans) > 0 {
		fmt.Fprintf(w, "Processes of the run left behind: %v\n\n", r.Orphans)
	}
	if len(r.Violations) > 0 {
		fmt.Fprintf(w, "Violations (first %d):\n\n", min(len(r.Violations), maxViolations))
		for _, v := range r.Violations {
			fmt.Fprintf(w, "* %s\n", v)
		}
		fmt.Fprintln(w)
	}
}

// cpuModel is the first "model name" of /proc/cpuinfo.
func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// kernel is the running kernel's release.
func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}
