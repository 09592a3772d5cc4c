// Package providersim is the sim prefill provider (cmd/onebit-provider-sim):
// it implements both provider contracts of DESIGN §2 with the deterministic
// model of internal/simkv.
//
// File route:
//
//	onebit-provider-sim --tokens FILE --model GGUF --state OUT.bin
//
// reads the tokens, computes their cells and writes a simkv state file to
// OUT.bin atomically (OUT.bin.tmp, fsync, rename).
//
// Shared route:
//
//	onebit-provider-sim --tokens FILE --model GGUF --layout HEADER.json --fds 3,4,5
//
// checks the share header's layout hash against its own model, then writes
// the records of cells 0..n-1 into layer 0's K and V regions of the inherited
// fds (mapped MAP_SHARED), touching nothing else.
//
// Exit status: 0 success; 1 a failure while working (I/O, a fault switch);
// 2 bad input (command line, tokens, header, layout mismatch, regions too
// small), detected before anything is written. On failure the last stderr
// line is one sentence, the reason onebitd reports for its fallback.
//
// Fault switches for tests: --fail (exit --exit-code, default 1, before doing
// anything), --slow D (sleep D first), --hang (block until killed),
// --write-then-fail (do the whole write, then exit 1).
package providersim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

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
	exitCode                          int
	slow                              time.Duration
}

// Main runs the provider with args (without the program name), printing the
// reason of a failure as the last line of stderr, and returns the exit
// status. ctx ends --hang and --slow (the command cancels it on SIGINT and
// SIGTERM; SIGKILL needs no help).
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	code, err := run(ctx, args)
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
		errors.Is(err, ErrLayoutMismatch), errors.Is(err, ErrRegion):
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
	fs.BoolVar(&o.fail, "fail", false, "fault: exit with --exit-code before doing anything")
	fs.IntVar(&o.exitCode, "exit-code", ExitFailure, "fault: exit status of --fail")
	fs.BoolVar(&o.hang, "hang", false, "fault: block until killed")
	fs.DurationVar(&o.slow, "slow", 0, "fault: sleep this long first")
	fs.BoolVar(&o.writeThenFail, "write-then-fail", false, "fault: write everything, then exit 1")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	case o.exitCode < 1 || o.exitCode > 125:
		return o, fmt.Errorf("%w: --exit-code %d is outside 1..125", ErrUsage, o.exitCode)
	case o.tokens == "" || o.model == "":
		return o, fmt.Errorf("%w: --tokens and --model are required", ErrUsage)
	case o.state != "" && (o.layout != "" || o.fds != ""):
		return o, fmt.Errorf("%w: --state (file route) excludes --layout and --fds (shared route)", ErrUsage)
	case o.state == "" && (o.layout == "" || o.fds == ""):
		return o, fmt.Errorf("%w: give --state (file route) or --layout and --fds (shared route)", ErrUsage)
	}
	return o, nil
}

func run(ctx context.Context, args []string) (int, error) {
	o, err := parseFlags(args)
	if err != nil {
		return ExitCode(err), err
	}
	if o.slow > 0 {
		t := time.NewTimer(o.slow)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ExitFailure, fmt.Errorf("%w: interrupted while slow (--slow %s)", ErrSimulated, o.slow)
		}
	}
	if o.fail {
		return o.exitCode, ErrSimulated
	}
	if o.hang {
		<-ctx.Done()
		return ExitFailure, fmt.Errorf("%w: hang interrupted by a signal", ErrSimulated)
	}
	if o.state != "" {
		err = runFile(o)
	} else {
		err = runShared(o)
	}
	if err == nil && o.writeThenFail {
		err = fmt.Errorf("%w after writing", ErrSimulated)
	}
	return ExitCode(err), err
}

func modelHash(path string) (uint64, error) {
	h, err := simkv.ModelHash(path)
	if err != nil {
		return 0, fmt.Errorf("%w %s: %v", ErrModel, path, errors.Unwrap(err))
	}
	return h, nil
}

func runFile(o options) error {
	tokens, err := ReadTokensFile(o.tokens)
	if err != nil {
		return err
	}
	model, err := modelHash(o.model)
	if err != nil {
		return err
	}
	return WriteStateFile(o.state, model, tokens)
}

func runShared(o options) error {
	fds, err := simkv.ParseFDList(o.fds)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, strings.TrimPrefix(err.Error(), "simkv: "))
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			return fmt.Errorf("%w: fd %d of --fds is not open in this process", ErrUsage, fd)
		}
		files[i] = os.NewFile(uintptr(fd), fmt.Sprintf("region-fd-%d", fd))
	}
	tokens, err := ReadTokensFile(o.tokens)
	if err != nil {
		return err
	}
	hdr, err := ReadHeaderFile(o.layout, len(fds))
	if err != nil {
		return err
	}
	model, err := modelHash(o.model)
	if err != nil {
		return err
	}
	if err := CheckLayout(model, &hdr); err != nil {
		return err
	}
	targets, err := Plan(&hdr, len(tokens))
	if err != nil {
		return err
	}
	return WriteShared(files, targets, model, tokens)
}
