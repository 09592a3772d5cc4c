// Command onebit-prefill is onebitd's file-route provider backed by a second
// llama-server, the prefill server: disaggregated prefill on two
// llama-servers over a shared directory (see internal/prefill and
// docs/llama-server.md).
//
//	onebit-prefill --prefill-url URL [--slot N | --slots N] [--timeout D] \
//	    --tokens FILE --model GGUF --state /dir/STEM.bin
//	onebit-prefill --serve --socket PATH --prefill-url URL [--slots N]   # warm (DESIGN §2c)
//
// The prefill server must load the same model as the decoder and run with
// --slot-save-path equal to dirname(--state) (onebitd's --slot-dir). onebitd
// passes --prefill-url and --slot with --provider-arg. Exit status: 0 when
// the state file is complete, 1 on failure, 2 on bad usage or a model
// mismatch; the last stderr line says why.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/onebitd/onebitd/internal/prefill"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

func run(args []string, stderr io.Writer) int {
	var cfg prefill.Config
	fs := flag.NewFlagSet("onebit-prefill", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.PrefillURL, "prefill-url", "", "base URL of the prefill llama-server (required)")
	fs.StringVar(&cfg.APIKeyFile, "prefill-api-key-file", "", "file holding the prefill server's API key (its --api-key-file)")
	fs.IntVar(&cfg.Slot, "slot", 0, "slot of the prefill server to evaluate the prompt in")
	fs.IntVar(&cfg.Slots, "slots", 0, "use any free slot of 0..N-1 of the prefill server instead of --slot (concurrent runs)")
	fs.DurationVar(&cfg.Timeout, "timeout", prefill.DefaultTimeout, "time limit of the whole run")
	fs.StringVar(&cfg.TokensPath, "tokens", "", "JSON array of the prompt's token ids (required)")
	fs.StringVar(&cfg.Model, "model", "", "model GGUF; its file name must match the prefill server's model (required)")
	fs.StringVar(&cfg.StatePath, "state", "", "state file to produce, in the prefill server's --slot-save-path (required)")
	serve := fs.Bool("serve", false, "warm mode (onebitd --provider-mode serve): take jobs on --socket instead of one run; each job names its tokens, model and state file")
	socket := fs.String("socket", "", "with --serve: the unix socket to listen on")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "onebit-prefill: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if *serve {
		if *socket == "" || cfg.PrefillURL == "" {
			fmt.Fprintln(stderr, "onebit-prefill: --serve needs --socket and --prefill-url")
			return 2
		}
		err := prefill.Serve(ctx, *socket, cfg, func() { fmt.Fprintf(stderr, "onebit-prefill serving on %s\n", *socket) })
		if err != nil {
			fmt.Fprintf(stderr, "onebit-prefill: %v\n", err)
			return 1
		}
		return 0
	}
	res, err := prefill.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "onebit-prefill: %v\n", err)
		return prefill.ExitCode(err)
	}
	fmt.Fprintf(stderr, "onebit-prefill: saved %d tokens (%d evaluated, %d bytes) to %s\n",
		res.NSaved, res.PromptN, res.NWritten, cfg.StatePath)
	return 0
}
