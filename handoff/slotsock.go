package handoff

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onebitd/onebitd/fdpass"
)

// SlotSocketName is the share socket of slot k in the slot dir (DESIGN §2b):
// kvshare-<k>.sock, listened on at startup and kept.
func SlotSocketName(k int) string { return "kvshare-" + strconv.Itoa(k) }

// slotSockets are the per-slot share sockets. A connection is taken only
// while that slot's share is in flight (armed) and only from the checked
// peer; any other connection is closed at once. The slot pool guarantees one
// share in flight per slot.
type slotSockets struct {
	ls    []*fdpass.Listener
	armed []atomic.Pointer[waiter]
	log   *slog.Logger
	wg    sync.WaitGroup

	// Refused counts connections closed at once: none in flight, or a
	// second connection during one share.
	refused atomic.Uint64
}

// waiter is one in-flight share's claim on its slot's socket.
type waiter struct {
	taken atomic.Bool       // a connection (or the end of the wait) claimed it
	ch    chan *fdpass.Conn // the claiming connection, buffered 1
}

// openSlotSockets listens on n sockets in dir and starts one accept loop
// for each. On error nothing stays open.
func openSlotSockets(dir string, n int, log *slog.Logger) (*slotSockets, error) {
	s := &slotSockets{ls: make([]*fdpass.Listener, n), armed: make([]atomic.Pointer[waiter], n), log: log}
	for k := range n {
		l, err := fdpass.Listen(dir, SlotSocketName(k))
		if err != nil {
			for _, o := range s.ls[:k] {
				o.Close()
			}
			return nil, fmt.Errorf("share socket of slot %d: %w", k, err)
		}
		s.ls[k] = l
	}
	for k := range n {
		s.wg.Add(1)
		go s.serve(k)
	}
	return s, nil
}

// path is slot k's socket path, given to the decoder in the share body.
func (s *slotSockets) path(k int) string { return s.ls[k].Path() }

// arm claims slot k's socket for one share: the next connection is its.
func (s *slotSockets) arm(k int) *waiter {
	w := &waiter{ch: make(chan *fdpass.Conn, 1)}
	s.armed[k].Store(w)
	return w
}

// wait returns the connection that claimed w, or an error at deadline or
// when ctx ends. Either way w is disarmed when it returns: a later
// connection is refused, and one that claimed w meanwhile is closed.
func (s *slotSockets) wait(ctx context.Context, k int, w *waiter, deadline time.Time) (*fdpass.Conn, error) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	var err error
	select {
	case c := <-w.ch:
		s.armed[k].CompareAndSwap(w, nil)
		return c, nil
	case <-t.C:
		err = fdpass.ErrAcceptTimeout
	case <-ctx.Done():
		err = fmt.Errorf("the share was abandoned before the decoder connected: %w", context.Cause(ctx))
	}
	s.armed[k].CompareAndSwap(w, nil)
	if !w.taken.CompareAndSwap(false, true) {
		(<-w.ch).Close() // claimed just now: sent without blocking
	}
	return nil, err
}

// serve accepts on slot k's socket until the listener closes. It never
// blocks on a connection: the waiting share reads it.
func (s *slotSockets) serve(k int) {
	defer s.wg.Done()
	for {
		conn, err := s.ls[k].Accept(time.Time{})
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("share socket accept", "slot", k, "error", err)
			continue
		}
		w := s.armed[k].Load()
		if w == nil || !w.taken.CompareAndSwap(false, true) {
			s.refused.Add(1)
			conn.Close() // nobody asked for a share on this slot now
			continue
		}
		w.ch <- conn
	}
}

// close stops the accept loops and removes the sockets.
func (s *slotSockets) close() {
	for _, l := range s.ls {
		l.Close()
	}
	s.wg.Wait()
}
