// Package handoff runs a request's file or shared route (DESIGN §2): the
// steps, their deadlines, and the cleanup on every early exit. It drives a
// machine.Machine and does the I/O that package machine must not.
package handoff

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/machine"
	"github.com/onebitd/onebitd/provider"
)

// Decoder is what the handoff needs from the decoder; *decoder.Client
// implements it.
type Decoder interface {
	Share(ctx context.Context, slot int, socket string) (decoder.ShareReply, error)
	AdoptJSON(ctx context.Context, slot int, tokens json.RawMessage, shareID int64) error
	Restore(ctx context.Context, slot int, filename string) (decoder.RestoreReply, error)
}

// Provider runs one prefill job: Exec (a process per request) or Warm (one
// long-running provider fed over a unix socket, DESIGN §2c).
type Provider interface {
	Prefill(ctx context.Context, job *Job) (provider.Result, error)
}

var _ Decoder = (*decoder.Client)(nil)

// Config is the handoff's configuration.
type Config struct {
	SlotDir string // where sockets, tokens, layout and state files live
	Model   string // --model, passed to the provider
	Share   bool   // shared route (--kv-share) instead of the file route
	Slots   int    // decoder slots: one share socket each (kvshare-<K>.sock); default 1

	AcceptTimeout  time.Duration // decoder connects and sends the share message
	ShareTimeout   time.Duration // ?action=share answers
	ApplyTimeout   time.Duration // ?action=adopt / ?action=restore answer
	MaxFDs         int           // region fds accepted per share message
	PeerPID        func() int    // the launched decoder's pid, 0 when attached by URL
	PeerUID        int           // uid a decoder attached by URL must run as
	CheckPeerCreds bool
}

// Default limits of the handoff's steps (daemon.Options uses these).
const (
	DefaultAcceptTimeout = 5 * time.Second  // decoder connects and sends the share message
	DefaultShareTimeout  = 10 * time.Second // ?action=share answers
	DefaultApplyTimeout  = 60 * time.Second // ?action=adopt / ?action=restore answer
)

// withDefaults fills the zero fields of c.
func (c Config) withDefaults() Config {
	if c.AcceptTimeout == 0 {
		c.AcceptTimeout = DefaultAcceptTimeout
	}
	if c.ShareTimeout == 0 {
		c.ShareTimeout = DefaultShareTimeout
	}
	if c.ApplyTimeout == 0 {
		c.ApplyTimeout = DefaultApplyTimeout
	}
	if c.MaxFDs == 0 {
		c.MaxFDs = 64
	}
	if c.Slots < 1 {
		c.Slots = 1
	}
	return c
}

// Handoff runs the file or shared route of DESIGN §2 for one request.
type Handoff struct {
	cfg  Config
	dec  Decoder
	prov Provider
	log  *slog.Logger

	// drain is cancelled (cause ErrDraining) by Drain: every run in
	// flight falls back at once and new runs fall back at their first step.
	drain     context.Context
	drainStop context.CancelCauseFunc

	// socks are the shared route's per-slot share sockets, opened by
	// Listen (at startup) or by the first shared run.
	sockMu sync.Mutex
	socks  *slotSockets
	closed bool
}

// ErrClosed: the runner was closed (the daemon is stopping).
var ErrClosed = errors.New("the share sockets are closed: onebitd is shutting down")

// Listen opens the shared route's share sockets, one per slot, in the slot
// dir (DESIGN §2b); a no-op on the file route. The daemon calls it at
// startup so that a socket it cannot create is an error there, not a
// fallback per request.
func (h *Handoff) Listen() error {
	_, err := h.sockets()
	return err
}

func (h *Handoff) sockets() (*slotSockets, error) {
	if !h.cfg.Share {
		return nil, nil
	}
	h.sockMu.Lock()
	defer h.sockMu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	if h.socks == nil {
		s, err := openSlotSockets(h.cfg.SlotDir, h.cfg.Slots, h.log)
		if err != nil {
			return nil, err
		}
		h.socks = s
	}
	return h.socks, nil
}

