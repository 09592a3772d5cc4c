// Package benchharness is the side-by-side performance harness behind
// `make bench` (cmd/onebit-bench). It starts the decoder simulator, the sim
// provider and onebitd as real processes on loopback, drives them with
// bounded request counts, and measures in the same run:
//
//   - the handoff against prompt length on the file and the shared route
//     (and the shared route with a warm provider when onebitd has
//     --provider-mode serve): each phase from the event log's elapsed_us,
//     and onebitd's own share of it (the same code in-process, with the
//     decoder's HTTP round trips and the provider's run timed and
//     subtracted per request);
//   - the plain proxy against talking to the decoder directly: latency at
//     concurrency 1, throughput at 8 and 64, time to the first streamed byte;
//   - the event pipeline: per-transition cost with the event log and NATS
//     on and off, replay speed of a generated one-million-event log, and
//     onebitd's resident memory while it serves 10 000 requests;
//   - with a real llama-server (Config.Llama: make bench LLAMA_SERVER=…
//     MODEL=…), onebitd launching it on the plain route and on the file
//     route (--prefill-bin, onebit-prefill) at once: time to the first
//     streamed token of each at three prompt lengths, the file route's
//     prefill and restore phases, prompt_n on both sides and whether the
//     texts match (skipped, with a line in the report, without it).
//
// Results are medians and p99 of samples taken interleaved (one request of
// each kind in turn), so that a noisy shared machine shifts both sides of a
// ratio alike. Statistics come from golang.org/x/perf: `go test -bench`
// output is read by benchfmt; every median carries benchmath's 95 %
// confidence interval (distribution-free, as benchstat prints it; none
// below 6 values), a ratio or difference of two sides is the median of
// per-round ratios or differences with its interval, and two samples
// measured side by side are compared with benchmath's Mann-Whitney U test.
// Report renders them as markdown with each target marked met or not met
// (and whether the interval crosses the goal), and Plot draws the handoff
// curve as SVG.
package benchharness

import "errors"

// Errors of this package.
var (
	// ErrNotReady: a child process did not print its ready line in time.
	ErrNotReady = errors.New("benchharness: process not ready")
	// ErrExited: a child process exited before it was ready.
	ErrExited = errors.New("benchharness: process exited before it was ready")
	// ErrBadResponse: a request through the stack did not take the expected
	// route or answered with an error.
	ErrBadResponse = errors.New("benchharness: unexpected response")
	// ErrMissingEvents: the event log lacks a transition a request made.
	ErrMissingEvents = errors.New("benchharness: event log lacks a transition")
	// ErrNoBinary: a binary the harness starts is not built.
	ErrNoBinary = errors.New("benchharness: binary not found (run make build)")
	// ErrGoBenchSyntax: a benchmark line of `go test -bench` output is
	// malformed (benchfmt's syntax error, with file and line, is wrapped).
	ErrGoBenchSyntax = errors.New("benchharness: malformed Go benchmark line")
)
