// Package providersim is the sim prefill provider (cmd/onebit-provider-sim):
// it implements the provider contracts of DESIGN §2, §2b and §2c with the
// deterministic model of internal/simkv.
//
// File route:
//
//	onebit-provider-sim --tokens FILE --model GGUF --state OUT.bin [--n-layer L --cell-size B]
//
// reads the tokens, computes their cells and writes a full simkv state file
// (every layer's K and V of every cell, as llama-server's slot files; the
// geometry is the decoder's --n-layer and --cell-size, same defaults) to
// OUT.bin atomically (OUT.bin.tmp, fsync, rename).
//
// Shared route:
//
//	onebit-provider-sim --tokens FILE --model GGUF --layout HEADER.json --fds 3,4,5 [--start P]
//
// checks the share header's layout hash against its own model, then writes
// cells P..n-1 (P = --start, default 0) of every region of the inherited fds
// (one pwrite per region; --compact maps exactly the records' pages),
// touching nothing else. With
// --start P the chain continues from the digest in cell P-1 of layer 0's K
// region, as a real prefill attends to the cells the slot kept: a wrong
// prefix there changes the text, a cell P-1 that holds no KV is refused.
//
// --compact (both routes) writes layer 0's records only (a version 1 state
// file; the rest of the regions untouched): small and fast, for tests.
//
// Warm provider (DESIGN §2c):
//
//	onebit-provider-sim --serve --socket PATH [--compact --n-layer … fault switches, time knobs]
//
// listens on PATH (0600), prints "onebit-provider-sim serving on PATH" and
// answers each connection's job (package provjob) with the same code as the
// exec'd routes; a job's fds are closed and unmapped before its reply.
//
// Exit status: 0 success; 1 a failure while working (I/O, a fault switch);
// 2 bad input (command line, tokens, header, layout mismatch, regions too
// small, --start on empty cells), detected before anything is written. On
// failure the last stderr line is one sentence, the reason onebitd reports
// for its fallback (in serve mode: the reply's reason).
//
// Time knobs: --fixed-ms F and --ms-per-token T make a job take at least
// F + T x (prefilled tokens) ms (a serve reply's prefill_ms reports the
// whole time).
//
// Fault switches for tests: --fail (exit --exit-code, default 1, before doing
// anything; serve: reply ok false), --slow D (sleep D first), --hang (block
// until killed), --write-then-fail (do the whole write, then fail),
// --keep-writing (do the whole write, then write a counter into the cells —
// or the state file — every millisecond until killed: a killed provider
// group must write nothing more). --fault-from-prompt turns one of them on
// for a job whose tokens carry a FAULT:<name> marker (package simfault:
// prov-fail, prov-hang, prov-slow sleeping --fault-delay, default 500ms,
// prov-write-then-fail, prov-keep-writing); used by the soak test.
package providersim

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/simfault"
	"github.com/onebitd/onebitd/internal/simkv"
)

// Exit statuses.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitInvalid = 2
)

// maxReasonLen bounds the reason line.
const maxReasonLen = 400

type options struct {
	tokens, model, state, layout, fds string
	fail, hang, writeThenFail         bool
	keepWriting                       bool
	exitCode                          int
	slow                              time.Duration
	compact                           bool
	nLayer, cellSize                  int
	start                             int
	fixedMs, msPerToken               float64
	serve                             bool
	socket                            string
	faultFromPrompt                   bool
	faultDelay                        time.Duration
}

// DefaultFaultDelay is how long the prov-slow fault sleeps (--fault-delay).
const DefaultFaultDelay = 500 * time.Millisecond

// Main runs the provider with args (without the program name), printing the
// reason of a failure as the last line of stderr, and returns the exit
// status. ctx ends --hang, --slow, --keep-writing and --serve (the command
// cancels it on SIGINT and SIGTERM; SIGKILL needs no help).
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	code, err := run(ctx, args, stderr)
	if err != nil {
		fmt.Fprintln(stderr, Reason(err))
	}
	return code
}

// Reason is the one-line sentence printed for err: its text without the
// package prefix, control characters replaced by spaces, bounded in length.
func Reason(err error) string {
	s := strings.TrimPrefix(err.Error(), "providersim: ")
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	if len(s) > maxReasonLen {
		s = strings.ToValidUTF8(s[:maxReasonLen], "") + "…"
	}
	return s
}

