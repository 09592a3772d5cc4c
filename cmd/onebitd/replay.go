package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/mattn/go-isatty"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
	"github.com/onebitd/onebitd/machine"
)

const replayUsage = `usage: onebitd replay [--request ID] [--failed] [--json] [--node N] [--since T] FILE...
       onebitd replay [--request ID] [--failed] [--json] [--node N] [--since T] --stream ONEBIT
              [--nats-url URLS] [--nats-creds FILE | --nats-nkey FILE] [--nats-tls-ca FILE]

Rebuilds every request's state machine from event logs (or a JetStream
stream), prints timelines and audits the handoff rules (eventlog/doc.go).

  (default)      every request's timeline, as each request ends
  --request ID   only that request's timeline
  --failed       only fallbacks and failed requests: reason and failing step
  --json         the selected events as JSON lines, then {"report": ...}
  --node N       only node N's events (timelines and audit); with --stream
                 the server sends only that node's subjects
  --since T      print only requests that began at or after T (RFC 3339, or a
                 duration before now: 90m); the audit still covers every event
                 read, since a request cut in two by a time would look broken
  --stream NAME  read JetStream stream NAME (ONEBIT) instead of files, from
                 --nats-url (default ` + bus.DefaultURL + `) as --nats-creds or
                 --nats-nkey (default ./onebitd-state/` + bus.ReaderCredsFile + ` if present)

Exit status: 0 audit passed (a torn last line is only a warning), 1 a rule
was violated (each violation names the request and the rule) or the request
asked for is not in the log, 2 usage or read error.
`

// progressMinBytes: below this, logs replay too fast for a progress bar.
const progressMinBytes = 64 << 20

func replayMain(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return runReplay(ctx, args, os.Stdout, os.Stderr, isatty.IsTerminal(os.Stderr.Fd()))
}

type replayConfig struct {
	request, stream string
	node            string
	since           time.Time
	failed, json    bool
	files           []string
	nats            *natsFlags
}

// parseReplayArgs parses flags anywhere among the file names.
func parseReplayArgs(args []string, stderr io.Writer) (replayConfig, error) {
	var c replayConfig
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, replayUsage) }
	fs.StringVar(&c.request, "request", "", "print only this request's timeline")
	fs.BoolVar(&c.failed, "failed", false, "print only fallbacks and failed requests")
	fs.BoolVar(&c.json, "json", false, "JSON lines output")
	fs.StringVar(&c.node, "node", "", "only this node's events")
	since := fs.String("since", "", "print only requests that began at or after this time (RFC 3339, or a duration before now)")
	c.nats = addNATSFlags(fs, bus.DefaultURL)
	fs.StringVar(&c.stream, "stream", "", "the JetStream stream (ONEBIT)")
	for {
		if err := fs.Parse(args); err != nil {
			return c, err
		}
		if fs.NArg() == 0 {
			break
		}
		c.files = append(c.files, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if *since != "" {
		t, err := parseSince(*since, time.Now())
		if err != nil {
			return c, err
		}
		c.since = t
	}
	switch {
	case c.request != "" && c.failed:
		return c, errors.New("--request and --failed do not go together")
	case c.stream == "" && len(c.nats.set()) > 0:
		return c, fmt.Errorf("%s and --stream go together", strings.Join(c.nats.set(), ", "))
	case c.stream != "" && len(c.files) > 0:
		return c, errors.New("give log files or --stream, not both")
	case c.stream == "" && len(c.files) == 0:
		return c, errors.New("no log file given")
	}
	return c, nil
}

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer, tty bool) int {
	c, err := parseReplayArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "onebitd replay: %v\n\n%s", err, replayUsage)
		return 2
	}
	bw := bufio.NewWriterSize(stdout, 64<<10)
	out := &replayPrinter{w: bw, json: c.json}

	var src eventlog.Source
	var total int64
	if c.stream != "" {
		client, _ := c.nats.resolve("onebitd replay")
		src = fromStream(c.stream, bus.StreamEventsOf(ctx, client, c.stream, c.node))
	} else {
		for _, f := range c.files {
			fi, err := os.Stat(f)
			if err != nil {
				fmt.Fprintf(stderr, "onebitd replay: %v\n", err)
				return 2
			}
			total += fi.Size()
		}
		src = eventlog.Files(c.files, func(t eventlog.TornTail) { out.torn = append(out.torn, t) })
	}

	a := eventlog.NewAuditor()
	found := false
	inWindow := func(evs []event.Event) bool { return c.since.IsZero() || !evs[0].Time.Before(c.since) }
	switch {
	case c.failed:
	case c.request != "":
		a.Filter = func(id string) bool { return id == c.request }
		a.OnRequest = func(id string, evs []event.Event) {
			if inWindow(evs) {
				found = true
				out.timeline(id, evs)
			}
		}
	default:
		a.OnRequest = func(id string, evs []event.Event) {
			if inWindow(evs) {
				out.timeline(id, evs)
			}
		}
	}
	var bar *progress
	if tty && total >= progressMinBytes {
		bar = &progress{w: stderr, total: total}
	}
	source := ""
	for rec, err := range src {
		if err != nil {
			bar.clear()
			bw.Flush()
			fmt.Fprintf(stderr, "onebitd replay: %v\n", err)
			return 2
		}
		if rec.Source != source {
			source = rec.Source
			a.SetSource(source)
			bar.nextFile(source)
		}
		if c.node != "" && rec.Event.Node != c.node {
			continue
		}
		if c.failed && !rec.Event.Time.Before(c.since) && (rec.Event.Event == string(machine.EvFallback) || rec.Event.Event == string(machine.EvFail)) {
			out.failure(&rec.Event)
		}
		a.Add(rec.Line, rec.Event)
		bar.update(rec.Offset)
		if ctx.Err() != nil {
			bar.clear()
			bw.Flush()
			fmt.Fprintln(stderr, "onebitd replay: interrupted")
			return 2
		}
	}
	bar.clear()
	rep := a.Finish()
	out.summary(&rep)
	if err := cmp.Or(out.err, bw.Flush()); err != nil {
		fmt.Fprintf(stderr, "onebitd replay: write output: %v\n", err)
		return 2
	}
	switch {
	case !rep.OK():
		return 1
	case c.request != "" && !found:
		fmt.Fprintf(stderr, "onebitd replay: request %s is not in the log\n", c.request)
		return 1
	}
	return 0
}

