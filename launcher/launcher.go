// Package launcher starts and supervises the decoder process (llama-server,
// or onebit-decoder-sim, which takes the same flags) for `onebitd serve
// --decoder-bin`.
//
// The decoder listens on a loopback port picked once and kept across
// restarts, so its URL never changes. Start waits until GET /health answers
// 200 (503 "Loading model" means keep waiting, up to Config.StallTimeout)
// and fails fast, with the decoder's last stderr lines, when the process
// exits first. After that a supervisor restarts a decoder that exits with an
// exponential backoff (capped at MaxRestartDelay); meanwhile Ready returns an
// error a client can read, which onebitd answers as 503.
//
// The decoder runs in its own process group (Setpgid) and dies with onebitd:
// Pdeathsig SIGKILL is set by a goroutine locked to its OS thread for the
// child's whole life (the kernel sends Pdeathsig when the thread that forked
// exits, not the process). Stop sends SIGTERM to the group, then SIGKILL
// after Config.StopGrace.
//
// Its stdout and stderr go line by line through slog (message "decoder
// output", attribute "decoder_output"); the last TailLines stderr lines are
// kept for error messages (internal/tailbuf). The process group is signalled
// only while the decoder is not reaped (internal/pgroup): once it exited,
// its leftovers are killed, then it is reaped, and no signal follows.
package launcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/event"
)

// Errors of this package.
var (
	// ErrConfig: a Config Start cannot run with.
	ErrConfig = errors.New("launcher: invalid configuration")
	// ErrExited: the decoder process exited before it answered /health 200.
	ErrExited = errors.New("launcher: the decoder exited before it was ready")
	// ErrStalled: the decoder did not answer /health 200 within StallTimeout.
	ErrStalled = errors.New("launcher: the decoder was not ready in time")
	// ErrNotReady: the decoder is starting, restarting or stopped; Ready
	// returns a *NotReadyError that wraps it.
	ErrNotReady = errors.New("launcher: the decoder is not ready")
)

// Defaults and limits.
const (
	DefaultHost         = "127.0.0.1"
	DefaultStallTimeout = 10 * time.Minute
	DefaultStopGrace    = 10 * time.Second
	// MaxRestartDelay caps the backoff between restarts.
	MaxRestartDelay = 10 * time.Second
	// TailLines is how many stderr lines are kept for error messages.
	TailLines = 20
	// stableRun: a decoder that served this long before it exited restarts
	// with the initial delay again.
	stableRun = time.Minute
	// waitDelay bounds how long Wait waits for the output pipes after the
	// process exited (a grandchild may hold them).
	waitDelay = 2 * time.Second
)

// Lifecycle event names (event.Event.Event).
const (
	EventStarting = "decoder.starting"
	EventReady    = "decoder.ready"
	EventExited   = "decoder.exited"
)

// Log attribute keys.
const (
	attrOutput  = "decoder_output"
	attrStream  = "stream"
	attrPID     = "pid"
	attrURL     = "url"
	attrError   = "error"
	attrDelay   = "delay"
	attrElapsed = "elapsed"
	attrBin     = "bin"
	attrArgs    = "args"
)

// Config tells Start what to run.
type Config struct {
	Bin     string   // llama-server (or onebit-decoder-sim) binary
	Args    []string // the user's args (after `--` on onebitd's command line)
	Model   string   // -m; empty: not passed (the user's args choose the model, e.g. -hf)
	SlotDir string   // --slot-save-path (required: the handoff's file route and probes need it)
	Slots   int      // -np (at least 1)
	Host    string   // listen host; default 127.0.0.1. The port is picked free once and kept across restarts.

	StallTimeout time.Duration // most time from start to /health 200; default 10m (loading a model is slow)
	StopGrace    time.Duration // time between SIGTERM and SIGKILL on Stop; default 10s

	Sink   event.Sink   // lifecycle events (EventStarting, EventReady, EventExited); nil: none
	Logger *slog.Logger // nil: discard
}

// reserved are flags the launcher sets itself; the user's args must not.
var reserved = []string{"--host", "--port", "--slot-save-path", "-np", "--parallel"}

