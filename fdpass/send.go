package fdpass

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// Dial connects to a share socket (the decoder side).
func Dial(path string, timeout time.Duration) (*net.UnixConn, error) {
	c, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		return nil, fmt.Errorf("fdpass: dial %s: %w", path, err)
	}
	return c.(*net.UnixConn), nil
}

// Encode returns the header JSON (no validation: the sender knows its fds,
// Receive validates).
func Encode(h *Header) ([]byte, error) {
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("fdpass: encode header: %w", err)
	}
	return b, nil
}

// Send writes one share message: the uint32 little-endian length of header,
// header, and fds in one SCM_RIGHTS control message on the first segment
// (one sendmsg; if the socket takes only part of the bytes, the rest follows
// without fds). The caller keeps its fds (the kernel passes duplicates) and
// closes them when it likes. header must be 1..MaxHeaderLen bytes and fds at
// most MaxFDs.
func Send(conn *net.UnixConn, header []byte, fds []int) error {
	if len(header) > MaxHeaderLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrHeaderTooLarge, len(header), MaxHeaderLen)
	}
	if err := checkLength(uint32(len(header))); err != nil {
		return err
	}
	if len(fds) > MaxFDs {
		return fmt.Errorf("fdpass: send: %d fds, at most %d fit one message", len(fds), MaxFDs)
	}
	buf := make([]byte, prefixLen+len(header))
	binary.LittleEndian.PutUint32(buf, uint32(len(header)))
	copy(buf[prefixLen:], header)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, _, err := conn.WriteMsgUnix(buf, oob, nil)
	if err != nil {
		return fmt.Errorf("fdpass: send %d bytes and %d fds: %w", len(buf), len(fds), err)
	}
	if n < len(buf) {
		if _, err := conn.Write(buf[n:]); err != nil {
			return fmt.Errorf("fdpass: send the last %d of %d bytes: %w", len(buf)-n, len(buf), err)
		}
	}
	return nil
}
