package pgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/obtest"
)

// unreapedChild reports whether pid is an unreaped child of this process
// leading its own group.
func unreapedChild(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+2:]) // state ppid pgrp …
	ppid, _ := strconv.Atoi(f[1])
	pgrp, _ := strconv.Atoi(f[2])
	return ppid == os.Getpid() && pgrp == pid
}

// start runs sh -c script in its own group and returns the command and a
// kill function that records every signal sent while the leader was not an
// unreaped child.
func start(t *testing.T, script string) (*exec.Cmd, *Group, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var sent, late atomic.Int64
	g := New(cmd.Process.Pid, func(pgid int, sig syscall.Signal) error {
		sent.Add(1)
		if !unreapedChild(pgid) {
			late.Add(1)
		}
		return syscall.Kill(-pgid, sig)
	})
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	return cmd, g, &sent, &late
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	var pid int
	obtest.WaitFor(t, 10*time.Second, "the pid file", func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	return pid
}

// A leader that exits leaves a grandchild in its group: Exited kills it,
// and nothing is signalled after.
func TestExitedKillsLeftovers(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "gc.pid")
	cmd, g, sent, late := start(t, "sleep 100 & echo $! > "+pidFile+".tmp && mv "+pidFile+".tmp "+pidFile+"; exit 3")
	gc := readPID(t, pidFile)
	if err := g.Exited(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 3 {
		t.Fatalf("wait: %v", err)
	}
	obtest.WaitFor(t, 10*time.Second, "the grandchild to die", func() bool { return obtest.Gone(gc) })
	if err := g.Signal(syscall.SIGKILL); !errors.Is(err, ErrReaped) {
		t.Fatalf("Signal after Exited: %v, want ErrReaped", err)
	}
	if sent.Load() != 1 || late.Load() != 0 {
		t.Fatalf("%d signals sent, %d after the reap; want 1, 0", sent.Load(), late.Load())
	}
}

// Signals from other goroutines racing the exit never land after the reap.
func TestSignalRacingExit(t *testing.T) {
	for range 20 {
		cmd, g, _, late := start(t, "sleep 0.01")
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if err := g.Signal(0); errors.Is(err, ErrReaped) {
						return
					}
				}
			})
		}
		if err := g.Exited(); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		close(stop)
		wg.Wait()
		if late.Load() != 0 {
			t.Fatalf("%d signals after the reap", late.Load())
		}
	}
}

// Signal while the leader runs reaches it.
func TestSignalWhileRunning(t *testing.T) {
	cmd, g, _, late := start(t, "exec sleep 100")
	if err := g.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := g.Exited(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("status %v, want killed by SIGTERM", cmd.ProcessState)
	}
	if late.Load() != 0 {
		t.Fatalf("%d signals after the reap", late.Load())
	}
}

// Exited on a pid that is not our child fails and closes the group.
func TestExitedNotAChild(t *testing.T) {
	g := New(os.Getpid(), func(int, syscall.Signal) error { t.Fatal("signalled"); return nil })
	if err := g.Exited(); err == nil {
		t.Fatal("Exited on our own pid succeeded")
	}
	if err := g.Signal(syscall.SIGKILL); !errors.Is(err, ErrReaped) {
		t.Fatalf("Signal: %v", err)
	}
}

// Start: own group, Pdeathsig, leftovers killed, reaped, no late signal.
func TestStart(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "gc.pid")
	var late atomic.Int64
	kill := func(pgid int, sig syscall.Signal) error {
		if !unreapedChild(pgid) {
			late.Add(1)
		}
		return syscall.Kill(-pgid, sig)
	}
	c, err := Start(exec.Command("/bin/sh", "-c", "sleep 100 & echo $! > "+pidFile+".tmp && mv "+pidFile+".tmp "+pidFile+"; exec sleep 100"), kill)
	if err != nil {
		t.Fatal(err)
	}
	if a := c.Cmd.SysProcAttr; !a.Setpgid || a.Pdeathsig != syscall.SIGKILL {
		t.Fatalf("SysProcAttr %+v", a)
	}
	gc := readPID(t, pidFile)
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(); err == nil || c.Cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Fatalf("wait %v", err)
	}
	obtest.WaitFor(t, 10*time.Second, "the grandchild to die", func() bool { return obtest.Gone(gc) })
	if err := c.Signal(syscall.SIGKILL); !errors.Is(err, ErrReaped) || late.Load() != 0 || c.GroupErr() != nil {
		t.Fatalf("after Done: %v, %d late signals, group %v", err, late.Load(), c.GroupErr())
	}
	if _, err := Start(exec.Command(filepath.Join(t.TempDir(), "missing")), nil); err == nil {
		t.Fatal("Start of a missing binary succeeded")
	}
}