func (c *Config) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...)
	}
	if c.Bin == "" {
		return bad("no decoder binary")
	}
	if c.SlotDir == "" {
		return bad("no slot directory (--slot-save-path)")
	}
	if c.Slots < 1 {
		return bad("slots %d: want at least 1", c.Slots)
	}
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = DefaultStallTimeout
	}
	if c.StopGrace <= 0 {
		c.StopGrace = DefaultStopGrace
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	res := reserved
	if c.Model != "" {
		res = append(res[:len(res):len(res)], "-m", "--model")
	}
	for _, a := range c.Args {
		for _, r := range res {
			if a == r || strings.HasPrefix(a, r+"=") {
				return bad("decoder argument %q: onebitd sets %s itself (use onebitd's own flags)", a, r)
			}
		}
	}
	return nil
}

// argv is the decoder's argument list for port.
func (c *Config) argv(port int) []string {
	a := []string{"--host", c.Host, "--port", strconv.Itoa(port)}
	if c.Model != "" {
		a = append(a, "-m", c.Model)
	}
	a = append(a, "--slot-save-path", c.SlotDir, "-np", strconv.Itoa(c.Slots))
	return append(a, c.Args...)
}

// NotReadyError is what Ready returns while the decoder cannot serve. Its
// message is meant for a client ("the decoder is restarting after it exited:
// signal: killed").
type NotReadyError struct{ Reason string }

func (e *NotReadyError) Error() string { return e.Reason }

// Unwrap returns ErrNotReady.
func (e *NotReadyError) Unwrap() error { return ErrNotReady }

// Decoder is one supervised decoder process.
type Decoder struct {
	cfg    Config
	log    *slog.Logger
	url    string
	port   int
	client *decoder.Client
	cancel context.CancelFunc
	done   chan struct{} // closed when the supervisor has stopped the process

	mu       sync.Mutex
	proc     *process // current process, nil when none
	notReady error    // nil when serving
}

// Start starts the decoder and waits until it answers /health 200, then
// supervises it until Stop is called. ctx bounds the start only (when it ends
// first the process is stopped and Start returns its error); a decoder that
// started keeps running after ctx ends, so that a server can drain its
// requests before it calls Stop. Start fails fast when the process exits
// before it is ready: the error wraps ErrExited and holds the decoder's last
// stderr lines.
func Start(ctx context.Context, cfg Config) (*Decoder, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	port, err := freePort(cfg.Host)
	if err != nil {
		return nil, err
	}
	url := "http://" + net.JoinHostPort(cfg.Host, strconv.Itoa(port))
	client, err := decoder.New(url, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d := &Decoder{
		cfg:      cfg,
		log:      cfg.Logger.With(attrURL, url),
		url:      url,
		port:     port,
		client:   client,
		done:     make(chan struct{}),
		notReady: &NotReadyError{Reason: "the decoder is starting"},
	}
	d.emit(EventStarting, "start")
	p, err := d.launch(ctx)
	if err != nil {
		d.emit(EventExited, err.Error())
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.cancel = cancel
	go d.supervise(sctx, p)
	return d, nil
}

// URL is the decoder's base URL (http://HOST:PORT), the same across restarts.
func (d *Decoder) URL() string { return d.url }

// PID is the current decoder process id, 0 while none runs.
func (d *Decoder) PID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil {
		return 0
	}
	select {
	case <-d.proc.exited:
		return 0
	default:
		return d.proc.pid
	}
}

// Ready returns nil while the decoder serves, else a *NotReadyError whose
// message a client can read.
func (d *Decoder) Ready() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.notReady
}

// Stop stops supervision and the decoder: SIGTERM to its process group,
// SIGKILL after StopGrace. It returns when the process has been reaped. It is
// safe to call more than once.
func (d *Decoder) Stop() error {
	d.cancel()
	<-d.done
	d.client.HTTP().CloseIdleConnections()
	return nil
}

func (d *Decoder) setState(p *process, notReady error) {
	d.mu.Lock()
	d.proc, d.notReady = p, notReady
	d.mu.Unlock()
}

func (d *Decoder) emit(name, reason string) {
	if d.cfg.Sink != nil {
		d.cfg.Sink.Emit(&event.Event{Event: name, Reason: reason})
	}
}

