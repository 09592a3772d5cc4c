package fdpass

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// frame is a length prefix plus body.
func frame(body []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(body)))
	return append(b, body...)
}

func prefixOnly(n uint32) []byte { return binary.LittleEndian.AppendUint32(nil, n) }

// rawSend writes data with fds in one sendmsg, all of it.
func rawSend(s *net.UnixConn, data []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, _, err := s.WriteMsgUnix(data, oob, nil)
	if err != nil {
		return err
	}
	if n < len(data) {
		_, err = s.Write(data[n:])
	}
	return err
}

// waitDrained waits until the receiver has read everything queued on c, so a
// following write is a separate segment for the reader.
func waitDrained(c *Conn) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var (
			n    int
			ierr error
		)
		if err := c.rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
			return err
		}
		if ierr != nil {
			return ierr
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("receiver did not drain %d bytes", n)
		}
		time.Sleep(time.Millisecond)
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestReceive(t *testing.T) {
	good3 := testHeader(3, 6)
	packed := testHeader(3, 56)
	oneFD := testHeader(1, 2)
	badVersion := testHeader(1, 2)
	badVersion.Version = 2
	outOfRange := testHeader(1, 2)
	outOfRange.Regions[1].FDIndex = 1
	unreferenced := testHeader(1, 2) // sent with 2 fds
	pastEOF := testHeader(1, 2)
	pastEOF.Regions[1].Offset = 1 << 20 // memfds are 1 MiB

	type sendFn func(s *net.UnixConn, r *Conn, fds []int) error
	one := func(data []byte, nfds int) sendFn {
		return func(s *net.UnixConn, _ *Conn, fds []int) error { return rawSend(s, data, fds[:nfds]) }
	}
	tests := []struct {
		name    string
		nfds    int // memfds created for the sender
		maxFDs  int
		timeout time.Duration // receive deadline; 0: 10s
		send    sendFn
		closeTx bool // close the sending end after send
		want    error
		wantHdr *Header
	}{
		{name: "good", nfds: 3, maxFDs: 8, send: one(frame(mustJSON(t, good3)), 3), wantHdr: &good3},
		{name: "56 regions in 3 fds", nfds: 3, maxFDs: 3, send: one(frame(mustJSON(t, packed)), 3), wantHdr: &packed},
		{name: "two SCM_RIGHTS messages", nfds: 3, maxFDs: 3, wantHdr: &good3,
			send: func(s *net.UnixConn, _ *Conn, fds []int) error {
				oob := append(unix.UnixRights(fds[0]), unix.UnixRights(fds[1:]...)...)
				_, _, err := s.WriteMsgUnix(frame(mustJSON(t, good3)), oob, nil)
				return err
			}},
		{name: "split after the length", nfds: 1, maxFDs: 1, wantHdr: &oneFD,
			send: func(s *net.UnixConn, r *Conn, fds []int) error {
				b := frame(mustJSON(t, oneFD))
				if err := rawSend(s, b[:4], fds); err != nil {
					return err
				}
				if err := waitDrained(r); err != nil {
					return err
				}
				return rawSend(s, b[4:], nil)
			}},
		{name: "split inside the length and the header", nfds: 1, maxFDs: 1, wantHdr: &oneFD,
			send: func(s *net.UnixConn, r *Conn, fds []int) error {
				b := frame(mustJSON(t, oneFD))
				for i, cut := range [][2]int{{0, 2}, {2, 10}, {10, len(b)}} {
					var f []int
					if i == 0 {
						f = fds
					}
					if err := rawSend(s, b[cut[0]:cut[1]], f); err != nil {
						return err
					}
					if i < 2 {
						if err := waitDrained(r); err != nil {
							return err
						}
					}
				}
				return nil
			}},
		{name: "fds on a later segment", nfds: 2, maxFDs: 4, want: ErrStrayFDs,
			send: func(s *net.UnixConn, r *Conn, fds []int) error {
				b := frame(mustJSON(t, testHeader(2, 2)))
				if err := rawSend(s, b[:4], fds[:1]); err != nil {
					return err
				}
				if err := waitDrained(r); err != nil {
					return err
				}
				return rawSend(s, b[4:], fds[1:])
			}},
		{name: "0 fds", nfds: 0, maxFDs: 4, send: one(frame(mustJSON(t, oneFD)), 0), want: ErrRegion},
		{name: "header too large", nfds: 2, maxFDs: 4, send: one(prefixOnly(MaxHeaderLen+1), 2), want: ErrHeaderTooLarge},
		{name: "length 4 GiB-1", nfds: 1, maxFDs: 4, send: one(prefixOnly(1<<32-1), 1), want: ErrHeaderTooLarge},
		{name: "length 0", nfds: 1, maxFDs: 4, send: one(prefixOnly(0), 1), want: ErrBadHeader},
		{name: "bad JSON", nfds: 1, maxFDs: 4, send: one(frame([]byte(`{"version": 1, "regions": [`)), 1), want: ErrBadHeader},
		{name: "JSON not an object", nfds: 1, maxFDs: 4, send: one(frame([]byte(`[1,2]`)), 1), want: ErrBadHeader},
		{name: "trailing JSON", nfds: 1, maxFDs: 4, send: one(frame(append(mustJSON(t, oneFD), []byte(` {}`)...)), 1), want: ErrBadHeader},
		{name: "unknown field", nfds: 1, maxFDs: 4, want: ErrBadHeader,
			send: one(frame(bytes.Replace(mustJSON(t, oneFD), []byte(`"fd_index"`), []byte(`"fd_idx"`), 1)), 1)},
		{name: "bad version", nfds: 1, maxFDs: 4, send: one(frame(mustJSON(t, badVersion)), 1), want: ErrVersion},
		{name: "fd_index out of range", nfds: 1, maxFDs: 4, send: one(frame(mustJSON(t, outOfRange)), 1), want: ErrRegion},
		{name: "unreferenced fd", nfds: 2, maxFDs: 4, send: one(frame(mustJSON(t, unreferenced)), 2), want: ErrRegion},
		{name: "region past the memfd's end", nfds: 1, maxFDs: 4, send: one(frame(mustJSON(t, pastEOF)), 1), want: ErrRegion},
		{name: "EOF before anything", nfds: 0, maxFDs: 4, send: one(nil, 0), closeTx: true, want: ErrShortMessage},
		{name: "EOF inside the length", nfds: 1, maxFDs: 4, send: one([]byte{9, 0}, 1), closeTx: true, want: ErrShortMessage},
		{name: "EOF mid-header", nfds: 1, maxFDs: 4, send: one(frame(mustJSON(t, oneFD))[:40], 1), closeTx: true, want: ErrShortMessage},
		{name: "receive timeout", nfds: 1, maxFDs: 4, timeout: 50 * time.Millisecond,
			send: one(frame(mustJSON(t, oneFD))[:40], 1), want: ErrReceiveTimeout},
		{name: "more fds than maxFDs", nfds: 3, maxFDs: 2, send: one(frame(mustJSON(t, good3)), 3), want: ErrCtrunc},
		{name: "4 fds, maxFDs 3 (odd: CmsgSpace padding)", nfds: 4, maxFDs: 3, send: one(frame(mustJSON(t, testHeader(4, 4))), 4), want: ErrCtrunc},
		{name: "2 fds, maxFDs 1", nfds: 2, maxFDs: 1, send: one(frame(mustJSON(t, testHeader(2, 2))), 2), want: ErrCtrunc},
		{name: "fds with maxFDs 0", nfds: 1, maxFDs: 0, send: one(frame(mustJSON(t, oneFD)), 1), want: ErrCtrunc},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fds := memfds(t, tc.nfds)
			r, s := socketPair(t)
			base := fdCount(t)

			sent := make(chan error, 1)
			go func() {
				err := tc.send(s, r, fds)
				if tc.closeTx {
					if cerr := s.CloseWrite(); err == nil {
						err = cerr
					}
				}
				sent <- err
			}()
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 10 * time.Second
			}
			msg, err := r.Receive(time.Now().Add(timeout), tc.maxFDs)
			if serr := <-sent; serr != nil {
				t.Fatalf("send: %v", serr)
			}
			if tc.want != nil {
				if !errors.Is(err, tc.want) {
					t.Fatalf("Receive error = %v, want %v", err, tc.want)
				}
				if msg != nil {
					t.Fatalf("Receive returned a message with error %v", err)
				}
				if !strings.HasPrefix(err.Error(), "fdpass: ") {
					t.Errorf("error %q lacks the package prefix", err)
				}
				if got := fdCount(t); got != base {
					t.Fatalf("fd count after %v: %d, baseline %d", tc.want, got, base)
				}
				return
			}
			if err != nil {
				t.Fatalf("Receive: %v", err)
			}
			checkMessage(t, msg, tc.wantHdr, tc.nfds)
			if got := fdCount(t); got != base+tc.nfds {
				t.Fatalf("fd count with the message open: %d, want %d", got, base+tc.nfds)
			}
			if n := msg.Close(); n != tc.nfds {
				t.Fatalf("Message.Close closed %d, want %d", n, tc.nfds)
			}
			if n := msg.Close(); n != 0 {
				t.Fatalf("second Message.Close closed %d, want 0", n)
			}
			if got := fdCount(t); got != base {
				t.Fatalf("fd count after Close: %d, baseline %d", got, base)
			}
		})
	}
}