// Close closes the share sockets (and removes them). Runs in flight fall
// back; later runs fall back at their first step.
func (h *Handoff) Close() error {
	h.sockMu.Lock()
	s := h.socks
	h.socks, h.closed = nil, true
	h.sockMu.Unlock()
	if s != nil {
		s.close()
	}
	return nil
}

// ErrDraining is the cause of a handoff cut short by Drain.
var ErrDraining = errors.New("onebitd is shutting down: the handoff was cut short so the request is answered before the drain limit")

// Drain makes every handoff in flight, and every later one, fall back (the
// provider's process group is killed first), so that a shutting-down
// daemon still answers every request, forwarded as it came.
func (h *Handoff) Drain() { h.drainStop(ErrDraining) }

// NewHandoff returns a runner. prov must not be nil (no provider means the
// plain route, which needs no runner).
func NewHandoff(cfg Config, dec Decoder, prov Provider, log *slog.Logger) *Handoff {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Handoff{cfg: cfg.withDefaults(), dec: dec, prov: prov, log: log}
	h.drain, h.drainStop = context.WithCancelCause(context.Background())
	return h
}

// Route is the route this runner takes.
func (h *Handoff) Route() machine.Route {
	if h.cfg.Share {
		return machine.RouteShared
	}
	return machine.RouteFile
}

// Run hands tokens' KV to the decoder's slot m.Slot() and leaves m in
// adopted, restored or fallback. It returns the fallback reason ("" on
// success). Every file it made and every fd it received is gone when it
// returns.
func (h *Handoff) Run(ctx context.Context, m *machine.Machine, tokens []int) string {
	return h.RunFrom(ctx, m, tokens, 0).Reason
}

// Outcome is what RunFrom did.
type Outcome struct {
	Reason   string        // the fallback reason, "" on success
	Start    int           // the provider's --start (0 on the file route)
	Provider time.Duration // the provider's run, 0 when it did not run
	Ran      bool          // the provider ran to the end (success or not)
	Exit     int           // its exit status when Ran (a warm provider: 0 ok, 1 failed the job)
}

// RunFrom is Run for a slot whose cells 0..start-1 already hold tokens'
// first start tokens (DESIGN §2b --start): on the shared route the
// provider prefills cells start..n-1 only and adopt names all n tokens.
// The file route always hands over the whole prompt (start is ignored).
// The caller must know the cells hold those tokens: a wrong start is stale
// KV.
func (h *Handoff) RunFrom(ctx context.Context, m *machine.Machine, tokens []int, start int) Outcome {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(h.drain, func() { cancel(context.Cause(h.drain)) })
	defer stop()
	w := &work{h: h, m: m, stem: m.ID(), ctx: ctx}
	defer w.release() // belt and braces: cleanup already ran on every path
	if !h.cfg.Share {
		start = 0
	}
	start = min(max(start, 0), len(tokens))
	w.out.Start = start
	if h.cfg.Share {
		w.out.Reason = w.shared(ctx, tokens, start)
	} else {
		w.out.Reason = w.file(ctx, tokens)
	}
	return w.out
}

// NewRequestID draws a request id: "r" and 16 hex digits. It is also the
// stem of the request's files in the slot dir.
func NewRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "r" + hex.EncodeToString(b[:])
}

// RequestIDLen is the length of NewRequestID's ids.
const RequestIDLen = 17

// fileExts are the files a handoff has in the slot dir while it runs: the
// file route's state file and a provider's temporary state. Tokens and
// layout travel in sealed memfds and the share sockets are per slot, so
// nothing else of a request touches the slot dir (DESIGN §2b).
var fileExts = []string{".bin", ".bin.tmp"}

// staleFile matches the files of any request id, including those of
// earlier versions (a per-request socket, tokens and layout files).
var staleFile = regexp.MustCompile(`^r[0-9a-f]{16}\.(sock|tokens|json|bin|bin\.tmp)$`)

// CleanStale removes the handoff files a killed onebitd left in dir (and
// nothing else: the dir is shared with the decoder's saved slots). It returns
// how many it removed.
func CleanStale(dir string) (int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		if !staleFile.MatchString(e.Name()) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return n, err
		}
		n++
	}
	return n, nil
}

