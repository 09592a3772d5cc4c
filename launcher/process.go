package launcher

import (
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/internal/pgroup"
	"github.com/onebitd/onebitd/internal/tailbuf"
)

// process is one run of the decoder binary.
type process struct {
	pid     int
	child   *pgroup.Child
	exited  chan struct{} // closed once the process was reaped and its output flushed (waitErr is set)
	waitErr error
	tail    *tailbuf.Buffer // the last stderr lines
	readyAt time.Time       // set by the supervisor once /health answered 200
}

// spawn starts bin with args in its own process group, dying with onebitd
// (pgroup.Start: Pdeathsig SIGKILL from a thread kept until the reap). Once
// the child has exited, what is left of its group is killed before the child
// is reaped: no signal reaches the group after that.
func spawn(bin string, args []string, log *slog.Logger) (*process, error) {
	var pid atomic.Int64 // read by exec's copy goroutines, set after Start
	output := func(stream string) tailbuf.Options {
		return tailbuf.Options{MaxLines: TailLines, MaxBytes: TailLines * maxTailLine, MaxLine: maxTailLine,
			OnLine: func(line string) {
				log.Info("decoder output", attrStream, stream, attrPID, pid.Load(), attrOutput, line)
			}}
	}
	p := &process{exited: make(chan struct{}), tail: tailbuf.New(output("stderr"))}
	stdout := tailbuf.New(output("stdout"))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = stdout, p.tail
	cmd.WaitDelay = waitDelay
	child, err := pgroup.Start(cmd, groupKill)
	if err != nil {
		return nil, fmt.Errorf("launcher: start %s: %w", bin, err)
	}
	p.pid, p.child = child.PID, child
	pid.Store(int64(p.pid))
	log.Info("decoder started", attrPID, p.pid, attrBin, bin, attrArgs, strings.Join(args, " "))
	go func() {
		err := child.Wait()
		if gerr := child.GroupErr(); gerr != nil {
			log.Warn("decoder process group not killed", attrPID, p.pid, attrError, gerr)
		}
		stdout.Flush()
		p.tail.Flush()
		p.waitErr = err
		close(p.exited)
	}()
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

// signalGroup sends sig to the process group; a group already gone, or a
// decoder already exited (its leftovers were killed then), is fine.
func (p *process) signalGroup(sig syscall.Signal) error {
	if err := p.child.Signal(sig); err != nil && !errors.Is(err, pgroup.ErrReaped) {
		return fmt.Errorf("launcher: kill -%d -%d: %w", sig, p.pid, err)
	}
	return nil
}

// groupKill sends sig to the process group pgid (a variable so that a test
// can check when the launcher signals a group).
var groupKill = func(pgid int, sig syscall.Signal) error { return unix.Kill(-pgid, sig) }

// terminate sends SIGTERM to the group, SIGKILL after grace, and returns
// once the process has been reaped.
func (p *process) terminate(grace time.Duration, log *slog.Logger) {
	select {
	case <-p.exited:
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
		log.Info("decoder stopped", attrPID, p.pid, "status", p.exitReason())
		return
	case <-t.C:
	}
	log.Warn("decoder ignored SIGTERM; killing its process group", attrPID, p.pid, "grace", grace)
	if err := p.signalGroup(unix.SIGKILL); err != nil {
		log.Warn("decoder stop", attrPID, p.pid, attrError, err)
	}
	<-p.exited
}

// stderrTail is the decoder's last stderr lines, one per line, or "(no
// output)".
func (p *process) stderrTail() string {
	if s := p.tail.String(); s != "" {
		return s
	}
	return "(no output)"
}

// maxTailLine bounds one kept (and logged) output line.
const maxTailLine = 2 << 10
