package handoff

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
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

var errImpostor = errors.New("impostor")

// TestSlotSockets: one socket per slot, kept across shares; a connection is
// taken only while that slot's share is armed; others are closed at once;
// the peer check decides; close stops everything and removes the sockets.
func TestSlotSockets(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "slots")
	var reject atomic.Bool
	check := func(*fdpass.Conn) error {
		if reject.Load() {
			return errImpostor
		}
		return nil
	}
	s, err := openSlotSockets(dir, 2, 8, check, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	raw, fds := shareMsg(t)
	baseFDs := openFDs(t)

	t.Run("armed share receives", func(t *testing.T) {
		for range 3 { // the same socket serves share after share
			w := s.arm(1, time.Now().Add(5*time.Second))
			send(t, s.path(1), raw, fds)
			r := s.wait(1, w)
			if r.err != nil || r.msg == nil || len(r.msg.Files) != 1 {
				t.Fatalf("received %+v", r)
			}
			r.msg.Close()
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
	t.Run("accept timeout", func(t *testing.T) {
		w := s.arm(0, time.Now().Add(50*time.Millisecond))
		r := s.wait(0, w)
		if !errors.Is(r.err, fdpass.ErrAcceptTimeout) {
			t.Fatalf("got %+v", r)
		}
		// Disarmed: a late connection is refused, not delivered.
		before := s.refused.Load()
		c, err := fdpass.Dial(s.path(0), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		obtest.WaitFor(t, 5*time.Second, "the late connection refused", func() bool { return s.refused.Load() == before+1 })
	})
	t.Run("wrong peer", func(t *testing.T) {
		reject.Store(true)
		defer reject.Store(false)
		w := s.arm(0, time.Now().Add(5*time.Second))
		c, err := fdpass.Dial(s.path(0), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = fdpass.Send(c, raw, fds) // refused before or during the send
		if r := s.wait(0, w); !errors.Is(r.err, errImpostor) || r.msg != nil {
			t.Fatalf("got %+v", r)
		}
	})
	t.Run("disarm after a connection claimed the share", func(t *testing.T) {
		w := s.arm(1, time.Now().Add(5*time.Second))
		send(t, s.path(1), raw, fds)
		obtest.WaitFor(t, 5*time.Second, "the connection to claim the share", func() bool { return w.taken.Load() })
		r, ok := s.disarm(1, w)
		if !ok || r.msg == nil {
			t.Fatalf("disarm: %v %+v", ok, r)
		}
		r.msg.Close()
	})
	if n := openFDs(t); n != baseFDs {
		t.Fatalf("fds %d, want %d", n, baseFDs)
	}
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