// checkMessage checks msg against the header that was sent and its files.
func checkMessage(t *testing.T, msg *Message, want *Header, nfds int) {
	t.Helper()
	if !bytes.Equal(msg.Raw, mustJSON(t, want)) {
		t.Errorf("Raw = %s, want the bytes sent", msg.Raw)
	}
	if got, want := mustJSON(t, msg.Header), mustJSON(t, want); !bytes.Equal(got, want) {
		t.Errorf("Header = %s, want %s", got, want)
	}
	if len(msg.Files) != nfds {
		t.Fatalf("%d files, want %d", len(msg.Files), nfds)
	}
	for i, f := range msg.Files {
		flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFD, 0)
		if err != nil {
			t.Fatal(err)
		}
		if flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("file %d lacks FD_CLOEXEC", i)
		}
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != 1<<20 {
			t.Errorf("file %d is %d bytes, want the sender's memfd (1 MiB)", i, fi.Size())
		}
	}
}

// TestReceiveFDOrder checks that Files[i] is the sender's fds[i].
func TestReceiveFDOrder(t *testing.T) {
	const n = 4
	fds := make([]int, n)
	for i := range fds {
		fd, err := unix.MemfdCreate("order", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		fds[i] = fd
		if err := unix.Ftruncate(fd, int64(i+1)<<20); err != nil {
			t.Fatal(err)
		}
	}
	defer closeFDs(fds)
	r, s := socketPair(t)
	h := testHeader(n, n)
	b, err := Encode(&h)
	if err != nil {
		t.Fatal(err)
	}
	if err := Send(s, b, fds); err != nil {
		t.Fatal(err)
	}
	msg, err := r.Receive(time.Now().Add(10*time.Second), n)
	if err != nil {
		t.Fatal(err)
	}
	defer msg.Close()
	for i, f := range msg.Files {
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != int64(i+1)<<20 {
			t.Errorf("Files[%d] is %d bytes, want %d", i, fi.Size(), int64(i+1)<<20)
		}
	}
}

// TestReceiveLargeHeader sends a header near MaxHeaderLen, more than one
// socket buffer segment on small buffers.
func TestReceiveLargeHeader(t *testing.T) {
	r, s := socketPair(t)
	if err := s.SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}
	fds := memfds(t, 1)
	h := testHeader(1, 256)
	for i := range h.Regions {
		h.Regions[i].Layer = 0
	}
	h.NLayer = 0
	b := mustJSON(t, h)
	pad := MaxHeaderLen - len(b)
	b = append(b[:len(b)-1], []byte(`,"kv_type_k":"`+strings.Repeat("x", pad-16)+`"}`)...)
	// kv_type_k now appears twice; the last one wins in encoding/json.
	if len(b) > MaxHeaderLen || len(b) < MaxHeaderLen-32 {
		t.Fatalf("test header is %d bytes", len(b))
	}
	sent := make(chan error, 1)
	go func() { sent <- Send(s, b, fds) }()
	msg, err := r.Receive(time.Now().Add(10*time.Second), 1)
	if serr := <-sent; serr != nil {
		t.Fatal(serr)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer msg.Close()
	if !bytes.Equal(msg.Raw, b) {
		t.Fatal("Raw differs from the header sent")
	}
}

func TestSendRefuses(t *testing.T) {
	_, s := socketPair(t)
	tests := []struct {
		name   string
		header []byte
		fds    []int
		want   error
	}{
		{"empty header", nil, nil, ErrBadHeader},
		{"header too large", make([]byte, MaxHeaderLen+1), nil, ErrHeaderTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := Send(s, tc.header, tc.fds); !errors.Is(err, tc.want) {
				t.Fatalf("Send = %v, want %v", err, tc.want)
			}
		})
	}
	if err := Send(s, []byte("{}"), make([]int, MaxFDs+1)); err == nil {
		t.Fatal("Send with too many fds succeeded")
	}
}

// TestReceivePipeFD passes a non-memfd (a pipe): its size is not checked.
func TestReceivePipeFD(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	r, s := socketPair(t)
	h := testHeader(1, 2)
	if err := Send(s, mustJSON(t, h), []int{int(pr.Fd())}); err != nil {
		t.Fatal(err)
	}
	msg, err := r.Receive(time.Now().Add(10*time.Second), 1)
	if err != nil {
		t.Fatal(err)
	}
	if n := msg.Close(); n != 1 {
		t.Fatalf("Close = %d", n)
	}
}
