package provider

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/pgroup"
	"github.com/onebitd/onebitd/internal/tailbuf"
	"github.com/onebitd/onebitd/provjob"
)

// Errors of the warm provider (Warm.Run wraps one of them, or one of the
// runner's: ErrProviderTimeout, ErrProviderCanceled).
var (
	// ErrWarmExited: the warm provider exited before it served (StartWarm).
	ErrWarmExited = errors.New("provider: the warm provider exited before it was ready")
	// ErrWarmStalled: the warm provider's socket did not accept within
	// WarmConfig.StartTimeout (StartWarm).
	ErrWarmStalled = errors.New("provider: the warm provider was not ready in time")
	// ErrProviderNotReady: no warm provider serves right now (starting,
	// restarting or stopped), or its socket refused the job; nothing was
	// sent.
	ErrProviderNotReady = errors.New("provider: the warm provider is not ready")
	// ErrProviderFailed: the warm provider answered the job with a failure
	// (it closed the job's fds first; it keeps running).
	ErrProviderFailed = errors.New("provider: the warm provider failed the job")
	// ErrProviderLost: the job's connection closed, or the reply was not
	// valid: the provider's process group was killed before Run returned.
	ErrProviderLost = errors.New("provider: the warm provider did not answer the job")
)

// Warm provider defaults and lifecycle event names (DESIGN §5:
// onebit.<node>.provider.<what>).
const (
	DefaultWarmStartTimeout = time.Minute
	DefaultWarmStopGrace    = 5 * time.Second
	// warmKillWait bounds how long Run waits for a killed provider to be
	// gone (SIGKILL cannot be ignored; a process in uninterruptible sleep
	// can delay it).
	warmKillWait = 10 * time.Second

	EventWarmStarting = "provider.starting"
	EventWarmReady    = "provider.ready"
	EventWarmExited   = "provider.exited"
)

// WarmConfig tells StartWarm what to run: PATH --serve --socket SOCKET ARGS…
type WarmConfig struct {
	Path         string        // provider executable
	Args         []string      // extra args (--provider-arg), after the contract args
	Socket       string        // where the provider listens (<state-dir>/provider.sock); its directory should be 0700
	Timeout      time.Duration // one job, from dial to reply; on expiry the process group is killed. 0: the caller's context only
	StartTimeout time.Duration // from start until the socket accepts; default DefaultWarmStartTimeout
	StopGrace    time.Duration // SIGTERM to SIGKILL on Stop; default DefaultWarmStopGrace
	Sink         event.Sink    // lifecycle events; nil: none
	Logger       *slog.Logger  // nil: discard
}

// Warm is one supervised warm provider (DESIGN §2c). It is restarted with
// an exponential backoff when it exits, or when Run killed it. Safe for
// concurrent use: each Run is one job on its own connection.
type Warm struct {
	cfg    WarmConfig
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	proc     *warmProc // serving process, nil when none
	notReady error
}

type warmProc struct {
	pid     int
	child   *pgroup.Child
	exited  chan struct{} // closed after the reap and the output flush
	waitErr error
	tail    *tailbuf.Buffer
	readyAt time.Time
	killed  atomic.Pointer[string] // why Run killed it
}

// StartWarm starts the warm provider and waits until its socket accepts a
// connection, then supervises it until Stop. ctx bounds the start only.
func StartWarm(ctx context.Context, cfg WarmConfig) (*Warm, error) {
	if cfg.Path == "" || cfg.Socket == "" {
		return nil, fmt.Errorf("%w: a warm provider needs a path and a socket", ErrProviderStart)
	}
	if len(cfg.Socket) > 107 {
		return nil, fmt.Errorf("%w: socket path %s is %d bytes, a unix socket path has at most 107", ErrProviderStart, cfg.Socket, len(cfg.Socket))
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultWarmStartTimeout
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = DefaultWarmStopGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	w := &Warm{cfg: cfg, log: cfg.Logger.With(attrPath, cfg.Path), done: make(chan struct{}),
		notReady: &warmNotReady{"the warm provider is starting"}}
	w.emit(EventWarmStarting, "start")
	p, err := w.launch(ctx)
	if err != nil {
		w.emit(EventWarmExited, err.Error())
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.cancel = cancel
	go w.supervise(sctx, p)
	return w, nil
}

// warmNotReady is what Ready returns while no provider serves.
type warmNotReady struct{ reason string }

func (e *warmNotReady) Error() string { return e.reason }
func (e *warmNotReady) Unwrap() error { return ErrProviderNotReady }

// Ready returns nil while a provider serves, else an error (wrapping
// ErrProviderNotReady) that says why.
func (w *Warm) Ready() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.notReady
}

// PID is the serving provider's pid, 0 while none serves.
func (w *Warm) PID() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.proc == nil {
		return 0
	}
	return w.proc.pid
}