// ExitCode is the exit status for err: ExitInvalid for bad input, else
// ExitFailure (ExitOK for nil).
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrUsage), errors.Is(err, ErrTokens), errors.Is(err, ErrHeader),
		errors.Is(err, ErrLayoutMismatch), errors.Is(err, ErrRegion), errors.Is(err, ErrStart):
		return ExitInvalid
	}
	return ExitFailure
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("onebit-provider-sim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.tokens, "tokens", "", "tokens file (JSON array of token ids)")
	fs.StringVar(&o.model, "model", "", "model file")
	fs.StringVar(&o.state, "state", "", "file route: state file to write")
	fs.StringVar(&o.layout, "layout", "", "shared route: share header JSON file")
	fs.StringVar(&o.fds, "fds", "", "shared route: inherited region fds, in fd_index order (3,4,…)")
	fs.IntVar(&o.start, "start", 0, "shared route: cells 0..P-1 already hold the prompt's first P tokens; prefill P..N-1")
	fs.BoolVar(&o.compact, "compact", false, "write layer 0's records only, not every layer's full cells (fast tests; not a real provider's costs)")
	fs.IntVar(&o.nLayer, "n-layer", simkv.DefaultNLayer, "file route: layers of the model (the decoder's --n-layer)")
	fs.IntVar(&o.cellSize, "cell-size", simkv.DefaultCellSize, "file route: KV bytes per cell over all layers, K and V (the decoder's --cell-size)")
	fs.Float64Var(&o.fixedMs, "fixed-ms", 0, "spend at least this long per job (process start, model load)")
	fs.Float64Var(&o.msPerToken, "ms-per-token", 0, "and this long per prefilled token")
	fs.BoolVar(&o.serve, "serve", false, "warm provider: serve jobs on --socket (DESIGN §2c, package provjob)")
	fs.StringVar(&o.socket, "socket", "", "--serve: unix socket path to listen on")
	fs.BoolVar(&o.fail, "fail", false, "fault: fail before doing anything (exit --exit-code; serve: reply ok false)")
	fs.IntVar(&o.exitCode, "exit-code", ExitFailure, "fault: exit status of --fail")
	fs.BoolVar(&o.hang, "hang", false, "fault: block until killed")
	fs.DurationVar(&o.slow, "slow", 0, "fault: sleep this long first")
	fs.BoolVar(&o.writeThenFail, "write-then-fail", false, "fault: write everything, then fail")
	fs.BoolVar(&o.faultFromPrompt, "fault-from-prompt", false, "fault: a FAULT:<name> marker in the job's tokens injects prov-fail, prov-hang, prov-slow, prov-write-then-fail or prov-keep-writing into that job (internal/simfault)")
	fs.DurationVar(&o.faultDelay, "fault-delay", DefaultFaultDelay, "with --fault-from-prompt: how long prov-slow sleeps")
	fs.BoolVar(&o.keepWriting, "keep-writing", false, "fault: write everything, then keep writing a counter into the KV (or the state file) every millisecond until killed, never finishing")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	case o.exitCode < 1 || o.exitCode > 125:
		return o, fmt.Errorf("%w: --exit-code %d is outside 1..125", ErrUsage, o.exitCode)
	case o.fixedMs < 0 || o.msPerToken < 0 || o.fixedMs > 1e7 || o.msPerToken > 1e6 || o.faultDelay < 0:
		return o, fmt.Errorf("%w: --fixed-ms and --ms-per-token must be non-negative", ErrUsage)
	case o.nLayer < 1 || o.cellSize <= 0 || o.cellSize%(2*o.nLayer) != 0 || o.cellSize/(2*o.nLayer) < simkv.RecordSize:
		return o, fmt.Errorf("%w: --cell-size %d is not a multiple of 2 x --n-layer %d of at least %d bytes per layer and kind",
			ErrUsage, o.cellSize, o.nLayer, simkv.RecordSize)
	case o.start < 0:
		return o, fmt.Errorf("%w: --start %d is negative", ErrUsage, o.start)
	case o.serve:
		if o.socket == "" || o.tokens != "" || o.state != "" || o.layout != "" || o.fds != "" || o.start != 0 {
			return o, fmt.Errorf("%w: --serve takes --socket and no job flags (--tokens, --state, --layout, --fds, --start)", ErrUsage)
		}
	case o.socket != "":
		return o, fmt.Errorf("%w: --socket needs --serve", ErrUsage)
	case o.tokens == "" || o.model == "":
		return o, fmt.Errorf("%w: --tokens and --model are required", ErrUsage)
	case o.state != "" && (o.layout != "" || o.fds != ""):
		return o, fmt.Errorf("%w: --state (file route) excludes --layout and --fds (shared route)", ErrUsage)
	case o.state == "" && (o.layout == "" || o.fds == ""):
		return o, fmt.Errorf("%w: give --state (file route) or --layout and --fds (shared route)", ErrUsage)
	case o.state != "" && o.start != 0:
		return o, fmt.Errorf("%w: --start is for the shared route; the file route hands over the whole prompt", ErrUsage)
	}
	return o, nil
}

