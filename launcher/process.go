package launcher

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// process is one run of the decoder binary.
type process struct {
	pid     int
	exited  chan struct{} // closed once Wait returned (waitErr is set)
	waitErr error
	tail    *tail
	readyAt time.Time // set by the supervisor once /health answered 200
}

// spawn starts bin with args in its own process group, with Pdeathsig
// SIGKILL. The goroutine that forks stays locked to its OS thread until the
// child has been reaped: Pdeathsig fires when the forking *thread* exits, and
// the Go runtime may otherwise retire that thread while the child lives.
func spawn(bin string, args []string, log *slog.Logger) (*process, error) {
	p := &process{exited: make(chan struct{}), tail: newTail(TailLines)}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command(bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		var pid atomic.Int64 // read by exec's copy goroutines, set after Start
		stdout := &lineWriter{emit: func(line string) {
			log.Info("decoder output", attrStream, "stdout", attrPID, pid.Load(), attrOutput, line)
		}}
		stderr := &lineWriter{emit: func(line string) {
			p.tail.add(line)
			log.Info("decoder output", attrStream, "stderr", attrPID, pid.Load(), attrOutput, line)
		}}
		cmd.Stdout, cmd.Stderr = stdout, stderr
		cmd.WaitDelay = waitDelay
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("launcher: start %s: %w", bin, err)
			return
		}
		p.pid = cmd.Process.Pid
		pid.Store(int64(p.pid))
		log.Info("decoder started", attrPID, p.pid, attrBin, bin, attrArgs, strings.Join(args, " "))
		started <- nil
		err := cmd.Wait()
		stdout.flush()
		stderr.flush()
		p.waitErr = err
		close(p.exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// exitReason describes how the process ended ("exit status 1", "signal:
// killed"). Call it after exited is closed.
func (p *process) exitReason() string {
	if p.waitErr == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(p.waitErr, &ee) {
		return ee.String()
	}
	return p.waitErr.Error()
}

// signalGroup sends sig to the process group; a group already gone is fine.
func (p *process) signalGroup(sig syscall.Signal) error {
	if err := groupKill(p.pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("launcher: kill -%d -%d: %w", sig, p.pid, err)
	}
	return nil
}

// groupKill sends sig to the process group pgid (a variable so that a test
// can check when the launcher signals a group).
var groupKill = func(pgid int, sig syscall.Signal) error { return unix.Kill(-pgid, sig) }

// killGroup kills whatever is left in the process group.
func (p *process) killGroup() { _ = p.signalGroup(unix.SIGKILL) }

// terminate sends SIGTERM to the group, SIGKILL after grace, and returns
// once the process has been reaped.
func (p *process) terminate(grace time.Duration, log *slog.Logger) {
	select {
	case <-p.exited:
		p.killGroup()
		return
	default:
	}
	if err := p.signalGroup(unix.SIGTERM); err != nil {
		log.Warn("decoder stop", attrPID, p.pid, attrError, err)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
		p.killGroup()
		log.Info("decoder stopped", attrPID, p.pid, "status", p.exitReason())
		return
	case <-t.C:
	}
	log.Warn("decoder ignored SIGTERM; killing its process group", attrPID, p.pid, "grace", grace)
	p.killGroup()
	<-p.exited
}

// maxLine bounds one logged output line; longer lines are split.
const maxLine = 16 << 10

// lineWriter splits what a process writes into lines and hands each to emit
// (without the newline; a trailing \r is dropped too).
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	emit func(string)
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			w.buf = append(w.buf, b...)
			for len(w.buf) >= maxLine {
				w.emit(string(w.buf[:maxLine]))
				w.buf = append(w.buf[:0], w.buf[maxLine:]...)
			}
			break
		}
		w.buf = append(w.buf, b[:i]...)
		b = b[i+1:]
		w.emitBuf()
	}
	return n, nil
}

func (w *lineWriter) emitBuf() {
	line := w.buf
	for len(line) > maxLine {
		w.emit(string(line[:maxLine]))
		line = line[maxLine:]
	}
	w.emit(strings.TrimSuffix(string(line), "\r"))
	w.buf = w.buf[:0]
}

// flush emits a last line without a newline.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.emitBuf()
	}
}

// maxTailLine bounds one kept stderr line.
const maxTailLine = 512

// tail keeps the last n lines.
type tail struct {
	mu    sync.Mutex
	lines []string
	next  int
	full  bool
}

func newTail(n int) *tail { return &tail{lines: make([]string, n)} }

func (t *tail) add(line string) {
	if len(line) > maxTailLine {
		line = line[:maxTailLine] + "…"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines[t.next] = line
	t.next = (t.next + 1) % len(t.lines)
	if t.next == 0 {
		t.full = true
	}
}

// String is the kept lines, oldest first, one per line; "(no output)" when
// there is none.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ls []string
	if t.full {
		ls = append(ls, t.lines[t.next:]...)
	}
	ls = append(ls, t.lines[:t.next]...)
	if len(ls) == 0 {
		return "(no output)"
	}
	return strings.Join(ls, "\n")
}
