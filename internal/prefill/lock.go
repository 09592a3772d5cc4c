package prefill

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// slotLock is an exclusive flock on one slot of one prefill server, held by
// one onebit-prefill run from its completion to its save. onebitd runs one
// provider per request, concurrently: without the lock, two runs on the same
// prefill slot could interleave (A evaluates, B evaluates, A saves B's
// prompt). The lock files live in the state directory, are named after the
// server and the slot, and stay (empty) after the run.
type slotLock struct{ f *os.File }

// lockPath is the lock file of slot on server url in dir.
func lockPath(dir, url string, slot int) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(url))
	return filepath.Join(dir, fmt.Sprintf(".onebit-prefill-%08x-%d.lock", h.Sum32(), slot))
}

// lockSlot takes the first free slot of slots (tried in order), waiting
// until one is free or ctx ends. It returns the slot taken.
func lockSlot(ctx context.Context, dir, url string, slots []int) (int, *slotLock, error) {
	files := make([]*os.File, len(slots))
	defer func() {
		for _, f := range files {
			if f != nil {
				_ = f.Close()
			}
		}
	}()
	for i, s := range slots {
		f, err := os.OpenFile(lockPath(dir, url, s), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return 0, nil, fmt.Errorf("prefill: slot lock: %w", err)
		}
		files[i] = f
	}
	delay := time.Millisecond
	for {
		for i, f := range files {
			err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil {
				files[i] = nil // kept
				return slots[i], &slotLock{f: f}, nil
			}
			if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
				return 0, nil, fmt.Errorf("prefill: slot lock %s: %w", f.Name(), os.NewSyscallError("flock", err))
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, nil, fmt.Errorf("%w: no free prefill slot in time (other onebit-prefill runs hold them): %w", ErrServer, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// unlock releases the lock (closing the file drops the flock).
func (l *slotLock) unlock() { _ = l.f.Close() }