func (o *options) geometry() Geometry {
	return Geometry{NLayer: o.nLayer, Stride: o.cellSize / (2 * o.nLayer)}
}

func run(ctx context.Context, args []string, stderr io.Writer) (int, error) {
	o, err := parseFlags(args)
	if err != nil {
		return ExitCode(err), err
	}
	if o.serve {
		err := serve(ctx, o, stderr)
		return ExitCode(err), err
	}
	// The fault switches come before anything is read (exit statuses and
	// reasons of §2 do not depend on the inputs), except a fault that the
	// prompt names, which needs the tokens.
	t0 := time.Now()
	var jb *job
	if o.faultFromPrompt {
		if jb, err = execJob(o); err != nil {
			return ExitCode(err), err
		}
		defer jb.close()
		o = o.withPromptFault(jb.tokens)
	}
	if err := o.faultsBefore(ctx); err != nil {
		return ExitFailure, err
	}
	if o.fail {
		return o.exitCode, ErrSimulated
	}
	if jb == nil {
		if jb, err = execJob(o); err != nil {
			return ExitCode(err), err
		}
		defer jb.close()
	}
	_, err = o.runJob(ctx, jb, t0)
	return ExitCode(err), err
}

// withPromptFault is o with the fault switch that a FAULT:<name> marker in
// tokens names turned on (--fault-from-prompt; package simfault).
func (o options) withPromptFault(tokens []int) options {
	switch simfault.FromTokens(tokens) {
	case simfault.ProvFail:
		o.fail = true
	case simfault.ProvHang:
		o.hang = true
	case simfault.ProvSlow:
		o.slow = o.faultDelay
	case simfault.ProvWriteThenFail:
		o.writeThenFail = true
	case simfault.ProvKeepWriting:
		o.keepWriting = true
	}
	return o
}

// job is one prefill, from the command line or from a provjob job.
type job struct {
	tokens    []int
	modelPath string
	start     int
	state     string         // file route
	header    []byte         // shared route: the share header JSON
	files     []*os.File     // shared route: region fds in fd_index order
	hdr       *fdpass.Header // parsed by runJob
}

func (j *job) close() {
	for _, f := range j.files {
		f.Close()
	}
}

// execJob builds the job of an exec'd provider from its flags: the tokens
// and layout files are read, the inherited fds checked.
func execJob(o options) (*job, error) {
	j := &job{modelPath: o.model, start: o.start, state: o.state}
	if o.state == "" {
		fds, err := simkv.ParseFDList(o.fds)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUsage, strings.TrimPrefix(err.Error(), "simkv: "))
		}
		for _, fd := range fds {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
				j.close()
				return nil, fmt.Errorf("%w: fd %d of --fds is not open in this process", ErrUsage, fd)
			}
			j.files = append(j.files, os.NewFile(uintptr(fd), fmt.Sprintf("region-fd-%d", fd)))
		}
	}
	var err error
	if j.tokens, err = ReadTokensFile(o.tokens); err != nil {
		j.close()
		return nil, err
	}
	if o.state == "" {
		if j.header, err = readBounded(o.layout, fdpass.MaxHeaderLen); err != nil {
			j.close()
			return nil, fmt.Errorf("%w %s: %v", ErrHeader, o.layout, err)
		}
	}
	return j, nil
}

