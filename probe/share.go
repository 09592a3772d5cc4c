package probe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/fdpass"
)

// shareChecks runs the share/adopt lines and the recurrent line.
func (p *prober) shareChecks(ctx context.Context, toks []int) {
	dir, err := os.MkdirTemp("", "onebit-probe-") // 0700, short path
	if err != nil {
		p.add(CheckShare, Fail, "socket directory: %v", err)
		p.skip("no socket", CheckNoShareID, CheckOlder, CheckAdopt, CheckReused, CheckRecurrent)
		return
	}
	defer os.RemoveAll(dir)

	s1, err := p.share(ctx, dir, "s1.sock")
	switch {
	case errors.Is(err, decoder.ErrNoShare):
		for _, n := range append(shareChecks, CheckRecurrent) {
			p.add(n, NotSupported, "no ?action=share (upstream llama-server): the file route works, the shared route needs the fork")
		}
		return
	case decoder.IsStatus(err, http.StatusNotImplemented):
		for _, n := range shareChecks {
			p.add(n, NotSupported, "recurrent cache: share answers 501")
		}
		p.recurrent(ctx, toks, err)
		return
	case err != nil:
		p.add(CheckShare, Fail, "%v", err)
		p.skip("no share", CheckNoShareID, CheckOlder, CheckAdopt, CheckReused, CheckRecurrent)
		return
	}
	p.add(CheckShare, Pass, "%s", s1.detail)

	p.refused(CheckNoShareID, p.adoptRaw(ctx, map[string]any{"tokens": toks}), "an adopt without share_id")

	s2, err := p.share(ctx, dir, "s2.sock")
	if err != nil {
		p.skip(fmt.Sprintf("the second share failed: %v", err), CheckOlder, CheckAdopt, CheckReused)
	} else {
		p.refused(CheckOlder, p.adopt(ctx, toks, s1.id), fmt.Sprintf("share_id %d after share %d", s1.id, s2.id))
		if err := p.adopt(ctx, toks, s2.id); err != nil {
			p.add(CheckAdopt, Fail, "share_id %d refused: %v", s2.id, err)
			p.skip("the last share could not be adopted", CheckReused)
		} else {
			p.add(CheckAdopt, Pass, "share_id %d adopted (%d tokens; the slot is erased at the end)", s2.id, len(toks))
			p.refused(CheckReused, p.adopt(ctx, toks, s2.id), fmt.Sprintf("share_id %d a second time", s2.id))
		}
	}
	p.add(CheckRecurrent, NotSupported, "not applicable: the cache is shareable (share answered 200)")
}

// recurrent judges a decoder whose share answered 501: adopt must not
// succeed either.
func (p *prober) recurrent(ctx context.Context, toks []int, shareErr error) {
	var ae *decoder.APIError
	errors.As(shareErr, &ae)
	err := p.adopt(ctx, toks, 1)
	switch {
	case err == nil:
		p.add(CheckRecurrent, Fail, "share answered 501 %q but adopt answered 200", ae.Message)
	case decoder.IsStatus(err, http.StatusNotImplemented):
		p.add(CheckRecurrent, Pass, "share and adopt answer 501 %q", ae.Message)
	default:
		p.add(CheckRecurrent, Pass, "share answers 501 %q; adopt refused: %v", ae.Message, err)
	}
}

// refused records a check that expects a 4xx refusal.
func (p *prober) refused(name string, err error, what string) {
	var ae *decoder.APIError
	switch {
	case err == nil:
		p.add(name, Fail, "%s was ACCEPTED: this decoder treats share_id as decoration", what)
	case errors.As(err, &ae) && ae.Status/100 == 4:
		p.add(name, Pass, "%s refused: %d %s", what, ae.Status, ae.Message)
	default:
		p.add(name, Fail, "%s: %v (want a 4xx refusal)", what, err)
	}
}

func (p *prober) adopt(ctx context.Context, toks []int, shareID int64) error {
	return p.adoptRaw(ctx, map[string]any{"tokens": toks, "share_id": shareID})
}

func (p *prober) adoptRaw(ctx context.Context, body map[string]any) error {
	sctx, cancel := p.step(ctx)
	defer cancel()
	var out map[string]any
	return p.post(sctx, "adopt", fmt.Sprintf("/slots/%d?action=adopt", p.cfg.Slot), body, &out)
}

// shared is one successful share.
type shared struct {
	id     int64
	detail string
}

// share asks the decoder to share the slot on a fresh socket in dir,
// receives the message, checks it and closes its fds.
func (p *prober) share(ctx context.Context, dir, name string) (shared, error) {
	ln, err := fdpass.Listen(dir, name)
	if err != nil {
		return shared{}, err
	}
	defer ln.Close()
	type received struct {
		msg  *fdpass.Message
		cred fdpass.Cred
		err  error
	}
	ch := make(chan received, 1)
	deadline := time.Now().Add(p.cfg.Timeout)
	go func() {
		conn, err := ln.Accept(deadline)
		if err != nil {
			ch <- received{err: err}
			return
		}
		defer conn.Close()
		cred, _ := conn.PeerCred()
		msg, err := conn.Receive(deadline, fdpass.MaxFDs)
		ch <- received{msg: msg, cred: cred, err: err}
	}()
	sctx, cancel := p.step(ctx)
	rep, err := p.dc.Share(sctx, p.cfg.Slot, ln.Path())
	cancel()
	if err != nil {
		_ = ln.Close() // unblocks Accept
		r := <-ch
		r.msg.Close()
		return shared{}, err
	}
	r := <-ch
	if r.err != nil {
		return shared{}, fmt.Errorf("share_id %d answered, but the message: %w", *rep.ShareID, r.err)
	}
	nfds := len(r.msg.Files)
	closed := r.msg.Close()
	var bytes int64
	for _, rg := range r.msg.Header.Regions {
		bytes += rg.Size
	}
	switch {
	case closed != nfds:
		return shared{}, fmt.Errorf("share_id %d: closed %d of %d received fds", *rep.ShareID, closed, nfds)
	case rep.NFDs != 0 && rep.NFDs != nfds:
		return shared{}, fmt.Errorf("share_id %d: the reply says %d fds, %d arrived", *rep.ShareID, rep.NFDs, nfds)
	case rep.BytesMapped != 0 && rep.BytesMapped != bytes:
		return shared{}, fmt.Errorf("share_id %d: the reply says %d bytes, the header's regions hold %d", *rep.ShareID, rep.BytesMapped, bytes)
	}
	h := r.msg.Header
	lh := h.LayoutHash
	if len(lh) > 12 {
		lh = lh[:12] + "…"
	}
	return shared{id: *rep.ShareID, detail: fmt.Sprintf("share_id %d from pid %d: %d regions in %d fds, %d MiB, n_layer %d, layout_hash %s; fds closed",
		*rep.ShareID, r.cred.PID, len(h.Regions), nfds, bytes>>20, h.NLayer, lh)}, nil
}
