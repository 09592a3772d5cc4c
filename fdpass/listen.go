package fdpass

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// maxPathLen is sizeof(sockaddr_un.sun_path) on Linux minus the NUL.
const maxPathLen = 107

// staleProbeTimeout bounds the connect that tells a stale socket from a live one.
const staleProbeTimeout = time.Second

// MaxPathLen is the longest socket path Listen accepts (107 bytes on Linux).
func MaxPathLen() int { return maxPathLen }

// Listener is a share socket: a SOCK_STREAM unix socket, mode 0600, in a
// directory only this user can write.
type Listener struct {
	ul   *net.UnixListener
	path string
	fi   fs.FileInfo // the socket file as created, to unlink only our own

	once     sync.Once
	closeErr error
	removed  atomic.Bool // Close unlinked the socket file
}

// Listen creates dir (MkdirAll, mode 0700; an existing directory keeps its
// mode but is refused with ErrInsecureDir when it is writable by group or
// others or owned by another user) and listens on dir/name+".sock" with mode
// 0600.
//
// A socket file left by a crashed run is replaced when nobody answers a
// connect on it; a live one gives ErrSocketInUse, anything that is not a
// socket ErrNotSocket. name must be a plain file name (ErrBadName) and not an
// abstract one (ErrAbstractName); a path longer than MaxPathLen gives
// ErrPathTooLong, checked before anything is created.
func Listen(dir, name string) (*Listener, error) {
	switch {
	case strings.HasPrefix(name, "@") || strings.ContainsRune(name, 0):
		return nil, fmt.Errorf("%w: %q", ErrAbstractName, name)
	case name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/'):
		return nil, fmt.Errorf("%w: %q", ErrBadName, name)
	case dir == "":
		return nil, fmt.Errorf("%w: empty directory", ErrBadName)
	case strings.ContainsRune(dir, 0):
		return nil, fmt.Errorf("%w: directory %q", ErrAbstractName, dir)
	}
	adir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("fdpass: socket directory %q: %w", dir, err)
	}
	path := filepath.Join(adir, name+".sock")
	if len(path) > maxPathLen {
		return nil, fmt.Errorf("%w: %s is %d bytes", ErrPathTooLong, path, len(path))
	}
	if err := secureDir(adir); err != nil {
		return nil, err
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("fdpass: listen on %s: %w", path, err)
	}
	// Close unlinks, but only the file we created (see Close).
	ul.SetUnlinkOnClose(false)
	l := &Listener{ul: ul, path: path}
	// bind created the file with 0777 &^ umask; the directory is private, so
	// nobody else can reach it before this chmod.
	if err := os.Chmod(path, 0o600); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("fdpass: chmod socket: %w", err)
	}
	if l.fi, err = os.Lstat(path); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("fdpass: stat socket: %w", err)
	}
	return l, nil
}

// secureDir creates dir 0700 or checks that an existing one is private enough.
func secureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("fdpass: create socket directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("fdpass: socket directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("fdpass: socket directory %s is not a directory", dir)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("%w: %s has mode %#o", ErrInsecureDir, dir, perm)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: %s is owned by uid %d, this process runs as uid %d", ErrInsecureDir, dir, st.Uid, os.Geteuid())
	}
	return nil
}

// removeStale removes a socket file at path that nobody answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fdpass: check socket path: %w", err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%w: %s is a %s", ErrNotSocket, path, typeName(fi.Mode()))
	}
	c, err := net.DialTimeout("unix", path, staleProbeTimeout)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("%w: %s", ErrSocketInUse, path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		// EAGAIN (a full backlog) also means someone is alive.
		return fmt.Errorf("%w: %s: probe: %w", ErrSocketInUse, path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("fdpass: remove stale socket: %w", err)
	}
	return nil
}

func typeName(m fs.FileMode) string {
	switch t := m.Type(); {
	case t == 0:
		return "regular file"
	case t&fs.ModeDir != 0:
		return "directory"
	case t&fs.ModeSymlink != 0:
		return "symlink"
	case t&fs.ModeNamedPipe != 0:
		return "named pipe"
	case t&fs.ModeDevice != 0:
		return "device"
	default:
		return "special file"
	}
}

// Path returns the socket's absolute path.
func (l *Listener) Path() string { return l.path }

// Accept waits for one connection until deadline (zero: no deadline) and
// returns ErrAcceptTimeout when it passes. Calls must not overlap (each sets
// the listener's deadline).
func (l *Listener) Accept(deadline time.Time) (*Conn, error) {
	if err := l.ul.SetDeadline(deadline); err != nil {
		return nil, fmt.Errorf("fdpass: accept on %s: %w", l.path, err)
	}
	uc, err := l.ul.AcceptUnix()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("%w (%s)", ErrAcceptTimeout, l.path)
		}
		return nil, fmt.Errorf("fdpass: accept on %s: %w", l.path, err)
	}
	c, err := newConn(uc)
	if err != nil {
		_ = uc.Close()
		return nil, err
	}
	return c, nil
}

// Close closes the listener and removes the socket file if it is still the
// one Listen created. It is idempotent; later calls return the first result.
// Accepted Conns stay open.
func (l *Listener) Close() error {
	l.once.Do(func() {
		l.closeErr = l.ul.Close()
		if l.fi != nil {
			if fi, err := os.Lstat(l.path); err != nil || !os.SameFile(fi, l.fi) {
				return // gone, or another's now: not ours to remove
			}
		} // else Listen failed after bind; the file is ours.
		err := os.Remove(l.path)
		switch {
		case err == nil:
			l.removed.Store(true)
		case !errors.Is(err, fs.ErrNotExist) && l.closeErr == nil:
			l.closeErr = fmt.Errorf("fdpass: remove socket: %w", err)
		}
	})
	return l.closeErr
}

// Removed reports whether Close removed the socket file: false before
// Close, and when the file was already gone or had been replaced (then it
// was not this listener's to remove). A count of removed files uses it.
func (l *Listener) Removed() bool { return l.removed.Load() }
