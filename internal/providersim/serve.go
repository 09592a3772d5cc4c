package providersim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/onebitd/onebitd/provjob"
)

// jobReadTimeout bounds how long a connection may take to send its job.
const jobReadTimeout = 10 * time.Second

// replyTimeout bounds writing a reply.
const replyTimeout = 5 * time.Second

// serve is --serve --socket PATH: the warm provider of DESIGN §2c. It
// listens on PATH (mode 0600; a stale socket left by a killed run is
// replaced), prints "onebit-provider-sim serving on PATH" to stderr, and runs
// each connection's job (package provjob) concurrently with the same code,
// fault switches and time knobs as an exec'd run: --fail replies ok false,
// --hang never replies, --write-then-fail writes and replies ok false,
// --keep-writing writes and keeps writing until killed. Every fd of a job is
// closed (its mappings are gone already) before the reply is written. It
// returns when ctx ends, after the running jobs (which ctx interrupts).
func serve(ctx context.Context, o options, stderr io.Writer) error {
	ln, err := provjob.Listen(o.socket)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrServe, err)
	}
	fmt.Fprintf(stderr, "onebit-provider-sim serving on %s\n", o.socket)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("%w: accept: %v", ErrServe, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			o.serveConn(ctx, conn)
		}()
	}
}

// serveConn reads one job, runs it, closes its fds and replies.
func (o *options) serveConn(ctx context.Context, conn *net.UnixConn) {
	pj, files, err := provjob.ReadJob(conn, time.Now().Add(jobReadTimeout))
	if err != nil {
		_ = provjob.WriteReply(conn, provjob.Reply{Reason: Reason(err)}, time.Now().Add(replyTimeout))
		return
	}
	t0 := time.Now()
	j := &job{tokens: pj.Tokens, modelPath: pj.Model, start: pj.Start, state: pj.State, header: pj.Layout, files: files}
	if o.faultFromPrompt {
		po := o.withPromptFault(pj.Tokens)
		o = &po
	}
	n, err := func() (int, error) {
		defer j.close() // before the reply, on every path
		if err := o.faultsBefore(ctx); err != nil {
			return 0, err
		}
		if o.fail {
			return 0, ErrSimulated
		}
		return o.runJob(ctx, j, t0)
	}()
	rep := provjob.Reply{OK: true, NTokens: n, PrefillMs: float64(time.Since(t0).Nanoseconds()) / 1e6}
	if err != nil {
		rep = provjob.Reply{Reason: Reason(err)}
	}
	_ = provjob.WriteReply(conn, rep, time.Now().Add(replyTimeout))
}
