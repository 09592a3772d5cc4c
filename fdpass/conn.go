package fdpass

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// MaxFDs is the most fds one message can carry (the kernel's SCM_MAX_FD).
// Receive clamps its maxFDs argument to it.
const MaxFDs = 253

// Conn is one accepted decoder connection. It carries one share message.
type Conn struct {
	uc *net.UnixConn
	rc syscall.RawConn
}

func newConn(uc *net.UnixConn) (*Conn, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("fdpass: raw connection: %w", err)
	}
	return &Conn{uc: uc, rc: rc}, nil
}

// Cred is the identity of the peer process, as the kernel recorded it when
// the peer connected.
type Cred struct{ PID, UID, GID int }

// PeerCred returns the peer's credentials (SO_PEERCRED).
func (c *Conn) PeerCred() (Cred, error) {
	var (
		uc   *unix.Ucred
		serr error
	)
	if err := c.rc.Control(func(fd uintptr) {
		uc, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("fdpass: peer credentials: %w", err)
	}
	if serr != nil {
		return Cred{}, fmt.Errorf("fdpass: peer credentials: %w", os.NewSyscallError("getsockopt SO_PEERCRED", serr))
	}
	return Cred{PID: int(uc.Pid), UID: int(uc.Uid), GID: int(uc.Gid)}, nil
}

// Close closes the connection. Files of a received Message stay open.
func (c *Conn) Close() error { return c.uc.Close() }

// Receive reads one share message (see doc.go): the length prefix, the
// header and the fds, which must come with the first segment. It accepts at
// most maxFDs fds (clamped to [0, MaxFDs]); more gives ErrCtrunc. A zero
// deadline means none; on the deadline it returns ErrReceiveTimeout. It reads
// exactly the message's bytes and nothing after them.
//
// On any error every fd that arrived is closed and the message is nil; on
// success the caller owns msg.Files (msg.Close). Receive is not safe for
// concurrent use on one Conn.
func (c *Conn) Receive(deadline time.Time, maxFDs int) (msg *Message, err error) {
	maxFDs = min(max(maxFDs, 0), MaxFDs)
	var fds []int
	defer func() {
		if err != nil {
			closeFDs(fds)
		}
	}()
	if err := c.uc.SetReadDeadline(deadline); err != nil {
		return nil, fmt.Errorf("fdpass: set read deadline: %w", err)
	}
	// CmsgLen, not CmsgSpace: the kernel installs as many fds as fit the
	// buffer, and when maxFDs is odd CmsgSpace's alignment padding has room
	// for one more (CmsgSpace(4*3) = 32 bytes holds 4 fds), which would then
	// arrive without MSG_CTRUNC.
	r := reader{c: c, oob: make([]byte, unix.CmsgLen(4*maxFDs)), maxFDs: maxFDs, fds: &fds}

	var prefix [prefixLen]byte
	if err := r.full(prefix[:], "length"); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(prefix[:])
	if err := checkLength(n); err != nil {
		return nil, err
	}
	raw := make([]byte, n)
	if err := r.full(raw, "header"); err != nil {
		return nil, err
	}
	h, err := decodeHeader(raw, len(fds))
	if err != nil {
		return nil, err
	}
	if err := checkSizes(&h, fds); err != nil {
		return nil, err
	}
	msg = &Message{Header: h, Raw: raw, Files: make([]*os.File, len(fds))}
	for i, fd := range fds {
		msg.Files[i] = os.NewFile(uintptr(fd), fmt.Sprintf("share-fd-%d", i))
	}
	return msg, nil
}

// reader fills buffers from the socket with recvmsg, collecting fds into
// *fds as they arrive (so the caller can close them on any error).
type reader struct {
	c        *Conn
	oob      []byte
	maxFDs   int
	fds      *[]int
	segments int // recvmsg calls that returned data
}

// full reads exactly len(p) bytes; what names the part for error texts.
func (r *reader) full(p []byte, what string) error {
	for got := 0; got < len(p); {
		n, err := r.recv(p[got:])
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%w: got %d of %d %s bytes", ErrShortMessage, got, len(p), what)
		}
		got += n
	}
	return nil
}