// Stop stops supervision and the provider (SIGTERM to its group, SIGKILL
// after StopGrace), waits until it is reaped and removes the socket. Safe
// to call more than once.
func (w *Warm) Stop() error {
	w.cancel()
	<-w.done
	if err := os.Remove(w.cfg.Socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("provider: remove the warm provider's socket: %w", err)
	}
	return nil
}

// Run sends job, with files' fds (shared route), to the provider on a new
// connection and waits for its reply, for at most WarmConfig.Timeout and
// ctx. Result.ExitCode is 0 on success, 1 when the provider failed the job
// itself, -1 otherwise. On a timeout, a cancellation, a closed connection,
// an invalid reply or a dead provider, the provider's process group is
// killed and gone before Run returns (DESIGN §2: once a request has fallen
// back nothing writes into the decoder's KV for it), and the supervisor
// restarts it. The caller keeps ownership of files.
func (w *Warm) Run(ctx context.Context, job *provjob.Job, files []*os.File) (res Result, err error) {
	log := w.log
	res.ExitCode = -1
	timeout := w.cfg.Timeout
	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		runCtx, cancel = context.WithTimeoutCause(ctx, timeout, errTimeout)
	}
	defer cancel()
	r := &Runner{Timeout: timeout} // for ctxError
	start := time.Now()
	fail := func(e *Error) (Result, error) {
		res.Duration = time.Since(start)
		res.TimedOut = e.Kind == ErrProviderTimeout
		res.Reason = e.Reason
		log.LogAttrs(context.Background(), slog.LevelDebug, "warm provider job failed",
			slog.Duration(attrElapsed, res.Duration), slog.String(attrError, e.Reason))
		return res, e
	}
	if err := job.Validate(len(files)); err != nil {
		return fail(&Error{Kind: ErrProviderStart, Reason: "provider job not sent: " + err.Error(), Err: err})
	}
	if cerr := r.ctxError(ctx, runCtx); cerr != nil {
		return fail(cerr)
	}
	w.mu.Lock()
	p, notReady := w.proc, w.notReady
	w.mu.Unlock()
	if p == nil {
		return fail(&Error{Kind: ErrProviderNotReady, Reason: notReady.Error(), Err: notReady})
	}
	var d net.Dialer
	c, err := d.DialContext(runCtx, "unix", w.cfg.Socket)
	if err != nil {
		if cerr := r.ctxError(ctx, runCtx); cerr != nil {
			return fail(cerr)
		}
		return fail(&Error{Kind: ErrProviderNotReady, Reason: "the warm provider does not accept jobs: " + err.Error(), Err: err})
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	if err := checkPeer(conn, p.pid); err != nil {
		return fail(&Error{Kind: ErrProviderNotReady, Reason: err.Error(), Err: err})
	}
	// The job's deadline and a cancellation close the connection, which
	// ends a blocked send or read; socket deadlines are not used, so an I/O
	// error that the deadline caused is always seen with runCtx done.
	stop := context.AfterFunc(runCtx, func() { _ = conn.Close() })
	defer stop()
	var reply provjob.Reply
	err = provjob.SendJob(conn, job, files, time.Time{})
	if err == nil {
		reply, err = provjob.ReadReply(conn, time.Time{})
	}
	if err != nil {
		// The provider holds the job's fds and may still write: it dies
		// before the request falls back.
		e := r.ctxError(ctx, runCtx)
		if e == nil {
			e = &Error{Kind: ErrProviderLost, Err: err}
			select {
			case <-p.exited:
				e.Reason = "the warm provider exited during the job: " + exitReason(p.waitErr)
			default:
				e.Reason = "the warm provider did not answer the job: " + err.Error()
			}
			if line := p.tail.Last(); line != "" {
				e.Reason += ": " + line
			}
			e.Reason += " (process group killed)"
		}
		w.kill(p, e.Reason)
		return fail(e)
	}
	res.Duration = time.Since(start)
	if !reply.OK {
		res.ExitCode = 1
		return fail(&Error{Kind: ErrProviderFailed, Reason: "provider failed: " + reply.Reason})
	}
	res.ExitCode = 0
	log.LogAttrs(ctx, slog.LevelDebug, "warm provider job done", slog.Int("n_tokens", reply.NTokens),
		slog.Float64("prefill_ms", reply.PrefillMs), slog.Duration(attrElapsed, res.Duration))
	return res, nil
}

