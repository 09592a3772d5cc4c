// Command onebit-provider-sim is the sim prefill provider: the provider
// contracts of DESIGN §2 (file route and shared route, --start P of §2b, the
// warm provider's --serve --socket PATH of §2c) with the deterministic model
// of internal/simkv, plus --compact, time knobs and fault switches for tests.
// See package internal/providersim for the flags and exit statuses.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/onebitd/onebitd/internal/providersim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := providersim.Main(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}
