package handoff

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/obtest"
)

// shareMsg is a valid one-region share message over one memfd.
func shareMsg(t *testing.T) ([]byte, []int) {
	t.Helper()
	h := fdpass.Header{Version: fdpass.HeaderVersion, LayoutHash: "0123456789abcdef", NCtx: 256, NLayer: 1,
		KVTypeK: "f16", KVTypeV: "f16", NBatch: 2048, NUbatch: 512,
		Regions: []fdpass.Region{{FDIndex: 0, Offset: 0, Size: 4096, Kind: "k", Layer: 0, CellStride: 16}}}
	raw, err := fdpass.Encode(&h)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.MemfdCreate("slotsock-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, 4096); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return raw, []int{fd}
}

func send(t *testing.T, path string, raw []byte, fds []int) {
	t.Helper()
	c, err := fdpass.Dial(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := fdpass.Send(c, raw, fds); err != nil {
		t.Fatal(err)
	}
}

// TestSlotSockets: one socket per slot, kept across shares; a connection is
// taken only while that slot's share is armed; others are closed at once;
// a wait that ends (deadline, ctx) disarms; close stops everything and
// removes the sockets.
func TestSlotSockets(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "slots")
	s, err := openSlotSockets(dir, 2, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	raw, fds := shareMsg(t)
	baseFDs := openFDs(t)
	ctx := context.Background()

	t.Run("armed share receives", func(t *testing.T) {
		for range 3 { // the same socket serves share after share
			w := s.arm(1)
			send(t, s.path(1), raw, fds)
			c, err := s.wait(ctx, 1, w, time.Now().Add(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			msg, err := c.Receive(time.Now().Add(5*time.Second), 8)
			c.Close()
			if err != nil || len(msg.Files) != 1 {
				t.Fatalf("received %+v %v", msg, err)
			}
			msg.Close()
		}
		if filepath.Base(s.path(1)) != "kvshare-1.sock" {
			t.Fatalf("path %s", s.path(1))
		}
	})
	t.Run("unarmed connection closed at once", func(t *testing.T) {
		before := s.refused.Load()
		c, err := fdpass.Dial(s.path(0), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		buf := make([]byte, 1)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(buf); !errors.Is(err, io.EOF) {
			t.Fatalf("read on an unarmed slot's socket: %v, want EOF (closed at once)", err)
		}
		if s.refused.Load() != before+1 {
			t.Fatal("not counted as refused")
		}
	})
	t.Run("a second connection during one share is refused", func(t *testing.T) {
		w := s.arm(0)
		first, err := fdpass.Dial(s.path(0), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer first.Close()
		before := s.refused.Load()
		second, err := fdpass.Dial(s.path(0), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer second.Close()
		obtest.WaitFor(t, 5*time.Second, "the second connection refused", func() bool { return s.refused.Load() == before+1 })
		c, err := s.wait(ctx, 0, w, time.Now().Add(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	})
	t.Run("accept timeout disarms", func(t *testing.T) {
		w := s.arm(0)
		if _, err := s.wait(ctx, 0, w, time.Now().Add(50*time.Millisecond)); !errors.Is(err, fdpass.ErrAcceptTimeout) {
			t.Fatalf("got %v", err)
		}
		before := s.refused.Load()
		c, err := fdpass.Dial(s.path(0), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		obtest.WaitFor(t, 5*time.Second, "the late connection refused", func() bool { return s.refused.Load() == before+1 })
	})
	t.Run("ctx ends the wait", func(t *testing.T) {
		w := s.arm(1)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.wait(cctx, 1, w, time.Now().Add(5*time.Second)); !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a connection that claimed the share as the wait ended is closed", func(t *testing.T) {
		w := s.arm(1)
		c, err := fdpass.Dial(s.path(1), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		obtest.WaitFor(t, 5*time.Second, "the connection to claim the share", func() bool { return w.taken.Load() })
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		// The claim races the cancellation in wait's select: either way
		// nothing stays open.
		if got, err := s.wait(cctx, 1, w, time.Now().Add(5*time.Second)); err == nil {
			got.Close()
		}
	})
	obtest.WaitFor(t, 5*time.Second, "fds back to the baseline", func() bool { return openFDs(t) == baseFDs })
	s.close()
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("sockets left after close: %v", left)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestSealedMemfd(t *testing.T) {
	f, err := sealedMemfd("tokens", []byte("[1,2,3]"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := os.ReadFile(ProcFDPath(int(f.Fd())))
	if err != nil || string(b) != "[1,2,3]" {
		t.Fatalf("read back %q %v", b, err)
	}
	if _, err := f.Write([]byte("x")); err == nil {
		t.Fatal("a sealed memfd took a write")
	}
}

// TestListenRefusesInsecureDir: the share sockets are opened at startup, so
// a slot dir others can write is an error there, not a fallback per request.
func TestListenRefusesInsecureDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "slots")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	h := NewHandoff(Config{SlotDir: dir, Share: true, Slots: 2}, nil, nil, nil)
	defer h.Close()
	if err := h.Listen(); !errors.Is(err, fdpass.ErrInsecureDir) {
		t.Fatalf("Listen on a 0777 slot dir: %v", err)
	}
}
