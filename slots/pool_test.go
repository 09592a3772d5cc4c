package slots

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/obtest"
)

func TestAcquireRelease(t *testing.T) {
	p := New(2, 1)
	a, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Acquire(context.Background())
	if err != nil || a == b {
		t.Fatalf("second acquire: %d %d %v", a, b, err)
	}
	got := make(chan int)
	go func() {
		s, err := p.Acquire(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	obtest.WaitFor(t, 5*time.Second, "a waiter", func() bool { return p.Stats().Waiting == 1 })
	if _, err := p.Acquire(context.Background()); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("queue full: got %v", err)
	}
	p.Release(a)
	if s := <-got; s != a {
		t.Fatalf("waiter got %d, want %d", s, a)
	}
}

func TestAcquireCancelled(t *testing.T) {
	p := New(1, 4)
	s, _ := p.Acquire(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { _, err := p.Acquire(ctx); errc <- err }()
	obtest.WaitFor(t, 5*time.Second, "a waiter", func() bool { return p.Stats().Waiting == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	p.Release(s)
	if st := p.Stats(); st.Free != 1 || st.Waiting != 0 {
		t.Fatalf("stats after cancel: %+v", st)
	}
}

// TestNoSlotLost hammers the pool; at the end every slot is free exactly once.
func TestNoSlotLost(t *testing.T) {
	p := New(4, 1000)
	var wg sync.WaitGroup
	var mu sync.Mutex
	held := map[int]bool{}
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			if i%7 == 0 {
				cancel()
			}
			defer cancel()
			s, err := p.Acquire(ctx)
			if err != nil {
				return
			}
			mu.Lock()
			if held[s] {
				t.Errorf("slot %d handed out twice", s)
			}
			held[s] = true
			mu.Unlock()
			mu.Lock()
			held[s] = false
			mu.Unlock()
			p.Release(s)
		}()
	}
	wg.Wait()
	if st := p.Stats(); st.Free != 4 || st.Waiting != 0 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestClose: a closed pool refuses every new Acquire with ErrClosed, even
// with a slot free (the front answers it 503), and still serves the
// requests already waiting when a held slot is released: a draining daemon
// answers what it accepted.
func TestClose(t *testing.T) {
	p := New(2, 4)
	a, _ := p.Acquire(context.Background())
	b, _ := p.Acquire(context.Background())
	got := make(chan int)
	go func() {
		s, err := p.Acquire(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	obtest.WaitFor(t, 5*time.Second, "a waiter", func() bool { return p.Stats().Waiting == 1 })
	p.Close()
	if _, err := p.Acquire(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("acquire on a closed pool: %v", err)
	}
	p.Release(a)
	if s := <-got; s != a {
		t.Fatalf("the waiter got %d, want %d", s, a)
	}
	p.Release(b)
	if _, err := p.Acquire(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("acquire on a closed pool with a free slot: %v", err)
	}
	p.Release(a)
	if st := p.Stats(); st.Free != 2 || st.Waiting != 0 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestAcquireBest: the free slot with the highest score wins; ties go to
// the least recently released; a waiter is still served FIFO.
func TestAcquireBest(t *testing.T) {
	p := New(3, 1)
	ctx := context.Background()
	score := map[int]int{0: 0, 1: 5, 2: 5}
	for range 3 {
		p.Acquire(ctx)
	}
	for _, s := range []int{2, 1, 0} { // released 2 first: least recently used
		p.Release(s)
	}
	s, err := p.AcquireBest(ctx, func(k int) int { return score[k] })
	if err != nil || s != 2 {
		t.Fatalf("got slot %d (%v), want 2: best score, released before 1", s, err)
	}
	s, _ = p.AcquireBest(ctx, func(k int) int { return score[k] })
	if s != 1 {
		t.Fatalf("got slot %d, want 1", s)
	}
	s, _ = p.AcquireBest(ctx, func(int) int { return 0 })
	if s != 0 {
		t.Fatalf("got slot %d, want 0", s)
	}
	got := make(chan int)
	go func() {
		s, err := p.AcquireBest(ctx, func(int) int { return 0 })
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	obtest.WaitFor(t, 5*time.Second, "a waiter", func() bool { return p.Stats().Waiting == 1 })
	p.Release(1)
	if s := <-got; s != 1 {
		t.Fatalf("waiter got %d", s)
	}
	p.Close()
	if _, err := p.AcquireBest(ctx, func(int) int { return 0 }); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
}
