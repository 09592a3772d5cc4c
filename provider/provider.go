// Package provider runs a prefill provider (DESIGN §2) for one request: the
// file route (--state) or the shared route (--layout, --fds with the region
// fds inherited at 3, 4, …). Warm (warm.go) supervises the other mode, one
// long-lived provider fed jobs over a unix socket (DESIGN §2c, package
// provjob): Run kills the provider's process group and waits until it is
// gone before it returns a timeout, a cancellation or a lost job, so nothing
// writes into the decoder's KV after the request fell back.
//
// The provider's exit status decides success. On failure the returned error's
// text is the fallback reason: what happened and the provider's last
// non-empty stderr line, bounded (the runner keeps the last TailSize bytes of
// stderr lines and cuts each line to MaxLineLen bytes; internal/tailbuf). The
// provider runs in its own process group; on timeout or cancellation, and
// after it exits, the whole group is killed, so a provider cannot leave
// processes behind in its group. The group is signalled only while the
// provider is not reaped yet (internal/pgroup), so a kill never reaches a
// group whose id the kernel handed to another process. The provider dies
// with the daemon: Pdeathsig SIGKILL, set from a goroutine that keeps its OS
// thread until the provider is reaped (the kernel sends it when the forking
// thread exits).
// The provider's stdout is discarded; its stderr lines are logged at debug
// level under the "provider_stderr" attribute.
//
// The provider inherits the daemon's environment and, besides stdin, stdout
// and stderr, exactly the fds it is given (at 3, 4, …) provided the daemon
// called CloseOnExecInherited at startup.
package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onebitd/onebitd/internal/pgroup"
	"github.com/onebitd/onebitd/internal/tailbuf"
)

// Sentinel errors; every error returned by Run* wraps exactly one of them
// (match with errors.Is). The error itself is an *Error whose text is the
// fallback reason.
var (
	// ErrProviderStart: the provider could not be started (missing or not
	// executable, fork failed).
	ErrProviderStart = errors.New("provider: could not start")
	// ErrProviderExit: the provider exited with a non-zero status or was
	// killed by a signal it did not get from the runner.
	ErrProviderExit = errors.New("provider: exited unsuccessfully")
	// ErrProviderTimeout: the provider ran longer than Runner.Timeout (or the
	// caller's deadline) and its process group was killed.
	ErrProviderTimeout = errors.New("provider: timed out")
	// ErrProviderCanceled: the caller cancelled the run and the provider's
	// process group was killed.
	ErrProviderCanceled = errors.New("provider: cancelled")
)

// Bounds on what is kept of the provider's stderr.
const (
	TailSize   = 4 << 10 // bytes of stderr lines kept (the end)
	MaxLineLen = 512     // bytes of the reason line kept
	tailLines  = 64      // stderr lines kept
)

// DefaultWaitDelay is how long Wait waits for the provider's stderr to close
// after the provider exited (a grandchild may hold it open).
const DefaultWaitDelay = time.Second

// Log attribute keys.
const (
	attrStderr   = "provider_stderr"
	attrPath     = "provider"
	attrPID      = "pid"
	attrExitCode = "exit_code"
	attrElapsed  = "elapsed"
	attrError    = "error"
)

// Runner runs a provider executable. The zero Timeout means no timeout
// beyond the caller's context. A Runner is safe for concurrent use.
type Runner struct {
	Path      string        // provider executable
	Args      []string      // extra args (--provider-arg), placed before the contract args
	Timeout   time.Duration // whole run; on expiry the whole process group is killed
	WaitDelay time.Duration // see DefaultWaitDelay; 0 means DefaultWaitDelay
	Logger    *slog.Logger  // nil: discard
}

// Result describes one run.
type Result struct {
	ExitCode int           // exit status; -1 if the provider did not exit by itself (signal, timeout, not started); Warm.Run: 0 ok, 1 failed the job, -1 else
	Reason   string        // the fallback reason ("" on success)
	Duration time.Duration // from start to exit
	TimedOut bool          // killed because the timeout (or the caller's deadline) expired
}

// Error is a failed run; Error() is the fallback reason.
type Error struct {
	Kind   error // ErrProviderStart, ErrProviderExit, ErrProviderTimeout, ErrProviderCanceled; Warm.Run also ErrProviderNotReady, ErrProviderFailed, ErrProviderLost
	Reason string
	Err    error // the underlying cause (exec or context error), may be nil
}

func (e *Error) Error() string { return e.Reason }

