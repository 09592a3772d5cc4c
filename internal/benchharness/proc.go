package benchharness

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onebitd/onebitd/internal/tailbuf"
)

// Proc is a child process started by the harness. Its stderr is scanned for
// a ready line and its last lines are kept for error messages.
type Proc struct {
	name   string
	cmd    *exec.Cmd
	done   chan struct{}
	stderr *tailbuf.Buffer
}

const (
	tailLines  = 40
	maxLine    = 64 << 10 // a JSON log line with many attributes
	readyLimit = 60 * time.Second
	stopLimit  = 10 * time.Second
)

// startProc runs bin with args and waits (at most readyLimit) for a stderr
// line matching ready; it returns the line's first submatch.
func startProc(ctx context.Context, bin string, ready *regexp.Regexp, args ...string) (*Proc, string, error) {
	return startProcEnv(ctx, bin, nil, ready, args...)
}

// startProcEnv is startProc with env added to this process's environment.
func startProcEnv(ctx context.Context, bin string, env []string, ready *regexp.Regexp, args ...string) (*Proc, string, error) {
	return startProcLimit(ctx, bin, env, ready, readyLimit, args...)
}

// startProcLimit is startProcEnv waiting up to limit for the ready line (a
// real model takes longer to load than the simulator).
func startProcLimit(ctx context.Context, bin string, env []string, ready *regexp.Regexp, limit time.Duration, args ...string) (*Proc, string, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, "", fmt.Errorf("%w: %s", ErrNoBinary, bin)
	}
	p := &Proc{name: filepath.Base(bin), cmd: exec.Command(bin, args...), done: make(chan struct{})}
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.cmd.Stdout = io.Discard
	found := make(chan string, 1)
	sent := false
	p.stderr = tailbuf.New(tailbuf.Options{MaxLines: tailLines, MaxBytes: tailLines * maxLine, MaxLine: maxLine,
		OnLine: func(line string) {
			if !sent {
				if m := ready.FindStringSubmatch(line); m != nil {
					found <- m[1]
					sent = true
				}
			}
		}})
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start %s: %w", p.name, err)
	}
	go func() {
		_ = p.cmd.Wait() // returns once stderr is read to its end
		p.stderr.Flush()
		close(p.done)
	}()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case s := <-found:
		return p, s, nil
	case <-p.done:
		return nil, "", fmt.Errorf("%w: %s: %s", ErrExited, p.name, p.Tail())
	case <-timer.C:
		p.Stop()
		return nil, "", fmt.Errorf("%w: %s after %s: %s", ErrNotReady, p.name, limit, p.Tail())
	case <-ctx.Done():
		p.Stop()
		return nil, "", ctx.Err()
	}
}

// Tail is the last lines the process wrote to stderr.
func (p *Proc) Tail() string { return p.stderr.String() }

// PID is the child's process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Stop sends SIGTERM, waits up to stopLimit, then kills the process group.
func (p *Proc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(stopLimit)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// CPUTime is the user + system CPU time pid has used (/proc/PID/stat,
// clock ticks of 10 ms).
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// RSS is the resident set size of pid (VmRSS of /proc/PID/status) in bytes.
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest) // "12345 kB"
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err != nil {
					return 0, fmt.Errorf("VmRSS of %d: %w", pid, err)
				}
				return kb << 10, nil
			}
		}
	}
	return 0, fmt.Errorf("VmRSS of %d: not in /proc/%d/status", pid, pid)
}
