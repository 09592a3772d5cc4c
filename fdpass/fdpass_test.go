package fdpass

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary a sender child (see runHelper).
const helperEnv = "GO_WANT_HELPER_PROCESS"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(runHelper())
	}
	goleak.VerifyTestMain(m)
}

// runHelper is the child sender: it dials FDPASS_SOCKET and sends a valid
// message with FDPASS_NFDS memfds, then waits for the parent to close.
func runHelper() int {
	path := os.Getenv("FDPASS_SOCKET")
	var nfds int
	if _, err := fmt.Sscan(os.Getenv("FDPASS_NFDS"), &nfds); err != nil {
		fmt.Fprintln(os.Stderr, "helper: FDPASS_NFDS:", err)
		return 2
	}
	fds, err := makeMemfds(nfds, 1<<16)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	c, err := Dial(path, 10*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	defer c.Close()
	h := testHeader(max(nfds, 1), 2*max(nfds, 1))
	b, err := Encode(&h)
	if err == nil {
		err = Send(c, b, fds)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	// Wait for the parent to hang up so the peer is alive while it checks.
	var one [1]byte
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, _ = c.Read(one[:])
	return 0
}

// makeMemfds returns n memfds of size bytes each.
func makeMemfds(n int, size int64) ([]int, error) {
	fds := make([]int, 0, n)
	for i := range n {
		fd, err := unix.MemfdCreate(fmt.Sprintf("fdpass-test-%d", i), unix.MFD_CLOEXEC)
		if err == nil {
			err = unix.Ftruncate(fd, size)
			if err != nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			closeFDs(fds)
			return nil, fmt.Errorf("memfd %d: %w", i, err)
		}
		fds = append(fds, fd)
	}
	return fds, nil
}

func memfds(t testing.TB, n int) []int {
	t.Helper()
	fds, err := makeMemfds(n, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeFDs(fds) })
	return fds
}

// testHeader is a valid header with nregions regions spread round-robin over
// nfds fds, each region 4 KiB of 64-byte cells.
func testHeader(nfds, nregions int) Header {
	h := Header{
		Version: HeaderVersion, LayoutHash: "0123456789abcdef", NCtx: 512, NLayer: 28,
		KVTypeK: "f16", KVTypeV: "f16", FlashAttn: true, NBatch: 2048, NUbatch: 512,
	}
	next := make([]int64, nfds)
	for i := range nregions {
		fd := i % nfds
		kind := "k"
		if i%2 == 1 {
			kind = "v"
		}
		h.Regions = append(h.Regions, Region{
			FDIndex: fd, Offset: next[fd], Size: 4096, Kind: kind, Layer: (i / 2) % 28, CellStride: 64,
		})
		next[fd] += 4096
	}
	return h
}

// socketPair returns the two ends of a unix stream socketpair: a receiving
// Conn and a sending *net.UnixConn, both closed at cleanup.
func socketPair(t testing.TB) (*Conn, *net.UnixConn) {
	t.Helper()
	recv, send, err := newSocketPair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		recv.Close()
		send.Close()
	})
	return recv, send
}

func newSocketPair() (*Conn, *net.UnixConn, error) {
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, os.NewSyscallError("socketpair", err)
	}
	var ucs [2]*net.UnixConn
	for i, fd := range p {
		f := os.NewFile(uintptr(fd), fmt.Sprintf("socketpair-%d", i))
		c, err := net.FileConn(f) // dups fd
		f.Close()
		if err != nil {
			if i == 1 {
				ucs[0].Close()
			} else {
				unix.Close(p[1])
			}
			return nil, nil, err
		}
		ucs[i] = c.(*net.UnixConn)
	}
	rc, err := newConn(ucs[0])
	if err != nil {
		ucs[0].Close()
		ucs[1].Close()
		return nil, nil, err
	}
	return rc, ucs[1], nil
}

// fdCount is the number of open fds of this process.
func fdCount(t testing.TB) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}
