// Package launcher starts and supervises the decoder process (llama-server,
// or onebit-decoder-sim, which takes the same flags) for `onebitd serve
// --decoder-bin`.
//
// The decoder listens on a loopback port picked once and kept across
// restarts, so its URL never changes; with Config.UnixSocket it listens on
// RunDir/decoder.sock instead (a directory of mode 0700: the socket itself
// gets the decoder's umask), and with Config.APIKey it gets a key drawn per
// boot in RunDir/decoder.key (mode 0600, passed as --api-key-file, never on
// its command line, never logged). Client reaches it either way (DESIGN §2d). Start waits until GET /health answers
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
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"golang.org/x/sys/unix"

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

	// Access control (DESIGN §2d). APIKey: a key drawn per Start (per boot),
	// written to RunDir/decoder.key (mode 0600) and passed as
	// --api-key-file, never on the command line and never logged; the
	// launcher's Client sends it. UnixSocket: the decoder listens on
	// RunDir/decoder.sock (--host PATH.sock) instead of a loopback port.
	// RunDir is a directory of mode 0700 owned by this user (created if
	// missing); "" means a new temporary directory, removed by Stop.
	APIKey     bool
	UnixSocket bool
	RunDir     string

	StallTimeout time.Duration // most time from start to /health 200; default 10m (loading a model is slow)
	StopGrace    time.Duration // time between SIGTERM and SIGKILL on Stop; default 10s

	Sink event.Sink // lifecycle events (EventStarting, EventReady, EventExited); nil: none
	// Kind names the server in its lifecycle events: "<Kind>.starting" …
	// (default "decoder"; a prefill server is "prefill", on
	// onebit.<node>.prefill.*).
	Kind   string
	Logger *slog.Logger // nil: discard
}

// reserved are flags the launcher sets itself; the user's args must not
// (a key onebitd does not know would lock it out of its own decoder).
var reserved = []string{"--host", "--port", "--slot-save-path", "-np", "--parallel", "--api-key", "--api-key-file"}

// Names of the files in Config.RunDir.
const (
	KeyFileName = "decoder.key"
	SocketName  = "decoder.sock"
)

// maxSocketPath is the longest unix socket path (sun_path less its NUL).
const maxSocketPath = 107

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

// argv is the decoder's argument list for port (or, with UnixSocket, for
// the socket in RunDir).
func (c *Config) argv(port int) []string {
	var a []string
	if c.UnixSocket {
		a = []string{"--host", filepath.Join(c.RunDir, SocketName)}
	} else {
		a = []string{"--host", c.Host, "--port", strconv.Itoa(port)}
	}
	if c.APIKey {
		a = append(a, "--api-key-file", filepath.Join(c.RunDir, KeyFileName))
	}
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
	cfg      Config
	log      *slog.Logger
	url      string
	port     int
	client   *decoder.Client
	cancel   context.CancelFunc
	done     chan struct{} // closed when the supervisor has stopped the process
	cleanup  func()        // removes the key file and socket (or the temp RunDir)
	stopOnce sync.Once

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
	cleanup, key, err := cfg.prepareRunDir()
	if err != nil {
		return nil, err
	}
	d, err := startWith(ctx, cfg, key)
	if err != nil {
		cleanup()
		return nil, err
	}
	d.cleanup = cleanup
	return d, nil
}

func startWith(ctx context.Context, cfg Config, key string) (*Decoder, error) {
	var url string
	port := 0
	if cfg.UnixSocket {
		url = "unix://" + filepath.Join(cfg.RunDir, SocketName)
	} else {
		var err error
		if port, err = freePort(cfg.Host); err != nil {
			return nil, err
		}
		url = "http://" + net.JoinHostPort(cfg.Host, strconv.Itoa(port))
	}
	client, err := decoder.New(url, nil, decoder.WithAPIKey(key))
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
		client.HTTP().CloseIdleConnections()
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.cancel = cancel
	go d.supervise(sctx, p)
	return d, nil
}