// Unwrap returns Kind and, when set, Err.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

// errTimeout is the cause of the runner's own timeout.
var errTimeout = errors.New("provider timeout")

// RunFile runs PATH ARGS… --tokens tokens --model model --state state.
func (r *Runner) RunFile(ctx context.Context, tokens, model, state string) (Result, error) {
	return r.run(ctx, []string{"--tokens", tokens, "--model", model, "--state", state}, nil)
}

// RunShared runs PATH ARGS… --tokens tokens --model model --layout layout
// --fds 3,4,… with files inherited at fd 3+i. The caller keeps ownership of
// files (the runner does not close them).
func (r *Runner) RunShared(ctx context.Context, tokens, model, layout string, files []*os.File) (Result, error) {
	if len(files) == 0 {
		err := &Error{Kind: ErrProviderStart, Reason: "provider could not start: the shared route needs at least one region fd"}
		return Result{ExitCode: -1, Reason: err.Reason}, err
	}
	fds := make([]string, len(files))
	for i, f := range files {
		if f == nil {
			err := &Error{Kind: ErrProviderStart, Reason: fmt.Sprintf("provider could not start: region fd %d of %d is missing", i, len(files))}
			return Result{ExitCode: -1, Reason: err.Reason}, err
		}
		fds[i] = strconv.Itoa(3 + i)
	}
	return r.run(ctx, []string{"--tokens", tokens, "--model", model, "--layout", layout, "--fds", strings.Join(fds, ",")}, files)
}

// Run runs PATH ARGS… contract… with files inherited at fd 3+i: the
// general form of RunFile and RunShared, for callers that pass more than
// the region fds (tokens and layout memfds named /proc/self/fd/N). The
// caller keeps ownership of files.
func (r *Runner) Run(ctx context.Context, contract []string, files []*os.File) (Result, error) {
	for i, f := range files {
		if f == nil {
			err := &Error{Kind: ErrProviderStart, Reason: fmt.Sprintf("provider could not start: inherited fd %d of %d is missing", i, len(files))}
			return Result{ExitCode: -1, Reason: err.Reason}, err
		}
	}
	return r.run(ctx, contract, files)
}

func (r *Runner) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}

func (r *Runner) run(ctx context.Context, contract []string, files []*os.File) (res Result, err error) {
	log := r.logger().With(attrPath, r.Path)
	res.ExitCode = -1
	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if r.Timeout > 0 {
		runCtx, cancel = context.WithTimeoutCause(ctx, r.Timeout, errTimeout)
	}
	defer cancel()

	opts := tailbuf.Options{MaxBytes: TailSize, MaxLines: tailLines, MaxLine: MaxLineLen}
	if log.Enabled(ctx, slog.LevelDebug) {
		opts.OnLine = func(line string) {
			log.LogAttrs(ctx, slog.LevelDebug, "provider stderr", slog.String(attrStderr, line))
		}
	}
	stderr := tailbuf.New(opts)
	if cerr := r.ctxError(ctx, runCtx); cerr != nil { // no process for a run already over
		return r.fail(log, res, cerr, stderr)
	}

	args := append(append(make([]string, 0, len(r.Args)+len(contract)), r.Args...), contract...)
	cmd := exec.Command(r.Path, args...)
	cmd.ExtraFiles = files
	cmd.WaitDelay = r.WaitDelay
	if cmd.WaitDelay <= 0 {
		cmd.WaitDelay = DefaultWaitDelay
	}
	cmd.Stderr = stderr // stdout: /dev/null

	// In its own process group, dying with this process (Pdeathsig from a
	// thread kept until the reap); the group is signalled only while the
	// provider is unreaped: on timeout or cancellation, and once it exited,
	// to kill what it left in its group.
	start := time.Now()
	child, err := pgroup.Start(cmd, groupKill)
	if err != nil {
		res.Duration = time.Since(start)
		e := &Error{Kind: ErrProviderStart, Reason: "provider could not start: " + err.Error(), Err: err}
		res.Reason = e.Reason
		log.LogAttrs(ctx, slog.LevelDebug, "provider not started", slog.String(attrError, e.Reason))
		return res, e
	}
	pid := child.PID
	log.LogAttrs(ctx, slog.LevelDebug, "provider started", slog.Int(attrPID, pid), slog.Int("fds", len(files)))
	stop := context.AfterFunc(runCtx, func() { _ = child.Signal(syscall.SIGKILL) })
	werr := child.Wait()
	stop()
	if gerr := child.GroupErr(); gerr != nil {
		log.LogAttrs(ctx, slog.LevelWarn, "provider group not killed", slog.Int(attrPID, pid), slog.String(attrError, gerr.Error()))
	}
	res.Duration = time.Since(start)
	stderr.Flush()
	if ps := cmd.ProcessState; ps != nil {
		res.ExitCode = ps.ExitCode()
	}
	if cerr := r.ctxError(ctx, runCtx); cerr != nil && (werr != nil || res.ExitCode != 0) {
		return r.fail(log, res, cerr, stderr)
	}
	ps := cmd.ProcessState
	switch {
	case ps == nil:
		e := &Error{Kind: ErrProviderExit, Reason: "provider failed: " + werr.Error(), Err: werr}
		return r.fail(log, res, e, stderr)
	case ps.Success():
		// exec.ErrWaitDelay: the provider succeeded but something it left
		// behind held stderr open; the exit status decides.
		log.LogAttrs(ctx, slog.LevelDebug, "provider exited", slog.Int(attrExitCode, 0), slog.Duration(attrElapsed, res.Duration))
		return res, nil
	}
	var what string
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		what = "provider was killed by signal " + signalName(ws.Signal())
	} else {
		what = fmt.Sprintf("provider exited with status %d", res.ExitCode)
	}
	return r.fail(log, res, &Error{Kind: ErrProviderExit, Reason: what, Err: werr}, stderr)
}

