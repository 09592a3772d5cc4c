// Package pgroup signals a child's process group only while the group's
// leader (the child, started with Setpgid, so the group id is its pid) is
// known not to be reaped. Once wait4 has reaped the leader its pid may be
// handed to a new process, and kill(-pid) could then hit an unrelated
// process group; while the leader is a zombie its pid, and so the group id,
// stays reserved.
//
// The owner of the child calls Exited, which waits for the leader to exit
// without reaping it (waitid WNOWAIT), kills what is left of the group, and
// closes the Group; only then does the owner reap the child (exec.Cmd.Wait).
// Any goroutine may call Signal meanwhile; after Exited it sends nothing.
//
// Start does all of it for an exec.Cmd, and makes the child die with this
// process (Pdeathsig from a thread kept until the reap).
package pgroup

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrReaped: Signal was called after Exited; nothing was sent.
var ErrReaped = errors.New("pgroup: the group's leader has exited; its group is not signalled any more")

// Group is the process group of one child.
type Group struct {
	mu     sync.Mutex
	pgid   int
	closed bool
	kill   func(pgid int, sig syscall.Signal) error
}

// New returns the group led by pid (a child started with Setpgid). kill
// sends a signal to a group; nil means kill(-pgid, sig).
func New(pid int, kill func(pgid int, sig syscall.Signal) error) *Group {
	if kill == nil {
		kill = func(pgid int, sig syscall.Signal) error { return unix.Kill(-pgid, sig) }
	}
	return &Group{pgid: pid, kill: kill}
}

// Signal sends sig to the group. A group already empty is not an error; after
// Exited it returns ErrReaped and sends nothing.
func (g *Group) Signal(sig syscall.Signal) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrReaped
	}
	return g.signal(sig)
}

func (g *Group) signal(sig syscall.Signal) error {
	if err := g.kill(g.pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return os.NewSyscallError("kill", err)
	}
	return nil
}

// Exited blocks until the leader has exited, leaving it unreaped, then sends
// SIGKILL to whatever is left of its group (grandchildren) and closes the
// group. The caller reaps the leader after it returns. Call it once, from
// the goroutine that will reap.
func (g *Group) Exited() error {
	var err error
	for {
		var info unix.Siginfo
		err = unix.Waitid(unix.P_PID, g.pgid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	if err != nil {
		// Not our child, or already reaped: the group id is not ours to use.
		return os.NewSyscallError("waitid", err)
	}
	return g.signal(syscall.SIGKILL)
}

// Child is a process started by Start: in its own process group, dying with
// this process, reaped by Start's goroutine.
type Child struct {
	PID    int
	Cmd    *exec.Cmd // its ProcessState is set once Done is closed
	group  *Group
	done   chan struct{}
	err    error // cmd.Wait's
	grpErr error // Exited's
}

// Start starts cmd in its own process group (Setpgid) with Pdeathsig
// SIGKILL, so that the child dies with this process, kill -9 included. The
// kernel sends Pdeathsig when the *thread* that forked exits, so the
// goroutine that forks keeps its OS thread locked until the child is
// reaped. That goroutine waits for the child's exit, kills what is left of
// its group (Group.Exited), reaps it (cmd.Wait) and closes Done. kill is as
// for New.
func Start(cmd *exec.Cmd, kill func(pgid int, sig syscall.Signal) error) (*Child, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pgid = 0
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	c := &Child{Cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		c.PID = cmd.Process.Pid
		c.group = New(c.PID, kill)
		started <- nil
		c.grpErr = c.group.Exited()
		c.err = cmd.Wait()
		close(c.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return c, nil
}

// Signal sends sig to the child's process group while the child has not
// exited; after that it returns ErrReaped and sends nothing.
func (c *Child) Signal(sig syscall.Signal) error { return c.group.Signal(sig) }

// Done is closed once the child has exited, its group's leftovers were
// killed and it was reaped.
func (c *Child) Done() <-chan struct{} { return c.done }

// Wait waits for Done and returns cmd.Wait's error.
func (c *Child) Wait() error {
	<-c.done
	return c.err
}

// GroupErr is the error of killing the group's leftovers (nil normally).
// Call it after Done.
func (c *Child) GroupErr() error { return c.grpErr }