// work is one run's resources.
type work struct {
	ctx   context.Context // the run's: cancelled by the client or by Drain
	h     *Handoff
	m     *machine.Machine
	stem  string
	msg   *fdpass.Message
	mem   []*os.File // sealed memfds: tokens and layout
	clean event.Cleanup
	done  bool
	out   Outcome
}

func (w *work) path(ext string) string { return filepath.Join(w.h.cfg.SlotDir, w.stem+ext) }

// release closes every fd and removes every file of this run, counting them.
func (w *work) release() *event.Cleanup {
	if w.done {
		return &w.clean
	}
	w.done = true
	if w.msg != nil {
		w.clean.FDsClosed += w.msg.Close()
	}
	for _, f := range w.mem {
		if f.Close() == nil {
			w.clean.FDsClosed++
		}
	}
	if w.h.cfg.Share {
		return &w.clean // the shared route writes no file
	}
	// The state file and what a provider leaves beside it (the .tmp of a
	// state file it was killed writing). Named, not globbed: the slot dir
	// also holds the decoder's saved slots, and reading it on every request
	// would cost with its size.
	for _, ext := range fileExts {
		p := w.path(ext)
		if err := os.Remove(p); err == nil {
			w.clean.FilesRemoved++
		} else if !errors.Is(err, os.ErrNotExist) {
			w.h.log.Error("cannot remove handoff file", "path", p, "error", err)
		}
	}
	return &w.clean
}

// memfd makes a sealed memfd of b, owned (and closed) by the run.
func (w *work) memfd(name string, b []byte) (*os.File, error) {
	f, err := sealedMemfd(name, b)
	if err != nil {
		return nil, err
	}
	w.mem = append(w.mem, f)
	return f, nil
}

func (w *work) fire(ev machine.Event, a machine.Attrs) {
	if err := w.m.Fire(ev, a); err != nil {
		w.h.log.Error("illegal transition", "request_id", w.m.ID(), "error", err)
	}
}

// fallback cleans up and leaves the handoff with one reason.
func (w *work) fallback(step string, err error, exit *int, status int) string {
	reason := err.Error()
	if why := cutShort(w.ctx, step); why != "" {
		reason = why // the step's own error only says it was cancelled
	}
	cl := w.release()
	w.h.log.Warn("handoff fell back", "request_id", w.m.ID(), "slot", w.m.Slot(), "step", step, "reason", reason)
	w.fire(machine.EvFallback, machine.Attrs{Reason: reason, Step: step, ProviderExit: exit, HTTPStatus: status, Cleanup: cl})
	return reason
}

// ReasonClientGone starts the reason of every handoff whose client went
// away (machine's: the handlers use the same words).
const ReasonClientGone = machine.ReasonClientGone

// goneWhile completes ReasonClientGone per step.
var goneWhile = map[string]string{
	machine.StepListen:   "before the handoff started",
	machine.StepShare:    "while the decoder shared the slot's KV",
	machine.StepReceive:  "while onebitd waited for the decoder's share message",
	machine.StepPeer:     "while onebitd waited for the decoder's share message",
	machine.StepTokens:   "before the provider started",
	machine.StepProvider: "while the provider was prefilling (its process group is killed)",
	machine.StepAdopt:    "while the decoder adopted the prefilled KV",
	machine.StepRestore:  "while the decoder restored the prefilled state",
}

// cutShort is the reason of a run whose ctx ended while step ran: the
// daemon drains (ErrDraining) or the client went away. It is "" while ctx
// is live and when ctx ended by its own deadline (the step's error tells).
func cutShort(ctx context.Context, step string) string {
	if ctx.Err() == nil {
		return ""
	}
	switch c := context.Cause(ctx); {
	case errors.Is(c, ErrDraining):
		return c.Error()
	case errors.Is(c, context.Canceled):
		if while, ok := goneWhile[step]; ok {
			return ReasonClientGone + " " + while
		}
		return ReasonClientGone + " during the handoff"
	}
	return ""
}

