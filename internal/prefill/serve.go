package prefill

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

// ErrServe: the warm mode could not listen.
var ErrServe = errors.New("prefill: cannot serve")

// Bounds of one connection in warm mode.
const (
	jobReadTimeout = 10 * time.Second
	replyTimeout   = 5 * time.Second
)

// Serve is onebit-prefill --serve --socket PATH: the warm provider of
// DESIGN §2c on the file route. It listens on path (mode 0600; a stale
// socket nobody answers on is replaced), calls ready once it accepts, and
// runs each connection's job with Run: base gives the prefill server, its
// slots and key; the job gives the tokens, the model and the state file. A
// shared-route job is refused (a prefill llama-server cannot fill the
// decoder's regions). It returns when ctx ends, after the running jobs.
func Serve(ctx context.Context, path string, base Config, ready func()) error {
	ln, err := provjob.Listen(path)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrServe, err)
	}
	if ready != nil {
		ready()
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("%w: accept: %v", ErrServe, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			serveConn(ctx, conn, base)
		}()
	}
}

// serveConn reads one job, runs it and replies; the job's fds (none on the
// file route) are closed before the reply.
func serveConn(ctx context.Context, conn *net.UnixConn, base Config) {
	pj, files, err := provjob.ReadJob(conn, time.Now().Add(jobReadTimeout))
	if err != nil {
		if !errors.Is(err, io.EOF) && !errors.Is(err, provjob.ErrShort) { // a readiness probe sends nothing
			_ = provjob.WriteReply(conn, provjob.Reply{Reason: err.Error()}, time.Now().Add(replyTimeout))
		}
		return
	}
	provjob.CloseFiles(files)
	t0 := time.Now()
	rep := provjob.Reply{}
	if pj.Route != "file" {
		rep.Reason = "onebit-prefill is a file-route provider: a prefill llama-server cannot fill the decoder's shared regions"
	} else {
		cfg := base
		cfg.Tokens, cfg.TokensPath, cfg.Model, cfg.StatePath = pj.Tokens, "", pj.Model, pj.State
		res, err := Run(ctx, cfg)
		if err != nil {
			rep.Reason = err.Error()
		} else {
			rep = provjob.Reply{OK: true, NTokens: res.NTokens, PrefillMs: float64(time.Since(t0).Nanoseconds()) / 1e6}
		}
	}
	_ = provjob.WriteReply(conn, rep, time.Now().Add(replyTimeout))
}