// parseSince reads --since: an RFC 3339 time, or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--since %q is neither an RFC 3339 time (2026-11-30T12:00:00Z) nor a duration (90m)", s)
}

// fromStream numbers a stream's events as lines of source name.
func fromStream(name string, seq iter.Seq2[event.Event, error]) eventlog.Source {
	return func(yield func(eventlog.Record, error) bool) {
		n := 0
		for e, err := range seq {
			n++
			if !yield(eventlog.Record{Source: name, Line: n, Event: e}, err) || err != nil {
				return
			}
		}
	}
}

// replayPrinter writes timelines, failures and the summary, as text or JSON
// lines; it keeps the first write error.
type replayPrinter struct {
	w    io.Writer
	json bool
	torn []eventlog.TornTail
	buf  []byte
	err  error
	any  bool // something was printed before the summary
}

func (p *replayPrinter) flush() {
	if p.err == nil && len(p.buf) > 0 {
		_, p.err = p.w.Write(p.buf)
		p.any = true
	}
	p.buf = p.buf[:0]
}

func (p *replayPrinter) printf(format string, args ...any) {
	p.buf = fmt.Appendf(p.buf, format, args...)
}

// timeline prints one request's events (in flight if the last is not
// terminal).
func (p *replayPrinter) timeline(id string, evs []event.Event) {
	defer p.flush()
	if p.json {
		for i := range evs {
			p.buf = append(evs[i].AppendJSON(p.buf), '\n')
		}
		return
	}
	first, last := &evs[0], &evs[len(evs)-1]
	outcome := last.To
	if !machine.Terminal(machine.State(last.To)) {
		outcome = "in flight (" + last.To + ")"
	}
	p.printf("request %s  node %s  boot %s  slot %d  route %s  %s  %s\n", id, first.Node, first.Boot,
		first.Slot, last.Route, outcome, micros(last.ElapsedUS))
	for i := range evs {
		e := &evs[i]
		p.printf("  %s %10s  %-8s %s → %s%s\n", e.Time.UTC().Format("15:04:05.000000"), "+"+micros(e.ElapsedUS),
			e.Event, e.From, e.To, attrs(e))
	}
}

// failure prints one fallback or fail event.
func (p *replayPrinter) failure(e *event.Event) {
	defer p.flush()
	if p.json {
		p.buf = append(e.AppendJSON(p.buf), '\n')
		return
	}
	what := "fallback from " + e.From
	if e.Event == string(machine.EvFail) {
		what = "failed while forwarding"
	}
	p.printf("%s  node %s  request %s  slot %d  %s%s\n", e.Time.UTC().Format("2006-01-02T15:04:05.000000Z"), e.Node,
		e.RequestID, e.Slot, what, attrs(e))
}