// prepareRunDir makes RunDir (0700, ours) and the key file when access
// control is on; cleanup removes what it made.
func (c *Config) prepareRunDir() (cleanup func(), key string, err error) {
	cleanup = func() {}
	if !c.APIKey && !c.UnixSocket {
		return cleanup, "", nil
	}
	if c.RunDir == "" {
		dir, err := os.MkdirTemp("", "onebitd-decoder-") // mode 0700
		if err != nil {
			return cleanup, "", fmt.Errorf("launcher: make a run directory: %w", err)
		}
		c.RunDir = dir
		cleanup = func() { os.RemoveAll(dir) }
	} else {
		if err := os.MkdirAll(c.RunDir, 0o700); err != nil {
			return cleanup, "", fmt.Errorf("launcher: make the run directory: %w", err)
		}
		var st unix.Stat_t
		if err := unix.Stat(c.RunDir, &st); err != nil {
			return cleanup, "", fmt.Errorf("launcher: run directory: %w", os.NewSyscallError("stat", err))
		}
		if st.Mode&0o077 != 0 || int(st.Uid) != os.Geteuid() || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return cleanup, "", fmt.Errorf("%w: run directory %s has mode %04o and owner %d: want a directory of mode 0700 owned by uid %d (it holds the decoder's key and socket)",
				ErrConfig, c.RunDir, st.Mode&0o7777, st.Uid, os.Geteuid())
		}
		files := []string{filepath.Join(c.RunDir, KeyFileName), filepath.Join(c.RunDir, SocketName)}
		cleanup = func() {
			for _, f := range files {
				os.Remove(f)
			}
		}
	}
	if c.UnixSocket {
		if sock := filepath.Join(c.RunDir, SocketName); len(sock) > maxSocketPath {
			cleanup()
			return func() {}, "", fmt.Errorf("%w: socket path %s is %d bytes, a unix socket path has at most %d (choose a shorter run directory)",
				ErrConfig, sock, len(sock), maxSocketPath)
		}
	}
	if c.APIKey {
		if key, err = writeKey(filepath.Join(c.RunDir, KeyFileName)); err != nil {
			cleanup()
			return func() {}, "", err
		}
	}
	return cleanup, key, nil
}

// writeKey draws a new key and writes it to path, a new file of mode 0600
// (one left by an earlier boot is replaced).
func writeKey(path string) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("launcher: draw an API key: %w", err)
	}
	key := hex.EncodeToString(b[:])
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("launcher: replace the key file: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("launcher: write the key file: %w", err)
	}
	_, err = f.WriteString(key + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return "", fmt.Errorf("launcher: write the key file %s: %w", path, err)
	}
	return key, nil
}

// URL is the decoder's address, the same across restarts: http://HOST:PORT,
// or unix://PATH with Config.UnixSocket. With Config.APIKey a client needs
// the key too: use Client.
func (d *Decoder) URL() string { return d.url }

// Client is a client of the decoder that reaches it (unix socket included)
// and sends its API key. Its connections are closed by Stop.
func (d *Decoder) Client() *decoder.Client { return d.client }

// KeyFile is the path of the decoder's API key file (0600), "" without
// Config.APIKey. It exists until Stop.
func (d *Decoder) KeyFile() string {
	if !d.cfg.APIKey {
		return ""
	}
	return filepath.Join(d.cfg.RunDir, KeyFileName)
}

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
	d.stopOnce.Do(d.cleanup)
	return nil
}

func (d *Decoder) setState(p *process, notReady error) {
	d.mu.Lock()
	d.proc, d.notReady = p, notReady
	d.mu.Unlock()
}

func (d *Decoder) emit(name, reason string) {
	if d.cfg.Sink == nil {
		return
	}
	if d.cfg.Kind != "" && d.cfg.Kind != "decoder" {
		name = d.cfg.Kind + strings.TrimPrefix(name, "decoder")
	}
	d.cfg.Sink.Emit(&event.Event{Event: name, Reason: reason})
}

// launch spawns a process and waits until it is ready. On failure the
// process is gone (reaped) when launch returns.
func (d *Decoder) launch(ctx context.Context) (*process, error) {
	if d.cfg.UnixSocket {
		// A socket file left by an earlier run (a killed decoder does not
		// remove it) would make the bind fail; the directory is ours.
		if err := os.Remove(filepath.Join(d.cfg.RunDir, SocketName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("launcher: remove the old socket: %w", err)
		}
	}
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