// launch spawns a process and waits until it is ready. On failure the
// process is gone (reaped) when launch returns.
func (d *Decoder) launch(ctx context.Context) (*process, error) {
	p, err := spawn(d.cfg.Bin, d.cfg.argv(d.port), d.log)
	if err != nil {
		return nil, err
	}
	d.setState(p, d.notReadyErr())
	t0 := time.Now()
	if err := d.waitReady(ctx, p); err != nil {
		p.terminate(d.cfg.StopGrace, d.log)
		return nil, err
	}
	p.readyAt = time.Now()
	d.setState(p, nil)
	d.log.Info("decoder ready", attrPID, p.pid, attrElapsed, time.Since(t0).Round(time.Millisecond))
	d.emit(EventReady, "")
	return p, nil
}

func (d *Decoder) notReadyErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.notReady
}

// waitReady polls /health until 200, the process exits, StallTimeout passes
// or ctx ends.
func (d *Decoder) waitReady(ctx context.Context, p *process) error {
	wctx, cancel := context.WithTimeout(ctx, d.cfg.StallTimeout)
	defer cancel()
	go func() {
		select {
		case <-p.exited:
			cancel()
		case <-wctx.Done():
		}
	}()
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(20*time.Millisecond),
		backoff.WithMaxInterval(time.Second),
		backoff.WithMaxElapsedTime(0),
	)
	var last error
	loggedLoading := false
	op := func() error {
		hctx, hcancel := context.WithTimeout(wctx, 5*time.Second)
		defer hcancel()
		last = d.client.Health(hctx)
		if last != nil && !loggedLoading && decoder.IsStatus(last, 503) {
			loggedLoading = true
			d.log.Info("decoder loading", attrPID, p.pid)
		}
		return last
	}
	if err := backoff.Retry(op, backoff.WithContext(b, wctx)); err == nil {
		return nil
	}
	select {
	case <-p.exited:
		return fmt.Errorf("%w: %s %s; its last stderr lines:\n%s", ErrExited, d.cfg.Bin, p.exitReason(), p.stderrTail())
	default:
	}
	if ctx.Err() != nil {
		return fmt.Errorf("launcher: waiting for the decoder: %w", ctx.Err())
	}
	return fmt.Errorf("%w: no /health 200 within %s (last: %v); its last stderr lines:\n%s", ErrStalled, d.cfg.StallTimeout, last, p.stderrTail())
}

// supervise watches p, restarts the decoder when it exits, and stops it when
// ctx ends.
func (d *Decoder) supervise(ctx context.Context, p *process) {
	defer close(d.done)
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(250*time.Millisecond),
		backoff.WithMaxInterval(MaxRestartDelay),
		backoff.WithMaxElapsedTime(0),
	)
	for {
		select {
		case <-ctx.Done():
			p.terminate(d.cfg.StopGrace, d.log)
			d.setState(nil, &NotReadyError{Reason: "the decoder is stopped"})
			return
		case <-p.exited:
		}
		reason := p.exitReason()
		d.log.Warn("decoder exited", attrPID, p.pid, attrError, reason, "stderr_tail", p.stderrTail())
		d.setState(nil, &NotReadyError{Reason: "the decoder is restarting after it exited: " + reason})
		d.emit(EventExited, reason)
		if !p.readyAt.IsZero() && time.Since(p.readyAt) > stableRun {
			bo.Reset()
		}
		for {
			delay := bo.NextBackOff()
			d.log.Info("decoder restart scheduled", attrDelay, delay)
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				d.setState(nil, &NotReadyError{Reason: "the decoder is stopped"})
				return
			case <-t.C:
			}
			d.emit(EventStarting, "restart after: "+reason)
			np, err := d.launch(ctx)
			if err == nil {
				p = np
				break
			}
			if ctx.Err() != nil {
				d.setState(nil, &NotReadyError{Reason: "the decoder is stopped"})
				return
			}
			reason = err.Error()
			d.log.Warn("decoder restart failed", attrError, err)
			d.setState(nil, &NotReadyError{Reason: "the decoder is restarting: " + firstLine(reason)})
			d.emit(EventExited, reason)
		}
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// freePort picks a free TCP port on host.
func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("launcher: pick a free port on %s: %w", host, err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		return 0, fmt.Errorf("launcher: pick a free port on %s: %w", host, err)
	}
	return port, nil
}