// kill kills p's process group and waits until p is gone.
func (w *Warm) kill(p *warmProc, why string) {
	p.killed.CompareAndSwap(nil, &why)
	_ = p.child.Signal(syscall.SIGKILL) // ErrReaped: already gone
	t := time.NewTimer(warmKillWait)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		w.log.Error("warm provider still alive after SIGKILL", attrPID, p.pid, "waited", warmKillWait)
	}
}

// checkPeer checks that the socket's peer is the provider or a process of
// its group, running as our user.
func checkPeer(conn *net.UnixConn, pgid int) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("the warm provider's socket: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return fmt.Errorf("the warm provider's socket: peer credentials: %w", errors.Join(err, cerr))
	}
	if int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("the warm provider's socket is served by uid %d, not ours (%d)", cred.Uid, os.Geteuid())
	}
	if int(cred.Pid) == pgid {
		return nil
	}
	if g, err := processGroup(int(cred.Pid)); err != nil || g != pgid {
		return fmt.Errorf("the warm provider's socket is served by pid %d, not by the provider (pid %d) or its group", cred.Pid, pgid)
	}
	return nil
}

// processGroup reads pid's process group from /proc.
func processGroup(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+2:]) // state ppid pgrp …
	if len(f) < 3 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return strconv.Atoi(f[2])
}

func exitReason(err error) string {
	if err == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.String()
	}
	return err.Error()
}

func (w *Warm) emit(name, reason string) {
	if w.cfg.Sink != nil {
		w.cfg.Sink.Emit(&event.Event{Event: name, Reason: reason})
	}
}

func (w *Warm) setState(p *warmProc, notReady error) {
	w.mu.Lock()
	w.proc, w.notReady = p, notReady
	w.mu.Unlock()
}

// spawn starts PATH --serve --socket SOCKET ARGS… (pgroup.Start: own group,
// dies with onebitd); its stdout and stderr go line by line to the log.
func (w *Warm) spawn() (*warmProc, error) {
	if err := os.Remove(w.cfg.Socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: remove the old socket: %w", ErrProviderStart, err)
	}
	var pid atomic.Int64
	output := func(stream string) tailbuf.Options {
		return tailbuf.Options{MaxBytes: TailSize, MaxLines: tailLines, MaxLine: MaxLineLen, OnLine: func(line string) {
			w.log.Info("provider output", "stream", stream, attrPID, pid.Load(), attrStderr, line)
		}}
	}
	p := &warmProc{exited: make(chan struct{}), tail: tailbuf.New(output("stderr"))}
	stdout := tailbuf.New(output("stdout"))
	args := append([]string{"--serve", "--socket", w.cfg.Socket}, w.cfg.Args...)
	cmd := exec.Command(w.cfg.Path, args...)
	cmd.Stdout, cmd.Stderr = stdout, p.tail
	cmd.WaitDelay = DefaultWaitDelay
	child, err := pgroup.Start(cmd, groupKill)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrProviderStart, w.cfg.Path, err)
	}
	p.pid, p.child = child.PID, child
	pid.Store(int64(p.pid))
	w.log.Info("warm provider started", attrPID, p.pid, "socket", w.cfg.Socket)
	go func() {
		err := child.Wait()
		stdout.Flush()
		p.tail.Flush()
		p.waitErr = err
		close(p.exited)
	}()
	return p, nil
}

// launch spawns a provider and waits until its socket accepts. On failure
// the process is gone when launch returns.
func (w *Warm) launch(ctx context.Context) (*warmProc, error) {
	p, err := w.spawn()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := w.waitReady(ctx, p); err != nil {
		w.terminate(p)
		return nil, err
	}
	p.readyAt = time.Now()
	w.setState(p, nil)
	w.log.Info("warm provider ready", attrPID, p.pid, attrElapsed, time.Since(t0).Round(time.Millisecond))
	w.emit(EventWarmReady, "")
	return p, nil
}

