package soak

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a child process whose stderr is kept (bounded) and matched
// against a ready line.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}

	mu   sync.Mutex
	logs bytes.Buffer // the last maxLog bytes of stderr
}

const maxLog = 1 << 20

// startProc runs bin with args in its own process group, with SIGKILL as
// its parent-death signal (the caller holds its OS thread locked), and
// returns once a stderr line matches ready (its first submatch) or fails.
func startProc(name, bin string, ready *regexp.Regexp, timeout time.Duration, args ...string) (*proc, string, error) {
	p := &proc{name: name, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, "", err
	}
	p.cmd.Stderr = pw
	p.cmd.Stdout = pw
	if err := p.cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, "", fmt.Errorf("start %s: %w", name, err)
	}
	pw.Close()
	found := make(chan string, 1)
	go func() {
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			p.keep(line)
			if !sent {
				if m := ready.FindStringSubmatch(line); m != nil {
					found <- m[1]
					sent = true
				}
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case s := <-found:
		return p, s, nil
	case <-p.done:
		return nil, "", fmt.Errorf("%s exited before it was ready:\n%s", name, p.tail(4000))
	case <-t.C:
		p.kill()
		return nil, "", fmt.Errorf("%s not ready in %v:\n%s", name, timeout, p.tail(4000))
	}
}

func (p *proc) keep(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.logs.Len() > maxLog {
		b := p.logs.Bytes()[p.logs.Len()-maxLog/2:]
		p.logs = *bytes.NewBuffer(append([]byte(nil), b...))
	}
	p.logs.WriteString(line)
	p.logs.WriteByte('\n')
}

// tail is the last n bytes of the process's output.
func (p *proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.logs.Bytes()
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop sends SIGTERM and waits up to grace for the exit, then kills the
// group. It returns the exit code (-1 when killed).
func (p *proc) stop(grace time.Duration) int {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-t.C:
		p.kill()
		return -1
	}
}

func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// children lists the pids whose parent is pid.
func children(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// cmdline is pid's command line, arguments joined by spaces ("" when gone).
func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// zombie reports whether pid is a zombie (or gone).
func zombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z'
	}
	return false
}

// procsMentioning lists the pids (other than skip) whose command line
// contains s: the soak's temp dir is in every argument list it makes, so
// these are the processes of this run.
func procsMentioning(s string, skip map[int]bool) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || skip[pid] || pid == os.Getpid() {
			continue
		}
		if strings.Contains(cmdline(pid), s) && !zombie(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// fds counts pid's open fds: sockets, memfds and the rest.
type fds struct {
	sockets, memfds, other int
}

func (f fds) total() int { return f.sockets + f.memfds + f.other }

func (f fds) String() string {
	return fmt.Sprintf("%d (%d sockets, %d memfds, %d other)", f.total(), f.sockets, f.memfds, f.other)
}

func countFDs(pid int) (fds, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fds{}, err
	}
	var f fds
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		switch {
		case err != nil:
			continue // closed meanwhile
		case strings.HasPrefix(link, "socket:"):
			f.sockets++
		case strings.HasPrefix(link, "/memfd:"):
			f.memfds++
		default:
			f.other++
		}
	}
	return f, nil
}

// poll checks cond, backing off from 1 ms to 20 ms, until it holds or
// timeout passes; it reports whether it held.
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for delay := time.Millisecond; ; delay = min(2*delay, 20*time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(delay) // polling interval, not synchronisation
	}
}

// ppid is pid's parent (0 when unknown).
func ppid(pid int) int {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:]) // state, ppid, …
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// describeSockets names pid's sockets: "tcp LOCAL>REMOTE STATE" or "unix PATH"
// (an unnamed unix socket is the client side of a connection), for reports.
func describeSockets(pid int) []string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	inodes := map[string]bool{}
	for _, e := range ents {
		link, _ := os.Readlink(filepath.Join(dir, e.Name()))
		if strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var out []string
	tcpStates := map[string]string{"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}
	for _, f := range []string{"tcp", "tcp6"} {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		for _, l := range strings.Split(string(b), "\n")[1:] {
			c := strings.Fields(l)
			if len(c) > 9 && inodes[c[9]] {
				st := tcpStates[c[3]]
				if st == "" {
					st = "state " + c[3]
				}
				out = append(out, fmt.Sprintf("tcp %s>%s %s", c[1], c[2], st))
				delete(inodes, c[9])
			}
		}
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", pid))
	for _, l := range strings.Split(string(b), "\n")[1:] {
		c := strings.Fields(l)
		if len(c) > 6 && inodes[c[6]] {
			path := "(unnamed)"
			if len(c) > 7 {
				path = c[7]
			}
			out = append(out, "unix "+path)
			delete(inodes, c[6])
		}
	}
	for in := range inodes {
		out = append(out, "socket "+in)
	}
	slices.Sort(out)
	return out
}