// faultsBefore applies --slow and --hang.
func (o *options) faultsBefore(ctx context.Context) error {
	if o.slow > 0 {
		t := time.NewTimer(o.slow)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: interrupted while slow (--slow %s)", ErrSimulated, o.slow)
		}
	}
	if o.hang {
		<-ctx.Done()
		return fmt.Errorf("%w: hang interrupted by a signal", ErrSimulated)
	}
	return nil
}

// runJob runs one job (after faultsBefore and --fail) with the time knobs
// counted from t0 and the faults after writing; it returns the number of
// cells it prefilled. It does not close the job's files.
func (o *options) runJob(ctx context.Context, j *job, t0 time.Time) (int, error) {
	model, err := modelHash(j.modelPath)
	if err != nil {
		return 0, err
	}
	for i, t := range j.tokens {
		if !simkv.ValidToken(t) {
			return 0, fmt.Errorf("%w: token %d at index %d is not in the vocabulary", ErrTokens, t, i)
		}
	}
	var targets []Target
	if j.state != "" {
		err = WriteStateFile(j.state, model, j.tokens, o.geometry(), o.compact)
	} else {
		targets, err = o.writeShared(j, model)
	}
	if err != nil {
		return 0, err
	}
	n := len(j.tokens) - j.start
	if err := spend(ctx, t0, o.fixedMs+o.msPerToken*float64(n)); err != nil {
		return 0, err
	}
	if o.keepWriting {
		return 0, keepWriting(ctx, j, targets)
	}
	if o.writeThenFail {
		return 0, fmt.Errorf("%w after writing", ErrSimulated)
	}
	return n, nil
}

// writeShared checks the header against the fds and the model and writes
// the cells; it returns the targets written.
func (o *options) writeShared(j *job, model uint64) ([]Target, error) {
	hdr, err := ParseHeader(j.header, len(j.files))
	if err != nil {
		return nil, err
	}
	if err := CheckLayout(model, &hdr); err != nil {
		return nil, err
	}
	if j.start > len(j.tokens) {
		return nil, fmt.Errorf("%w: --start %d is past the prompt's %d tokens", ErrStart, j.start, len(j.tokens))
	}
	targets, err := Plan(&hdr, len(j.tokens), !o.compact)
	if err != nil {
		return nil, err
	}
	j.hdr = &hdr
	return targets, WriteShared(j.files, targets, model, j.tokens, j.start)
}

// spend sleeps until ms milliseconds have passed since t0 (the time knobs).
func spend(ctx context.Context, t0 time.Time, ms float64) error {
	d := time.Duration(ms*float64(time.Millisecond)) - time.Since(t0)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: interrupted during the simulated prefill time", ErrSimulated)
	}
}

// keepWriting is the --keep-writing fault: every millisecond until ctx ends
// it writes an incrementing counter into the first 8 bytes of every
// prefilled cell of layer 0's K region (shared route) or rewrites the state
// file with the counter (file route), so that a test sees any write that
// happens after the provider should have been killed.
func keepWriting(ctx context.Context, j *job, targets []Target) error {
	var k0 *mapping
	if j.state == "" {
		for _, t := range targets {
			if t.Layer == 0 && t.Kind == "k" {
				m, err := mapTarget(j.files, t, j.start, len(j.tokens))
				if err != nil {
					return err
				}
				defer unix.Munmap(m.mem)
				k0 = m
			}
		}
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var b [8]byte
	for counter := uint64(1); ; counter++ {
		binary.LittleEndian.PutUint64(b[:], counter)
		if k0 != nil {
			for i := j.start; i < len(j.tokens); i++ {
				copy(k0.cell(i), b[:])
			}
		} else if err := os.WriteFile(j.state, b[:], 0o600); err != nil {
			return fmt.Errorf("%w: --keep-writing: %v", ErrWrite, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: kept writing until interrupted", ErrSimulated)
		case <-tick.C:
		}
	}
}

func modelHash(path string) (uint64, error) {
	h, err := simkv.ModelHash(path)
	if err != nil {
		return 0, fmt.Errorf("%w %s: %v", ErrModel, path, errors.Unwrap(err))
	}
	return h, nil
}