// ctxError describes why runCtx ended, or nil if it has not.
func (r *Runner) ctxError(parent, runCtx context.Context) *Error {
	if runCtx.Err() == nil {
		return nil
	}
	if context.Cause(runCtx) == errTimeout {
		return &Error{Kind: ErrProviderTimeout, Reason: fmt.Sprintf("provider timed out after %s (process group killed)", r.Timeout), Err: context.DeadlineExceeded}
	}
	if errors.Is(parent.Err(), context.DeadlineExceeded) {
		return &Error{Kind: ErrProviderTimeout, Reason: "provider timed out at the request deadline (process group killed)", Err: parent.Err()}
	}
	return &Error{Kind: ErrProviderCanceled, Reason: "provider cancelled (process group killed)", Err: context.Cause(parent)}
}

// fail completes e's reason with the last stderr line (exit failures only:
// the runner's own kills are the reason there), logs and returns.
func (r *Runner) fail(log *slog.Logger, res Result, e *Error, stderr *tailbuf.Buffer) (Result, error) {
	if e.Kind == ErrProviderExit {
		if line := stderr.Last(); line != "" {
			e.Reason += ": " + line
		} else {
			e.Reason += " (no stderr output)"
		}
	}
	res.TimedOut = e.Kind == ErrProviderTimeout
	res.Reason = e.Reason
	log.LogAttrs(context.Background(), slog.LevelDebug, "provider failed",
		slog.Int(attrExitCode, res.ExitCode), slog.Duration(attrElapsed, res.Duration), slog.String(attrError, e.Reason))
	return res, e
}

// groupKill sends sig to the process group pgid (a variable so that a test
// can check when the runner signals a group).
var groupKill = func(pgid int, sig syscall.Signal) error { return syscall.Kill(-pgid, sig) }

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	case syscall.SIGABRT:
		return "SIGABRT"
	case syscall.SIGBUS:
		return "SIGBUS"
	}
	return fmt.Sprintf("%d (%s)", int(s), s)
}

// AppendTokens appends tokens as a JSON array of ints (the tokens file's
// format, schemas/tokens.json) to b.
func AppendTokens(b []byte, tokens []int) []byte {
	b = append(b, '[')
	for i, t := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(t), 10)
	}
	return append(b, ']')
}

// WriteTokens writes tokens as a JSON array to path, a new file of mode 0600
// (O_EXCL: an existing file is an error). On error the file is removed.
func WriteTokens(path string, tokens []int) error {
	return WriteTokensJSON(path, AppendTokens(make([]byte, 0, 2+6*len(tokens)), tokens))
}

// WriteTokensJSON is WriteTokens for tokens already encoded by AppendTokens
// (the handoff encodes them once, for the file and the adopt body).
func WriteTokensJSON(path string, enc []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("provider: write tokens: %w", err)
	}
	_, werr := f.Write(enc)
	if werr == nil {
		_, werr = f.Write([]byte{'\n'})
	}
	cerr := f.Close()
	if werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(path)
		return fmt.Errorf("provider: write tokens %s: %w", path, werr)
	}
	return nil
}
