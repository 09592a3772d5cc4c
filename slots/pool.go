// Package slots is the decoder's slot pool: one request per slot at a time
// (llama-server's -np N), with a bounded wait queue in front.
package slots

import (
	"context"
	"errors"
	"sync"
)

// Errors of this package.
var (
	// ErrQueueFull: every slot is busy and the wait queue is full.
	ErrQueueFull = errors.New("slots: every slot is busy and the wait queue is full")
	// ErrClosed: the pool is shutting down.
	ErrClosed = errors.New("slots: the pool is closed")
)

// Pool hands out slot ids 0..n-1. Waiters are served in FIFO order. A freed
// slot is handed to the longest waiter directly, so no waiter starves.
type Pool struct {
	mu       sync.Mutex
	free     []int // stack: the most recently freed slot is reused first (its cache is warm)
	waiters  []chan int
	maxQueue int
	n        int
	closed   bool
}

// New returns a pool of n slots with at most maxQueue waiters.
func New(n, maxQueue int) *Pool {
	p := &Pool{n: n, maxQueue: maxQueue}
	for i := n - 1; i >= 0; i-- {
		p.free = append(p.free, i)
	}
	return p
}

// Size is the number of slots.
func (p *Pool) Size() int { return p.n }

// Acquire takes a slot, waiting while every slot is busy. It fails at once
// with ErrClosed after Close, with ErrQueueFull when maxQueue requests
// already wait, and with ctx's error when ctx ends first (the caller's
// client went away).
func (p *Pool) Acquire(ctx context.Context) (int, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return -1, ErrClosed
	}
	if k := len(p.free); k > 0 {
		s := p.free[k-1]
		p.free = p.free[:k-1]
		p.mu.Unlock()
		return s, nil
	}
	return p.wait(ctx)
}

// AcquireBest is Acquire choosing among the free slots the one with the
// highest score (the prefix of the prompt it holds, package planner); ties
// go to the least recently used slot, so that a slot holding a recent
// conversation is the last to be reused for another. A waiter is served
// FIFO with whichever slot is released first (it gets score 0 there at
// worst: a full handoff, never a wrong one). score runs under the pool's
// lock: it must be quick and must not call the pool.
func (p *Pool) AcquireBest(ctx context.Context, score func(slot int) int) (int, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return -1, ErrClosed
	}
	if len(p.free) > 0 {
		best, bestScore := 0, -1
		for i, s := range p.free { // free[0] is the least recently released
			if sc := score(s); sc > bestScore {
				best, bestScore = i, sc
			}
		}
		s := p.free[best]
		p.free = append(p.free[:best], p.free[best+1:]...)
		p.mu.Unlock()
		return s, nil
	}
	return p.wait(ctx)
}

// wait queues for a slot; p.mu is held on entry and released.
func (p *Pool) wait(ctx context.Context) (int, error) {
	if len(p.waiters) >= p.maxQueue {
		p.mu.Unlock()
		return -1, ErrQueueFull
	}
	ch := make(chan int, 1)
	p.waiters = append(p.waiters, ch)
	p.mu.Unlock()

	select {
	case s := <-ch:
		return s, nil
	case <-ctx.Done():
		p.mu.Lock()
		for i, w := range p.waiters {
			if w == ch {
				p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
				p.mu.Unlock()
				return -1, ctx.Err()
			}
		}
		p.mu.Unlock()
		// Release handed us a slot while ctx ended: give it back.
		p.Release(<-ch)
		return -1, ctx.Err()
	}
}

// Release returns slot s.
func (p *Pool) Release(s int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.waiters) > 0 {
		w := p.waiters[0]
		p.waiters = p.waiters[1:]
		w <- s
		return
	}
	p.free = append(p.free, s)
}

// Stats is a snapshot of the pool.
type Stats struct {
	Slots, Free, Waiting int
}

// Stats returns a snapshot.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Slots: p.n, Free: len(p.free), Waiting: len(p.waiters)}
}

// Close makes every later Acquire fail with ErrClosed (the front answers
// 503 unavailable_error), even while a slot is free. Requests already
// waiting keep their place and are served as held slots are released: a
// draining daemon answers what it accepted. Held slots may still be
// released.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
}
