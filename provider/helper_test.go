package provider

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/provjob"
)

// The test binary doubles as the provider: with GO_WANT_HELPER_PROCESS=1 and
// "-helper" as its first argument it runs helperMain instead of the tests.
// Runner.Args carry "-helper MODE [ARG]"; the contract args follow.
const helperEnv = "GO_WANT_HELPER_PROCESS"

func TestMain(m *testing.M) {
	// The environment is inherited by every process the tests start (fuzz
	// workers too): "-helper" as first argument tells a provider.
	if os.Getenv(helperEnv) == "1" && len(os.Args) > 1 && os.Args[1] == "-helper" {
		os.Exit(helperMain(os.Args[1:]))
	}
	if os.Getenv(helperEnv) == "1" && len(os.Args) > 1 && os.Args[1] == "--serve" {
		os.Exit(warmMain(os.Args[2:]))
	}
	os.Setenv(helperEnv, "1")                // inherited by the providers the tests start
	os.Setenv("GORACE", "atexit_sleep_ms=0") // a -race child otherwise sleeps 1s on exit 0
	if err := CloseOnExecInherited(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if simProvider.path != "" {
			os.RemoveAll(filepath.Dir(simProvider.path))
		}
		os.Exit(code)
	}))
}

func helperMain(args []string) int {
	// Probe fds before anything opens one.
	open := openFDs()
	if len(args) < 2 || args[0] != "-helper" {
		fmt.Fprintln(os.Stderr, "helper: want -helper MODE")
		return 2
	}
	mode, rest := args[1], args[2:]
	switch mode {
	case "ok":
		fmt.Fprintln(os.Stderr, "prefilling")
		return 0
	case "fail":
		fmt.Fprint(os.Stderr, "starting\nsimulated failure\n\n  \n")
		return 1
	case "fail-silent":
		return 3
	case "progress":
		fmt.Fprint(os.Stderr, "10%\r50%\r100%\rlast words\r")
		return 4
	case "long-stderr":
		for i := range 5000 {
			fmt.Fprintf(os.Stderr, "noise line %d\n", i)
		}
		fmt.Fprint(os.Stderr, strings.Repeat("x", 2000))
		return 1
	case "signal":
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		time.Sleep(time.Hour)
	case "sleep", "hang":
		time.Sleep(time.Hour)
	case "hang-report": // write own pid to rest[0], then hang
		if err := writePID(rest[0], os.Getpid()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		time.Sleep(time.Hour)
	case "daemon":
		// Acts as onebitd: runs a provider that reports its pid to rest[0]
		// and hangs, holding a memfd named rest[1] (a KV region).
		fd, err := unix.MemfdCreate(rest[1], unix.MFD_CLOEXEC)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		region := os.NewFile(uintptr(fd), rest[1])
		r := &Runner{Path: os.Args[0], Args: []string{"-helper", "hang-report", rest[0]}}
		_, err = r.RunShared(context.Background(), "t", "m", "l", []*os.File{region})
		fmt.Fprintln(os.Stderr, "the provider returned:", err)
		return 1
	case "warm-daemon":
		// Acts as onebitd with a warm provider (socket rest[1]) given a job
		// that hangs holding a memfd named rest[2]; writes the provider's pid
		// to rest[0] once it holds the region.
		w, err := StartWarm(context.Background(), WarmConfig{Path: os.Args[0], Socket: rest[1]})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fd, err := unix.MemfdCreate(rest[2], unix.MFD_CLOEXEC)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		region := os.NewFile(uintptr(fd), rest[2])
		if err := writePID(rest[0], w.PID()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		_, err = w.Run(context.Background(), &provjob.Job{Version: 1, Route: "shared", Tokens: []int{1}, Model: "hang", Layout: []byte("{}")}, []*os.File{region})
		fmt.Fprintln(os.Stderr, "the job returned:", err)
		return 1
	case "hang-grandchild", "exit-grandchild", "ok-grandchild":
		gc := exec.Command(os.Args[0], "-helper", "sleep")
		gc.Stderr = os.Stderr // the grandchild holds stderr open
		if err := gc.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := writePID(rest[0], gc.Process.Pid); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		switch mode {
		case "exit-grandchild":
			fmt.Fprintln(os.Stderr, "left a child behind")
			return 1
		case "ok-grandchild":
			return 0
		}
		time.Sleep(time.Hour)
	case "fds":
		// Report "fd=content" for every open fd above 2, then the
		// arguments after the report path.
		var parts []string
		for _, fd := range open {
			b := make([]byte, 64)
			n, err := unix.Pread(fd, b, 0)
			if err != nil {
				parts = append(parts, fmt.Sprintf("%d=(%v)", fd, err))
				continue
			}
			parts = append(parts, fmt.Sprintf("%d=%s", fd, b[:n]))
		}
		report := strings.Join(parts, ",") + "\n" + strings.Join(rest[1:], " ")
		if err := os.WriteFile(rest[0], []byte(report), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "helper: unknown mode %q\n", mode)
	return 2
}

// warmMain is a warm provider (DESIGN §2c): --socket PATH [-start MODE].
// Each job's model names what it does: "fail" answers a failure, "hang"
// keeps writing into the job's regions and never answers, "die" exits
// mid-job, "garbage" answers bytes that are no reply; anything else
// succeeds.
func warmMain(args []string) int {
	var sock, mode string
	for i := 0; i+1 < len(args); i += 2 {
		switch args[i] {
		case "--socket":
			sock = args[i+1]
		case "-start":
			mode = args[i+1]
		}
	}
	switch mode {
	case "crash":
		fmt.Fprintln(os.Stderr, "cannot load the model")
		return 2
	case "never-listen":
		time.Sleep(time.Hour)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintln(os.Stderr, "serving on", sock)
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		go warmJob(c)
	}
}

func warmJob(c *net.UnixConn) {
	defer c.Close()
	job, files, err := provjob.ReadJob(c, time.Time{})
	if err != nil {
		return // the supervisor's readiness probe
	}
	reply := provjob.Reply{OK: true, NTokens: len(job.Tokens) - job.Start, PrefillMs: 1}
	switch job.Model {
	case "fail":
		reply = provjob.Reply{Reason: "simulated failure"}
	case "hang":
		for {
			for _, f := range files {
				f.WriteAt([]byte("late"), 0)
			}
			time.Sleep(time.Millisecond)
		}
	case "die":
		fmt.Fprintln(os.Stderr, "dying mid-job")
		os.Exit(3)
	case "garbage":
		provjob.CloseFiles(files)
		provjob.WriteFrame(c, []byte("not a reply"), nil, time.Time{})
		return
	}
	provjob.CloseFiles(files)
	provjob.WriteReply(c, reply, time.Time{})
}

// writePID writes pid to path atomically (a reader never sees half of it).
func writePID(path string, pid int) error {
	if err := os.WriteFile(path+".tmp", []byte(strconv.Itoa(pid)), 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// openFDs lists the open fds from 3 to 255 without opening any, except the
// cgroup file the Go runtime itself keeps open to follow CPU limits.
func openFDs() []int {
	var fds []int
	for fd := 3; fd < 256; fd++ {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			continue
		}
		if l, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)); strings.HasPrefix(l, "/sys/fs/cgroup/") {
			continue
		}
		fds = append(fds, fd)
	}
	return fds
}

// readPID waits for the pid file written by a helper.
func readPID(t *testing.T, path string) int {
	t.Helper()
	var pid int
	obtest.WaitFor(t, 10*time.Second, "the helper's pid file", func() bool {
		b, err := os.ReadFile(path)
		if err != nil || len(b) == 0 {
			return false
		}
		pid, err = strconv.Atoi(string(b))
		return err == nil
	})
	return pid
}
