package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/watch"
)

// watchMain is `onebitd watch`: a live table of requests on a terminal, else
// one line per handoff event from NATS (see package watch). Ctrl-C exits 0;
// 1 when the server cannot be reached at start; 2 on bad usage.
func watchMain(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tty := isatty.IsTerminal(os.Stdout.Fd()) && os.Getenv("NO_COLOR") == ""
	return watchRun(ctx, args, os.Stdout, os.Stderr, tty, nil)
}

// watchRun is watchMain without the process: ready (may be nil) is called
// once the subscription is in place.
func watchRun(ctx context.Context, args []string, stdout, stderr io.Writer, tty bool, ready watch.Ready) int {
	fs := flag.NewFlagSet("onebitd watch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		subject string
		p       = watch.Printer{W: stdout, Colour: tty, Loc: time.Local}
	)
	nf := addNATSFlags(fs, bus.DefaultURL)
	fs.BoolVar(&p.Failed, "failed", false, "only fallbacks, failed requests and events carrying a reason")
	fs.BoolVar(&p.JSON, "json", false, "print each event's JSON payload, one per line")
	fs.StringVar(&subject, "subject", watch.SubjectAll, "subject to subscribe to")
	fs.StringVar(&p.Node, "node", "", "only events of this node")
	fs.StringVar(&p.Route, "route", "", "only requests on this route (plain, file, shared, fallback)")
	lines := fs.Bool("lines", false, "one line per event even on a terminal (default there: a live table)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "onebitd watch: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if p.JSON {
		p.Colour = false
	}
	if tty && !p.JSON && !*lines {
		p.Table = &watch.Table{Loc: time.Local}
		if rows, cols, ok := termSize(stdout); ok {
			p.Table.Width = cols
			p.Table.Rows = max(rows-12, 5) // header, summary and lifecycle lines fit on the screen
		}
	}
	// nats.go's handlers write from their own goroutine, possibly while the
	// connection closes: serialise them and silence them once we return.
	errw := &gatedWriter{w: stderr}
	defer errw.shut()
	nc, as, err := nf.connectLive("onebitd watch", errw)
	if err != nil {
		return 1
	}
	defer func() {
		errw.shut() // no "disconnected" line for our own Close
		nc.Close()
	}()
	onReady := func(subject string) {
		if as != "" {
			fmt.Fprintf(errw, "onebitd watch: watching %s on %s as %s\n", subject, nc.ConnectedUrlRedacted(), as)
		} else {
			fmt.Fprintf(errw, "onebitd watch: watching %s on %s\n", subject, nc.ConnectedUrlRedacted())
		}
		if ready != nil {
			ready(subject)
		}
	}
	if err := watch.Run(ctx, nc, subject, &p, errw, onReady); err != nil {
		fmt.Fprintf(errw, "onebitd watch: %v\n", err)
		return 1
	}
	return 0
}

// termSize is the terminal's rows and columns when w is one.
func termSize(w io.Writer) (rows, cols int, ok bool) {
	f, isFile := w.(*os.File)
	if !isFile {
		return 0, 0, false
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil || ws.Row == 0 || ws.Col == 0 {
		return 0, 0, false
	}
	return int(ws.Row), int(ws.Col), true
}

// gatedWriter serialises writes and drops them after shut.
type gatedWriter struct {
	mu   sync.Mutex
	w    io.Writer
	done bool
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done {
		return len(p), nil
	}
	return g.w.Write(p)
}

func (g *gatedWriter) shut() {
	g.mu.Lock()
	g.done = true
	g.mu.Unlock()
}
