package provider

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/internal/obtest"
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
	os.Setenv(helperEnv, "1")                // inherited by the providers the tests start
	os.Setenv("GORACE", "atexit_sleep_ms=0") // a -race child otherwise sleeps 1s on exit 0
	if err := CloseOnExecInherited(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
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