func (p *replayPrinter) summary(r *eventlog.Report) {
	defer p.flush()
	if p.json {
		type out struct {
			Report *eventlog.Report    `json:"report"`
			Torn   []eventlog.TornTail `json:"torn"`
		}
		o := out{Report: r, Torn: p.torn}
		if o.Torn == nil {
			o.Torn = []eventlog.TornTail{}
		}
		b, err := json.Marshal(o)
		if err != nil {
			p.err = err
			return
		}
		p.buf = append(append(p.buf, b...), '\n')
		return
	}
	if p.any {
		p.printf("\n")
	}
	p.printf("audit: %d events, %d boots, %d requests (%d done, %d failed, %d interrupted, %d incomplete, %d in flight), %d fallbacks\n",
		r.Events, r.Boots, r.Requests, r.Done, r.Failed, len(r.Interrupted), len(r.Incomplete), len(r.InFlight), r.Fallbacks)
	for _, l := range []struct {
		what string
		ids  []string
	}{
		{"in flight", r.InFlight},
		{"interrupted (their boot ended without a shutdown line: a crash)", r.Interrupted},
		{"incomplete (their last events were lost)", r.Incomplete},
	} {
		if n := len(l.ids); n > 0 {
			const show = 20
			p.printf("%s: %s", l.what, strings.Join(l.ids[:min(n, show)], " "))
			if n > show {
				p.printf(" … and %d more", n-show)
			}
			p.printf("\n")
		}
	}
	for _, l := range r.Lost {
		p.printf("lost: %s\n", l)
	}
	for _, t := range p.torn {
		p.printf("warning: %s: torn last line %d (offset %d, %d bytes): %s\n", t.Path, t.Line, t.Offset, t.Bytes, t.Reason)
	}
	for _, v := range r.Violations {
		p.printf("violation: %s\n", v)
	}
	switch n := len(r.Violations); n {
	case 0:
		p.printf("audit: OK\n")
	case 1:
		p.printf("audit: FAILED, 1 violation\n")
	default:
		p.printf("audit: FAILED, %d violations\n", n)
	}
}

// attrs formats the optional fields worth a reader's eye.
func attrs(e *event.Event) string {
	var b []byte
	add := func(k, v string) {
		b = append(b, "  "...)
		b = append(b, k...)
		b = append(b, '=')
		b = append(b, v...)
	}
	if e.Decision != "" { // issue 13: why the request was (not) handed over
		d := e.Decision + " (" + e.DecisionBasis
		if e.PredictedDecoder != 0 || e.PredictedHandoff != 0 {
			d += ", decoder " + micros(e.PredictedDecoder) + " vs handoff " + micros(e.PredictedHandoff)
		}
		add("decision", d+")")
		add("held", strconv.Itoa(e.TokensHeld))
		add("prefill", strconv.Itoa(e.TokensPrefill))
	}
	if e.ShareID != nil {
		add("share_id", strconv.FormatInt(*e.ShareID, 10))
	}
	if e.NTokens != 0 {
		add("n_tokens", strconv.Itoa(e.NTokens))
	}
	if e.NFDs != 0 {
		add("n_fds", strconv.Itoa(e.NFDs))
	}
	if e.BytesMapped != 0 {
		add("bytes_mapped", strconv.FormatInt(e.BytesMapped, 10))
	}
	if e.HTTPStatus != 0 {
		add("http_status", strconv.Itoa(e.HTTPStatus))
	}
	if e.ProviderExit != nil {
		add("provider_exit", strconv.Itoa(*e.ProviderExit))
	}
	if e.Cleanup != nil {
		add("cleanup", fmt.Sprintf("%d fds closed, %d files removed", e.Cleanup.FDsClosed, e.Cleanup.FilesRemoved))
	}
	if e.Step != "" {
		add("step", e.Step)
	}
	if e.Reason != "" {
		add("reason", strconv.Quote(e.Reason))
	}
	return string(b)
}

// micros formats a duration given in microseconds: 850µs, 12.3ms, 4.20s.
func micros(us int64) string {
	switch {
	case us < 1000:
		return strconv.FormatInt(us, 10) + "µs"
	case us < 1_000_000:
		return strconv.FormatFloat(float64(us)/1e3, 'f', 1, 64) + "ms"
	}
	return strconv.FormatFloat(float64(us)/1e6, 'f', 2, 64) + "s"
}

// progress is a one-line progress bar on a terminal.
type progress struct {
	w       io.Writer
	total   int64
	base    int64 // bytes of the files already read
	fileLen int64
	last    time.Time
	n       int
}

func (p *progress) nextFile(path string) {
	if p == nil {
		return
	}
	p.base += p.fileLen
	p.fileLen = 0
	if fi, err := os.Stat(path); err == nil {
		p.fileLen = fi.Size()
	}
}

func (p *progress) update(off int64) {
	if p == nil {
		return
	}
	p.n++
	if p.n%4096 != 0 {
		return
	}
	if now := time.Now(); now.Sub(p.last) >= 100*time.Millisecond {
		p.last = now
		done := p.base + off
		const width = 30
		fill := int(int64(width) * done / max(p.total, 1))
		fmt.Fprintf(p.w, "\rreplay [%s%s] %3d%%  %d MiB of %d MiB  %d events",
			strings.Repeat("#", fill), strings.Repeat(".", width-fill), 100*done/max(p.total, 1),
			done>>20, p.total>>20, p.n)
	}
}

func (p *progress) clear() {
	if p == nil || p.last.IsZero() {
		return
	}
	fmt.Fprint(p.w, "\r\033[K")
}
