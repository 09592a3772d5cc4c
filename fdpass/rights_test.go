package fdpass

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cmsg builds one control message by hand: a header claiming hdrLen bytes
// (0: the honest length) with level, type and data, padded to alignment.
func cmsg(level, typ int32, data []byte, hdrLen int) []byte {
	var h unix.Cmsghdr
	h.Level, h.Type = level, typ
	if hdrLen == 0 {
		hdrLen = unix.CmsgLen(len(data))
	}
	h.SetLen(hdrLen)
	b := make([]byte, unix.CmsgSpace(len(data)))
	copy(b, unsafe.Slice((*byte)(unsafe.Pointer(&h)), unix.SizeofCmsghdr))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

// rightsData is the SCM_RIGHTS payload carrying fds.
func rightsData(fds ...int) []byte {
	var b []byte
	for _, fd := range fds {
		b = binary.NativeEndian.AppendUint32(b, uint32(int32(fd)))
	}
	return b
}

// TestCollectRightsClosesOnParseError: a control buffer the parser cannot
// read whole still gives back every fd it carries, so Receive's error path
// closes them (issue 9: the fds of a message whose parse failed leaked).
// The buffers are crafted (the kernel writes well-formed ones); the fds in
// them are real dups, as the kernel would have installed.
func TestCollectRightsClosesOnParseError(t *testing.T) {
	cases := []struct {
		name  string
		build func(fds []int) []byte
		nfds  int
	}{
		{"rights then a header shorter than itself", func(fds []int) []byte {
			return append(cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, rightsData(fds...), 0),
				cmsg(unix.SOL_SOCKET, unix.SCM_CREDENTIALS, nil, 3)...)
		}, 2},
		{"rights then a header longer than the buffer", func(fds []int) []byte {
			return append(cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, rightsData(fds...), 0),
				cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, rightsData(7), 4096)...)
		}, 3},
		{"rights whose length is not a multiple of an fd", func(fds []int) []byte {
			return cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, append(rightsData(fds...), 0, 0), 0)
		}, 1},
		{"two rights messages, the second odd", func(fds []int) []byte {
			return append(cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, rightsData(fds[0]), 0),
				cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, append(rightsData(fds[1:]...), 9), 0)...)
		}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := memfds(t, 1)
			base := fdCount(t)
			fds := make([]int, tc.nfds)
			for i := range fds {
				fd, err := unix.Dup(src[0])
				if err != nil {
					t.Fatal(err)
				}
				fds[i] = fd
			}
			var got []int
			n, err := collectRights(tc.build(fds), &got)
			closeFDs(got) // what Receive's error path does
			if err == nil {
				t.Fatalf("collectRights accepted a malformed control buffer (%d fds)", n)
			}
			if n != len(got) || n != tc.nfds {
				t.Errorf("collectRights returned %d and appended %d fds, want %d", n, len(got), tc.nfds)
			}
			if c := fdCount(t); c != base {
				closeFDs(fds)
				t.Fatalf("fd count %d after the error path, want %d: the control message's fds leaked", c, base)
			}
		})
	}
}

// TestCollectRightsWellFormed: several SCM_RIGHTS messages and another
// kind in one buffer give every fd in order.
func TestCollectRightsWellFormed(t *testing.T) {
	oob := append(cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, rightsData(10, 11), 0),
		cmsg(unix.SOL_SOCKET, unix.SCM_CREDENTIALS, make([]byte, 12), 0)...)
	oob = append(oob, cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, rightsData(12), 0)...)
	got, err := rightsOf(oob, nil)
	if err != nil || len(got) != 3 || got[0] != 10 || got[1] != 11 || got[2] != 12 {
		t.Fatalf("rightsOf = %v, %v; want [10 11 12]", got, err)
	}
	if got, err := rightsOf(nil, nil); err != nil || len(got) != 0 {
		t.Fatalf("rightsOf(nil) = %v, %v", got, err)
	}
}

// FuzzRightsOf: any control buffer parses without panicking and never
// yields more fds than it has room for; on a buffer x/sys parses whole (every
// header sound, every SCM_RIGHTS payload a whole number of fds) rightsOf
// agrees with it and reports no error.
func FuzzRightsOf(f *testing.F) {
	f.Add(cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, rightsData(3, 4), 0))
	f.Add(append(cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, rightsData(3), 0), cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, nil, 3)...))
	f.Add(cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, []byte{1, 2, 3, 4, 5, 6}, 0))
	f.Add(append(cmsg(unix.SOL_SOCKET, unix.SCM_CREDENTIALS, make([]byte, 12), 0), cmsg(unix.SOL_SOCKET, unix.SCM_RIGHTS, rightsData(5), 0)...))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, oob []byte) {
		got, err := rightsOf(oob, nil)
		if len(got) > len(oob)/4 {
			t.Fatalf("%d fds from %d bytes", len(got), len(oob))
		}
		if err != nil && !errors.Is(err, ErrControl) {
			t.Fatalf("error %v does not wrap ErrControl", err)
		}
		msgs, perr := unix.ParseSocketControlMessage(oob)
		if perr != nil {
			if err == nil {
				t.Fatalf("x/sys refuses the buffer (%v), rightsOf accepts it", perr)
			}
			return
		}
		var want []int
		for i := range msgs {
			if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
				continue
			}
			if len(msgs[i].Data)%4 != 0 { // x/sys's ParseUnixRights would panic
				if err == nil {
					t.Fatalf("a ragged SCM_RIGHTS payload was accepted")
				}
				return
			}
			fds, _ := unix.ParseUnixRights(&msgs[i])
			want = append(want, fds...)
		}
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("rightsOf = %v, %v; x/sys reads %v", got, err, want)
		}
	})
}