// recv does one recvmsg, retrying on EINTR and waiting in the runtime poller
// (which honours the read deadline) on EAGAIN. It returns 0 at EOF.
func (r *reader) recv(p []byte) (int, error) {
	var (
		n, oobn, flags int
		serr           error
	)
	err := r.c.rc.Read(func(fd uintptr) bool {
		for {
			n, oobn, flags, _, serr = unix.Recvmsg(int(fd), p, r.oob, unix.MSG_CMSG_CLOEXEC)
			if serr != unix.EINTR {
				return serr != unix.EAGAIN
			}
		}
	})
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, fmt.Errorf("%w (%d fds received so far)", ErrReceiveTimeout, len(*r.fds))
		}
		return 0, fmt.Errorf("fdpass: receive: %w", err)
	}
	if serr != nil {
		return 0, fmt.Errorf("fdpass: receive: %w", os.NewSyscallError("recvmsg", serr))
	}
	// Collect fds before looking at anything else: they are ours to close.
	got, perr := collectRights(r.oob[:oobn], r.fds)
	if n > 0 {
		r.segments++
	}
	switch {
	case perr != nil:
		return 0, perr
	case flags&unix.MSG_CTRUNC != 0:
		return 0, fmt.Errorf("%w: %d fds kept, the limit is %d", ErrCtrunc, len(*r.fds), r.maxFDs)
	case len(*r.fds) > r.maxFDs:
		// Not expected with a CmsgLen-sized buffer; kept as a guard.
		return 0, fmt.Errorf("%w: %d fds arrived, the limit is %d", ErrCtrunc, len(*r.fds), r.maxFDs)
	case flags&unix.MSG_TRUNC != 0:
		return 0, fmt.Errorf("%w (%d bytes read)", ErrTrunc, n)
	case got > 0 && r.segments > 1:
		return 0, fmt.Errorf("%w: %d fds arrived with segment %d", ErrStrayFDs, got, r.segments)
	}
	return n, nil
}

// collectRights appends the fds of every SCM_RIGHTS message in oob to *fds
// and returns how many it appended. Error or not, every fd it could read is
// appended: the kernel installed them, so they are the caller's to close.
func collectRights(oob []byte, fds *[]int) (int, error) {
	before := len(*fds)
	var err error
	*fds, err = rightsOf(oob, *fds)
	return len(*fds) - before, err
}

// rightsOf appends to fds every whole fd of every SCM_RIGHTS message in
// oob. It walks the messages itself rather than through
// unix.ParseSocketControlMessage, which drops every message when one header
// is malformed, and unix.ParseUnixRights, which panics on a payload that is
// not a whole number of fds: on a malformed buffer it keeps what it read
// (messages before the bad header, the whole fds of a ragged payload) and
// returns ErrControl.
func rightsOf(oob []byte, fds []int) ([]int, error) {
	var bad error
	for b := oob; len(b) >= unix.CmsgLen(0); {
		hdr, data, rest, err := unix.ParseOneSocketControlMessage(b)
		if err != nil {
			return fds, fmt.Errorf("%w: a header at byte %d claims %d bytes, %d remain", ErrControl, len(oob)-len(b), cmsgLen(b), len(b))
		}
		if hdr.Level == unix.SOL_SOCKET && hdr.Type == unix.SCM_RIGHTS {
			for i := 0; i+4 <= len(data); i += 4 {
				fds = append(fds, int(int32(binary.NativeEndian.Uint32(data[i:]))))
			}
			if len(data)%4 != 0 && bad == nil {
				bad = fmt.Errorf("%w: an SCM_RIGHTS payload of %d bytes is not a whole number of fds", ErrControl, len(data))
			}
		}
		b = rest
	}
	return fds, bad
}

// cmsgLen reads the length field of the control message header at b[0:]
// (len(b) >= unix.CmsgLen(0)), for error texts.
func cmsgLen(b []byte) uint64 {
	if unix.SizeofCmsghdr == 16 {
		return binary.NativeEndian.Uint64(b)
	}
	return uint64(binary.NativeEndian.Uint32(b))
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// checkSizes checks that regions of fds that are regular files (memfds)
// end within the file, so a provider's mmap cannot fault past EOF. Other fd
// types (device buffers) report no reliable size and are not checked.
func checkSizes(h *Header, fds []int) error {
	sizes := make([]int64, len(fds))
	for i, fd := range fds {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("fdpass: fd %d: %w", i, os.NewSyscallError("fstat", err))
		}
		sizes[i] = -1
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			sizes[i] = st.Size
		}
	}
	for i, r := range h.Regions {
		if size := sizes[r.FDIndex]; size >= 0 && r.Offset+r.Size > size {
			return fmt.Errorf("%w: region %d ends at byte %d, fd %d holds %d bytes", ErrRegion, i, r.Offset+r.Size, r.FDIndex, size)
		}
	}
	return nil
}
