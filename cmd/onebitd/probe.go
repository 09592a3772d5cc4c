package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/onebitd/onebitd/probe"
)

// probeMain is `onebitd probe-decoder`: a conformance table for a decoder
// (see package probe). Exit status 1 on any FAIL, 2 on bad usage.
func probeMain(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return probeRun(ctx, args, os.Stdout, os.Stderr)
}

func probeRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("onebitd probe-decoder", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg     probe.Config
		asJSON  bool
		timeout time.Duration
	)
	fs.StringVar(&cfg.DecoderURL, "decoder-url", "", "base URL of the decoder to probe (required)")
	fs.StringVar(&cfg.APIKeyFile, "decoder-api-key-file", "", "the decoder's API key file (its --api-key-file)")
	fs.IntVar(&cfg.Slot, "slot", 0, "slot to probe (it is erased at the end; use an idle one)")
	fs.StringVar(&cfg.SlotDir, "slot-dir", "", "the decoder's --slot-save-path, if local: remove "+probe.ProbeFile+" from it afterwards")
	fs.DurationVar(&timeout, "timeout", 30*time.Second, "limit per request and per socket wait")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "onebitd probe-decoder: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if cfg.DecoderURL == "" {
		fmt.Fprintln(stderr, "onebitd probe-decoder: --decoder-url is required")
		return 2
	}
	cfg.Timeout = timeout
	rep, err := probe.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "onebitd probe-decoder: %v\n", err)
		return 2
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "onebitd probe-decoder: %v\n", err)
		return 1
	}
	if rep.Failed() {
		return 1
	}
	return 0
}
