// Command onebit-decoder-sim is a simulated llama-server with the fork's
// share/adopt slot actions (see internal/decodersim). It takes llama-server's
// flags (--host --port -c -np --slot-save-path -m -fa -b -ub -ctk -ctv
// --api-key --api-key-file; --host PATH.sock listens on a unix socket) plus
// the sim's own (--recurrent --chunk-size --cell-size --n-layer
// --loading-delay --token-delay --lax-share-id --compact
// --prompt-ms-per-token; --fault-from-prompt --fault-delay for the soak
// test), prints "onebit-decoder-sim listening on
// http://HOST:PORT" (or "unix://PATH") to stderr once serving, and shuts down
// gracefully on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/onebitd/onebitd/internal/decodersim"
)

// shutdownGrace is how long running requests get to finish on SIGTERM.
const shutdownGrace = 10 * time.Second

func main() { os.Exit(run()) }

func run() int {
	cfg, err := decodersim.ParseArgs(os.Args[1:], os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		fmt.Fprintf(os.Stderr, "onebit-decoder-sim: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	srv, err := decodersim.New(cfg, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "onebit-decoder-sim: %v\n", err)
		return 1
	}
	defer srv.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = srv.ListenAndServe(ctx, shutdownGrace, func(url string) {
		fmt.Fprintf(os.Stderr, "onebit-decoder-sim listening on %s\n", url)
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "onebit-decoder-sim: %v\n", err)
		return 1
	}
	return 0
}
