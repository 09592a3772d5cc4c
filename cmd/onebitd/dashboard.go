package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/dashboard"
	"github.com/onebitd/onebitd/handlers"
)

// defaultDashboardListen is where `onebitd dashboard` serves by default.
const defaultDashboardListen = "127.0.0.1:8090"

// dashboardShutdown bounds the HTTP server's shutdown.
const dashboardShutdown = 5 * time.Second

// dashboardMain is `onebitd dashboard`: the live dashboard of every node
// publishing on a NATS server (see package dashboard). Ctrl-C exits 0; 1
// when NATS cannot be reached or the address cannot be listened on at
// start; 2 on bad usage.
func dashboardMain(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return dashboardRun(ctx, args, os.Stderr, nil)
}

// dashboardRun is dashboardMain without the process: ready (may be nil) is
// called with the page's URL once the subscription is in place and the
// server listens.
func dashboardRun(ctx context.Context, args []string, stderr io.Writer, ready func(url string)) int {
	fs := flag.NewFlagSet("onebitd dashboard", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", defaultDashboardListen, "address of the dashboard's HTTP server (host:port)")
	subject := fs.String("subject", dashboard.SubjectAll, "subject to subscribe to")
	keyFile := fs.String("api-key-file", "", "API keys, one a line: the page asks for one, scripts send it as a Bearer token")
	nf := addNATSFlags(fs, bus.DefaultURL)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "onebitd dashboard: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var keys []string
	if *keyFile != "" {
		var err error
		if keys, err = handlers.LoadAPIKeys(*keyFile); err != nil {
			fmt.Fprintf(stderr, "onebitd dashboard: %v\n", err)
			return 2
		}
	}
	errw := &gatedWriter{w: stderr}
	defer errw.shut()
	log := slog.New(slog.NewTextHandler(errw, &slog.HandlerOptions{Level: slog.LevelWarn}))
	nc, as, err := nf.connectLive("onebitd dashboard", errw)
	if err != nil {
		return 1
	}
	defer func() {
		errw.shut() // no "disconnected" line for our own Close
		nc.Close()
	}()

	hub := dashboard.NewHub(dashboard.Config{Logger: log, CheckKey: dashboard.KeyChecker(keys)})
	if _, err := hub.Subscribe(nc, *subject); err != nil {
		fmt.Fprintf(errw, "onebitd dashboard: %v\n", err)
		return 1
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(errw, "onebitd dashboard: %v (see --listen)\n", err)
		return 1
	}
	mux := http.NewServeMux()
	h := hub.Handler()
	mux.Handle("/ui/", h)
	mux.Handle("/api/", h)
	mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	url := "http://" + ln.Addr().String() + "/ui/"
	if as != "" {
		fmt.Fprintf(errw, "onebitd dashboard: %s shows %s on %s as %s\n", url, *subject, nc.ConnectedUrlRedacted(), as)
	} else {
		fmt.Fprintf(errw, "onebitd dashboard: %s shows %s on %s\n", url, *subject, nc.ConnectedUrlRedacted())
	}
	if ready != nil {
		ready(url)
	}
	code := 0
	select {
	case <-ctx.Done():
	case err := <-served:
		fmt.Fprintf(errw, "onebitd dashboard: %v\n", err)
		code = 1
	}
	hub.Close() // ends the SSE streams so Shutdown does not wait for them
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dashboardShutdown)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	return code
}