// late rewords the error of a decoder call that outlived its step's
// deadline d (and not the request's).
func late(err error, stepCtx, ctx context.Context, op string, d time.Duration) error {
	if ctx.Err() == nil && errors.Is(stepCtx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("the decoder did not answer the %s request in time (%s)", op, d)
	}
	return err
}

func httpStatus(err error) int {
	var ae *decoder.APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// providerExit is the exit status of a provider that ran (-1: killed or
// never exited by itself).
func providerExit(res provider.Result) *int {
	c := res.ExitCode
	return &c
}

func (w *work) file(ctx context.Context, tokens []int) string {
	if err := ctx.Err(); err != nil {
		return w.fallback(machine.StepTokens, err, nil, 0)
	}
	enc := provider.AppendTokens(make([]byte, 0, 2+6*len(tokens)), tokens)
	tf, err := w.memfd("tokens", enc)
	if err != nil {
		return w.fallback(machine.StepTokens, fmt.Errorf("cannot pass the tokens to the provider: %w", err), nil, 0)
	}
	state := w.stem + ".bin"
	job := &Job{Route: machine.RouteFile, Tokens: tokens, TokensFile: tf, Model: w.h.cfg.Model, State: w.path(".bin")}
	res, err := w.h.prov.Prefill(ctx, job)
	w.ran(res)
	if err != nil {
		return w.fallback(machine.StepProvider, err, providerExit(res), 0)
	}
	w.fire(machine.EvPrefill, machine.Attrs{NTokens: len(tokens), ProviderExit: providerExit(res)})

	actx, cancel := context.WithTimeout(ctx, w.h.cfg.ApplyTimeout)
	_, err = w.h.dec.Restore(actx, w.m.Slot(), state)
	cancel()
	if err != nil {
		err = late(err, actx, ctx, "restore", w.h.cfg.ApplyTimeout)
		return w.fallback(machine.StepRestore, err, nil, httpStatus(err))
	}
	w.fire(machine.EvRestore, machine.Attrs{NTokens: len(tokens), Cleanup: w.release()})
	return ""
}

type received struct {
	msg *fdpass.Message
	err error
}

// ran records the provider's run in the outcome.
func (w *work) ran(res provider.Result) {
	w.out.Provider = res.Duration
	w.out.Ran = res.ExitCode >= 0
	w.out.Exit = res.ExitCode
}

func (w *work) shared(ctx context.Context, tokens []int, start int) string {
	cfg := w.h.cfg
	if err := ctx.Err(); err != nil {
		return w.fallback(machine.StepListen, err, nil, 0)
	}
	socks, err := w.h.sockets()
	if err != nil {
		return w.fallback(machine.StepListen, err, nil, 0)
	}
	k := w.m.Slot()
	if k < 0 || k >= len(socks.ls) {
		return w.fallback(machine.StepListen, fmt.Errorf("slot %d has no share socket (%d slots)", k, len(socks.ls)), nil, 0)
	}
	wt := socks.arm(k)
	w.fire(machine.EvListen, machine.Attrs{})

	// The receive ends at its deadline, with the run's ctx (client gone,
	// drain), or when the share failed (rstop).
	deadline := time.Now().Add(cfg.AcceptTimeout)
	rctx, rstop := context.WithCancel(ctx)
	defer rstop()
	rc := make(chan received, 1)
	go func() { rc <- w.receive(rctx, socks, k, wt, deadline) }()

	sctx, cancel := context.WithTimeout(ctx, cfg.ShareTimeout)
	rep, err := w.h.dec.Share(sctx, k, socks.path(k))
	cancel()
	if err == nil && rep.ShareID == nil {
		err = errNoShareID // adopt would have nothing to name
	}
	if err != nil {
		err = late(err, sctx, ctx, "share", cfg.ShareTimeout)
		rstop()
		r := <-rc
		if r.msg != nil {
			w.msg = r.msg // closed (and counted) by fallback
		}
		if errors.Is(r.err, errWrongPeer) {
			// We hung up on the impostor, so the decoder's share failed
			// too: the peer is the cause worth reporting.
			return w.fallback(machine.StepPeer, r.err, nil, 0)
		}
		return w.fallback(machine.StepShare, err, nil, httpStatus(err))
	}
	r := <-rc
	if r.err != nil {
		step := machine.StepReceive
		if errors.Is(r.err, errWrongPeer) {
			step = machine.StepPeer
		}
		return w.fallback(step, r.err, nil, 0)
	}
	w.msg = r.msg
	w.fire(machine.EvShare, machine.Attrs{ShareID: rep.ShareID, NFDs: len(r.msg.Files), BytesMapped: regionBytes(&r.msg.Header)})

	if err := ctx.Err(); err != nil {
		return w.fallback(machine.StepTokens, err, nil, 0)
	}
	enc := provider.AppendTokens(make([]byte, 0, 2+6*len(tokens)), tokens) // tokens memfd and adopt body
	tf, err := w.memfd("tokens", enc)
	if err != nil {
		return w.fallback(machine.StepTokens, fmt.Errorf("cannot pass the tokens to the provider: %w", err), nil, 0)
	}
	lf, err := w.memfd("layout", r.msg.Raw)
	if err != nil {
		return w.fallback(machine.StepTokens, fmt.Errorf("cannot pass the layout to the provider: %w", err), nil, 0)
	}
	job := &Job{Route: machine.RouteShared, Tokens: tokens, TokensFile: tf, Model: cfg.Model,
		Layout: r.msg.Raw, LayoutFile: lf, Regions: r.msg.Files, Start: start}
	res, err := w.h.prov.Prefill(ctx, job)
	w.ran(res)
	if err != nil {
		return w.fallback(machine.StepProvider, err, providerExit(res), 0)
	}
	w.fire(machine.EvPrefill, machine.Attrs{NTokens: len(tokens), ProviderExit: providerExit(res)})

	actx, cancel := context.WithTimeout(ctx, cfg.ApplyTimeout)
	err = w.h.dec.AdoptJSON(actx, k, enc, *rep.ShareID)
	cancel()
	if err != nil {
		err = late(err, actx, ctx, "adopt", cfg.ApplyTimeout)
		return w.fallback(machine.StepAdopt, err, nil, httpStatus(err))
	}
	w.fire(machine.EvAdopt, machine.Attrs{ShareID: rep.ShareID, NTokens: len(tokens), Cleanup: w.release()})
	return ""
}

var (
	errWrongPeer = errors.New("the process that connected to the share socket is not the decoder")
	errNoShareID = errors.New("the decoder's share answer has no share_id")
)

// receive waits for the connection that claims slot k's armed socket,
// checks who it is and reads the share message, until deadline or until
// ctx ends (then it closes the connection to stop at once, and says so).
// On error no fd is left open.
func (w *work) receive(ctx context.Context, socks *slotSockets, k int, wt *waiter, deadline time.Time) received {
	conn, err := socks.wait(ctx, k, wt, deadline)
	if err != nil {
		return received{err: err}
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() }) // unblocks Receive
	defer stop()
	if err := w.checkPeer(conn); err != nil {
		return received{err: err}
	}
	msg, err := conn.Receive(deadline, w.h.cfg.MaxFDs)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("the share was abandoned before the message arrived: %w", context.Cause(ctx))
		}
		return received{err: err}
	}
	return received{msg: msg}
}

func (w *work) checkPeer(conn *fdpass.Conn) error {
	cfg := w.h.cfg
	if !cfg.CheckPeerCreds {
		return nil
	}
	cred, err := conn.PeerCred()
	if err != nil {
		return fmt.Errorf("cannot read the share socket peer's credentials: %w", err)
	}
	if cfg.PeerPID != nil {
		if pid := cfg.PeerPID(); pid > 0 {
			if cred.PID != pid {
				return fmt.Errorf("%w (peer pid %d, decoder pid %d)", errWrongPeer, cred.PID, pid)
			}
			return nil
		}
	}
	if cred.UID != cfg.PeerUID {
		return fmt.Errorf("%w (peer uid %d, expected uid %d)", errWrongPeer, cred.UID, cfg.PeerUID)
	}
	return nil
}

func regionBytes(h *fdpass.Header) int64 {
	var n int64
	for _, r := range h.Regions {
		n += r.Size
	}
	return n
}
