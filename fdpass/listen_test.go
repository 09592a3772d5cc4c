package fdpass

import (
	"bytes"
	"errors"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestListenCreates(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "slots", "a")
	l, err := Listen(dir, "req-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "req-1.sock"); l.Path() != want {
		t.Errorf("Path = %q, want %q", l.Path(), want)
	}
	assertMode(t, dir, fs.ModeDir|0o700)
	assertMode(t, l.Path(), fs.ModeSocket|0o600)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(l.Path()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket file after Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, err := l.Accept(time.Time{}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close = %v, want net.ErrClosed", err)
	}
}

func assertMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (fs.ModeType | fs.ModePerm); got != want {
		t.Errorf("%s: mode %v, want %v", path, got, want)
	}
}

func TestListenRelativeDir(t *testing.T) {
	t.Chdir(t.TempDir())
	l, err := Listen("rel", "s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !filepath.IsAbs(l.Path()) {
		t.Errorf("Path %q is not absolute", l.Path())
	}
}

func TestListenRefuses(t *testing.T) {
	tmp := t.TempDir()
	// A directory name that makes dir/name.sock exactly maxPathLen+extra bytes.
	dirFor := func(extra int) string {
		n := maxPathLen + extra - len(tmp) - len("/") - len("/s.sock")
		return filepath.Join(tmp, strings.Repeat("d", n))
	}
	mkdir := func(mode fs.FileMode) string {
		d, err := os.MkdirTemp(tmp, "m")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	withFile := func(name string, mk func(path string) error) string {
		d := mkdir(0o700)
		if err := mk(filepath.Join(d, name+".sock")); err != nil {
			t.Fatal(err)
		}
		return d
	}
	regular := withFile("s", func(p string) error { return os.WriteFile(p, []byte("keep me"), 0o600) })
	asDir := withFile("s", func(p string) error { return os.Mkdir(p, 0o700) })
	fifo := withFile("s", func(p string) error { return mkfifo(p) })
	live := mkdir(0o700)
	ll, err := net.Listen("unix", filepath.Join(live, "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ll.Close()

	tests := []struct {
		name      string
		dir, sock string
		want      error
	}{
		{"path one byte too long", dirFor(1), "s", ErrPathTooLong},
		{"abstract '@'", tmp, "@s", ErrAbstractName},
		{"abstract NUL", tmp, "s\x00", ErrAbstractName},
		{"slash in name", tmp, "a/s", ErrBadName},
		{"dot-dot", tmp, "..", ErrBadName},
		{"empty name", tmp, "", ErrBadName},
		{"empty dir", "", "s", ErrBadName},
		{"dir writable by others", mkdir(0o777), "s", ErrInsecureDir},
		{"dir writable by group", mkdir(0o770), "s", ErrInsecureDir},
		{"sticky world-writable dir", mkdir(0o1777), "s", ErrInsecureDir},
		{"regular file at the path", regular, "s", ErrNotSocket},
		{"directory at the path", asDir, "s", ErrNotSocket},
		{"fifo at the path", fifo, "s", ErrNotSocket},
		{"live socket", live, "s", ErrSocketInUse},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Listen(tc.dir, tc.sock)
			if !errors.Is(err, tc.want) {
				if l != nil {
					l.Close()
				}
				t.Fatalf("Listen(%q, %q) = %v, want %v", tc.dir, tc.sock, err, tc.want)
			}
		})
	}
	if _, err := os.Stat(dirFor(1)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused long path created its directory: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(regular, "s.sock")); err != nil || string(b) != "keep me" {
		t.Errorf("the regular file was touched: %q, %v", b, err)
	}
	// The live listener still works.
	if c, err := net.Dial("unix", filepath.Join(live, "s.sock")); err != nil {
		t.Errorf("live socket after a refused Listen: %v", err)
	} else {
		c.Close()
	}
}

func TestListenMaxPathLen(t *testing.T) {
	if MaxPathLen() != 107 {
		t.Fatalf("MaxPathLen = %d", MaxPathLen())
	}
	tmp := t.TempDir()
	dir := filepath.Join(tmp, strings.Repeat("d", maxPathLen-len(tmp)-len("/")-len("/s.sock")))
	l, err := Listen(dir, "s")
	if err != nil {
		t.Fatalf("a %d-byte path: %v", maxPathLen, err)
	}
	defer l.Close()
	if len(l.Path()) != maxPathLen {
		t.Fatalf("path is %d bytes", len(l.Path()))
	}
}

func TestListenKeepsExistingDirMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	l, err := Listen(dir, "s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	assertMode(t, dir, fs.ModeDir|0o750)
}

func TestListenDirOwnedByOther(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	dir := filepath.Join(t.TempDir(), "d")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(dir, "s"); !errors.Is(err, ErrInsecureDir) {
		t.Fatalf("Listen = %v, want ErrInsecureDir", err)
	}
}

func TestListenReplacesStaleSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.sock")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ul.SetUnlinkOnClose(false)
	ul.Close() // a crashed run: the file stays, nobody listens
	if _, err := os.Lstat(path); err != nil {
		t.Fatal(err)
	}
	l, err := Listen(dir, "s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := Dial(l.Path(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ac, err := l.Accept(time.Now().Add(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ac.Close()
}

// TestListenCloseKeepsReplacement: a listener whose file was replaced by a
// newer one does not unlink the newer one.
func TestListenCloseKeepsReplacement(t *testing.T) {
	dir := t.TempDir()
	l1, err := Listen(dir, "s")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(l1.Path()); err != nil {
		t.Fatal(err)
	}
	l2, err := Listen(dir, "s")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if err := l1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(l2.Path()); err != nil {
		t.Fatalf("l1.Close removed l2's socket: %v", err)
	}
}

func TestAcceptTimeout(t *testing.T) {
	l, err := Listen(t.TempDir(), "s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	if _, err := l.Accept(start.Add(30 * time.Millisecond)); !errors.Is(err, ErrAcceptTimeout) {
		t.Fatalf("Accept = %v, want ErrAcceptTimeout", err)
	}
	if el := time.Since(start); el < 30*time.Millisecond {
		t.Fatalf("Accept returned after %v, before the deadline", el)
	}
	// A deadline in the past fails at once, and a later Accept still works.
	if _, err := l.Accept(time.Now().Add(-time.Second)); !errors.Is(err, ErrAcceptTimeout) {
		t.Fatalf("Accept(past) = %v", err)
	}
	c, err := Dial(l.Path(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ac, err := l.Accept(time.Now().Add(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ac.Close()
}

// TestShareInProcess is the whole path over a listening socket: Dial, Send,
// Accept, PeerCred, Receive.
func TestShareInProcess(t *testing.T) {
	l, err := Listen(t.TempDir(), "s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fds := memfds(t, 3)
	h := testHeader(3, 56)
	b, err := Encode(&h)
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() {
		c, err := Dial(l.Path(), 10*time.Second)
		if err != nil {
			sent <- err
			return
		}
		defer c.Close()
		sent <- Send(c, b, fds)
	}()
	c, err := l.Accept(time.Now().Add(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cred, err := c.PeerCred()
	if err != nil {
		t.Fatal(err)
	}
	if cred.PID != os.Getpid() || cred.UID != os.Geteuid() || cred.GID != os.Getegid() {
		t.Errorf("PeerCred = %+v, want pid %d uid %d gid %d", cred, os.Getpid(), os.Geteuid(), os.Getegid())
	}
	msg, err := c.Receive(time.Now().Add(10*time.Second), 8)
	if serr := <-sent; serr != nil {
		t.Fatal(serr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if n := msg.Close(); n != 3 {
		t.Fatalf("Close = %d", n)
	}
}

// startHelper re-runs the test binary as a sender of nfds memfds to path.
func startHelper(t *testing.T, path string, nfds int) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "FDPASS_SOCKET="+path, "FDPASS_NFDS="+strconv.Itoa(nfds))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, &stderr
}

func mkfifo(path string) error { return os.NewSyscallError("mkfifo", unix.Mkfifo(path, 0o600)) }

func TestChildSender(t *testing.T) {
	tests := []struct {
		name   string
		nfds   int
		maxFDs int
		want   error
	}{
		{"good", 3, 3, nil},
		{"more fds than maxFDs", 3, 2, ErrCtrunc},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Listen(t.TempDir(), "s")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			cmd, stderr := startHelper(t, l.Path(), tc.nfds)
			c, err := l.Accept(time.Now().Add(30 * time.Second))
			if err != nil {
				t.Fatalf("%v (child stderr: %s)", err, stderr)
			}
			cred, err := c.PeerCred()
			if err != nil {
				t.Fatal(err)
			}
			if cred.PID != cmd.Process.Pid {
				t.Errorf("PeerCred pid %d, want the child's %d", cred.PID, cmd.Process.Pid)
			}
			if cred.PID == os.Getpid() {
				t.Errorf("PeerCred pid is this process")
			}
			base := fdCount(t)
			msg, err := c.Receive(time.Now().Add(30*time.Second), tc.maxFDs)
			switch {
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Errorf("Receive = %v, want %v", err, tc.want)
			case tc.want == nil && err != nil:
				t.Errorf("Receive: %v (child stderr: %s)", err, stderr)
			case tc.want == nil:
				if len(msg.Files) != tc.nfds {
					t.Errorf("%d files, want %d", len(msg.Files), tc.nfds)
				}
				if n := msg.Close(); n != tc.nfds {
					t.Errorf("Close = %d", n)
				}
			}
			if got := fdCount(t); got != base {
				t.Errorf("fd count %d, baseline %d", got, base)
			}
			c.Close() // the child exits when we hang up
			if err := cmd.Wait(); err != nil {
				t.Errorf("child: %v (stderr: %s)", err, stderr)
			}
		})
	}
}

// TestCloseUnblocksAccept: the handoff closes the listener from another
// goroutine to stop a pending Accept.
func TestCloseUnblocksAccept(t *testing.T) {
	l, err := Listen(t.TempDir(), "s")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept(time.Time{})
		if c != nil {
			c.Close()
		}
		done <- err
	}()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after a concurrent Close = %v, want net.ErrClosed", err)
	}
	if _, err := os.Lstat(l.Path()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket file after Close: %v", err)
	}
}

// TestListenCloseRemoved: Removed tells whether Close unlinked the socket
// file, so that a caller's count of removed files is true (issue 9: the
// handoff counted the socket even when it was gone or replaced).
func TestListenCloseRemoved(t *testing.T) {
	cases := []struct {
		name   string
		before func(t *testing.T, l *Listener)
		want   bool
	}{
		{"ours", func(*testing.T, *Listener) {}, true},
		{"already gone", func(t *testing.T, l *Listener) {
			if err := os.Remove(l.Path()); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"replaced by a file", func(t *testing.T, l *Listener) {
			if err := os.Remove(l.Path()); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(l.Path(), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Listen(t.TempDir(), "s")
			if err != nil {
				t.Fatal(err)
			}
			if l.Removed() {
				t.Fatal("Removed before Close")
			}
			tc.before(t, l)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if l.Removed() != tc.want {
				t.Fatalf("Removed = %v, want %v", l.Removed(), tc.want)
			}
			_, err = os.Lstat(l.Path())
			if gone := err != nil; gone != (tc.want || tc.name == "already gone") {
				t.Fatalf("socket path after Close: %v", err)
			}
			l.Close() // idempotent: the answer does not change
			if l.Removed() != tc.want {
				t.Fatal("a second Close changed Removed")
			}
		})
	}
}
