package handoff

import (
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
	check func(*fdpass.Conn) error
	max   int
	log   *slog.Logger
	wg    sync.WaitGroup

	// Refused counts connections closed at once: none in flight, or a
	// second connection during one share.
	refused atomic.Uint64
}

// waiter is one in-flight share's claim on its slot's socket.
type waiter struct {
	deadline time.Time
	taken    atomic.Bool   // a connection (or disarm) claimed it
	ch       chan received // the claimed connection's outcome, buffered 1
}

// openSlotSockets listens on n sockets in dir and starts one accept loop
// for each. On error nothing stays open.
func openSlotSockets(dir string, n, maxFDs int, check func(*fdpass.Conn) error, log *slog.Logger) (*slotSockets, error) {
	s := &slotSockets{ls: make([]*fdpass.Listener, n), armed: make([]atomic.Pointer[waiter], n), check: check, max: maxFDs, log: log}
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

// arm claims slot k's socket for one share until deadline.
func (s *slotSockets) arm(k int, deadline time.Time) *waiter {
	w := &waiter{deadline: deadline, ch: make(chan received, 1)}
	s.armed[k].Store(w)
	return w
}

// disarm ends w's claim. If a connection had already claimed it, its
// outcome is returned (ok true); the caller owns (and must close) its
// message. Otherwise no connection will claim w any more.
func (s *slotSockets) disarm(k int, w *waiter) (r received, ok bool) {
	s.armed[k].CompareAndSwap(w, nil)
	if w.taken.CompareAndSwap(false, true) {
		return received{}, false
	}
	return <-w.ch, true // Receive is bounded by w.deadline
}

// wait returns the outcome of w's connection, or an accept timeout at
// w.deadline. After it returns, w is disarmed.
func (s *slotSockets) wait(k int, w *waiter) received {
	t := time.NewTimer(time.Until(w.deadline))
	defer t.Stop()
	select {
	case r := <-w.ch:
		s.armed[k].CompareAndSwap(w, nil)
		return r
	case <-t.C:
	}
	if r, ok := s.disarm(k, w); ok {
		return r
	}
	return received{err: fmt.Errorf("the decoder did not send the share message: %w", fdpass.ErrAcceptTimeout)}
}

// serve accepts on slot k's socket until the listener closes.
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
		w.ch <- s.receive(conn, w.deadline)
	}
}

// receive checks the peer and reads the share message; the connection is
// closed when it returns, and on error no fd is left open.
func (s *slotSockets) receive(conn *fdpass.Conn, deadline time.Time) received {
	defer conn.Close()
	if s.check != nil {
		if err := s.check(conn); err != nil {
			return received{err: err}
		}
	}
	msg, err := conn.Receive(deadline, s.max)
	if err != nil {
		return received{err: err}
	}
	return received{msg: msg}
}

// close stops the accept loops and removes the sockets.
func (s *slotSockets) close() {
	for _, l := range s.ls {
		l.Close()
	}
	s.wg.Wait()
}