// waitReady dials the socket until it accepts, the process exits,
// StartTimeout passes or ctx ends. The probe connection carries no job.
func (w *Warm) waitReady(ctx context.Context, p *warmProc) error {
	wctx, cancel := context.WithTimeout(ctx, w.cfg.StartTimeout)
	defer cancel()
	go func() {
		select {
		case <-p.exited:
			cancel()
		case <-wctx.Done():
		}
	}()
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(5*time.Millisecond),
		backoff.WithMaxInterval(250*time.Millisecond), backoff.WithMaxElapsedTime(0))
	var last error
	op := func() error {
		var d net.Dialer
		c, err := d.DialContext(wctx, "unix", w.cfg.Socket)
		if err == nil {
			err = checkPeer(c.(*net.UnixConn), p.pid)
			c.Close()
		}
		last = err
		return err
	}
	if backoff.Retry(op, backoff.WithContext(b, wctx)) == nil {
		return nil
	}
	select {
	case <-p.exited:
		return fmt.Errorf("%w: %s %s; its last stderr lines:\n%s", ErrWarmExited, w.cfg.Path, exitReason(p.waitErr), tailText(p.tail))
	default:
	}
	if ctx.Err() != nil {
		return fmt.Errorf("provider: waiting for the warm provider: %w", ctx.Err())
	}
	return fmt.Errorf("%w: its socket did not accept within %s (last: %v); its last stderr lines:\n%s", ErrWarmStalled, w.cfg.StartTimeout, last, tailText(p.tail))
}

func tailText(t *tailbuf.Buffer) string {
	if s := t.String(); s != "" {
		return s
	}
	return "(no output)"
}

// terminate sends SIGTERM to the group, SIGKILL after StopGrace, and
// returns once the provider has been reaped.
func (w *Warm) terminate(p *warmProc) {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.child.Signal(syscall.SIGTERM)
	t := time.NewTimer(w.cfg.StopGrace)
	defer t.Stop()
	select {
	case <-p.exited:
		return
	case <-t.C:
	}
	w.log.Warn("warm provider ignored SIGTERM; killing its process group", attrPID, p.pid)
	_ = p.child.Signal(syscall.SIGKILL)
	<-p.exited
}

// supervise restarts the provider when it exits and stops it when ctx ends.
func (w *Warm) supervise(ctx context.Context, p *warmProc) {
	defer close(w.done)
	bo := backoff.NewExponentialBackOff(backoff.WithInitialInterval(250*time.Millisecond),
		backoff.WithMaxInterval(10*time.Second), backoff.WithMaxElapsedTime(0))
	stopped := func() { w.setState(nil, &warmNotReady{"the warm provider is stopped"}) }
	for {
		select {
		case <-ctx.Done():
			w.terminate(p)
			stopped()
			return
		case <-p.exited:
		}
		reason := exitReason(p.waitErr)
		k := p.killed.Load()
		if k != nil {
			reason = "killed by onebitd: " + *k
		}
		w.log.Warn("warm provider exited", attrPID, p.pid, attrError, reason, "stderr_tail", tailText(p.tail))
		w.setState(nil, &warmNotReady{"the warm provider is restarting after it exited: " + reason})
		w.emit(EventWarmExited, reason)
		// A provider onebitd killed (a job past its deadline, a client
		// gone) did not crash: its restart is not backed off further, or
		// every hung job would leave the next ones falling back for up to
		// 10 s. A crash backs off until the provider stays up a minute.
		if k != nil || time.Since(p.readyAt) > time.Minute {
			bo.Reset()
		}
		for {
			t := time.NewTimer(bo.NextBackOff())
			select {
			case <-ctx.Done():
				t.Stop()
				stopped()
				return
			case <-t.C:
			}
			w.emit(EventWarmStarting, "restart after: "+reason)
			np, err := w.launch(ctx)
			if err == nil {
				p = np
				break
			}
			if ctx.Err() != nil {
				stopped()
				return
			}
			reason = err.Error()
			w.log.Warn("warm provider restart failed", attrError, err)
			w.setState(nil, &warmNotReady{"the warm provider is restarting: " + firstLine(reason)})
			w.emit(EventWarmExited, reason)
		}
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
