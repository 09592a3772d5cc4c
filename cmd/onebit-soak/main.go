// Command onebit-soak runs the soak test of package soak: onebitd stacks in
// front of the decoder simulator and the sim provider, a fault drawn per
// request, and the checks of docs/RELIABILITY.md. It prints the report
// (Markdown) on stdout and exits 1 when a check failed, 2 when the soak
// could not run.
//
//	onebit-soak [--duration 10m] [--bin-dir bin] [--seed N] [--keep]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/onebitd/onebitd/soak"
)

func main() { os.Exit(run()) }

func run() int {
	fs := flag.NewFlagSet("onebit-soak", flag.ContinueOnError)
	duration := fs.Duration("duration", 10*time.Minute, "how long to send requests (the checks come after)")
	binDir := fs.String("bin-dir", "bin", "directory holding onebitd, onebit-decoder-sim and onebit-provider-sim")
	seed := fs.Uint64("seed", 0, "seed of the fault decks and prompts (0: from the clock; printed)")
	keep := fs.Bool("keep", false, "keep the run's temp dir (state dirs, event logs)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *duration <= 0 || *duration > 24*time.Hour {
		fmt.Fprintln(os.Stderr, "onebit-soak: --duration must be in (0, 24h]")
		return 2
	}
	dir, err := filepath.Abs(*binDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "onebit-soak:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := soak.Run(ctx, soak.Config{
		Duration: *duration,
		Onebitd:  filepath.Join(dir, "onebitd"),
		Sim:      filepath.Join(dir, "onebit-decoder-sim"),
		Provider: filepath.Join(dir, "onebit-provider-sim"),
		Seed:     *seed,
		Log:      os.Stderr,
		KeepDir:  *keep,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "onebit-soak:", err)
		return 2
	}
	rep.Markdown(os.Stdout)
	if *keep {
		fmt.Fprintln(os.Stderr, "onebit-soak: kept", rep.Dir)
	}
	if rep.Failed() {
		return 1
	}
	return 0
}
