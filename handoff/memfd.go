package handoff

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// sealedMemfd returns an anonymous memory file holding b, sealed against
// every change (DESIGN §2b: tokens and layout without files). A provider
// that inherits it opens it by path as /proc/self/fd/N; nothing touches the
// slot dir. The file is close-on-exec here: exec.Cmd.ExtraFiles dups it
// into the child without the flag.
func sealedMemfd(name string, b []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("onebit-"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, os.NewSyscallError("memfd_create", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:onebit-"+name)
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			f.Close()
			return nil, os.NewSyscallError("write memfd", err)
		}
		b = b[n:]
	}
	if _, err := unix.Seek(fd, 0, 0); err != nil { // for a child that reads the fd itself
		f.Close()
		return nil, os.NewSyscallError("lseek memfd", err)
	}
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal memfd %s: %w", name, os.NewSyscallError("fcntl", err))
	}
	return f, nil
}

// ProcFDPath is how a child names its inherited fd n.
func ProcFDPath(n int) string { return fmt.Sprintf("/proc/self/fd/%d", n) }
