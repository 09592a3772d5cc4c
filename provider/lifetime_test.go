package provider

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/obtest"
)

// isOurChild reports whether pid is a child of this process that has not
// been reaped yet (running or a zombie): then its process group id cannot
// belong to anything else.
func isOurChild(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	f := strings.Fields(s[i+2:]) // state ppid pgrp …
	if len(f) < 3 {
		return false
	}
	ppid, _ := strconv.Atoi(f[1])
	pgrp, _ := strconv.Atoi(f[2])
	return ppid == os.Getpid() && pgrp == pid
}

// watchGroupKills makes every group signal of the runner check first that
// the group's leader is still an unreaped child of ours, and returns the
// signals sent to a group whose leader was already reaped (a pid the kernel
// may have handed to an unrelated process group).
func watchGroupKills(t *testing.T) func() []string {
	t.Helper()
	var mu sync.Mutex
	var bad []string
	orig := groupKill
	groupKill = func(pgid int, sig syscall.Signal) error {
		if !isOurChild(pgid) {
			mu.Lock()
			bad = append(bad, fmt.Sprintf("kill(-%d, %v) after the child was reaped", pgid, sig))
			mu.Unlock()
		}
		return orig(pgid, sig)
	}
	t.Cleanup(func() { groupKill = orig })
	return func() []string { // and forget them
		mu.Lock()
		defer mu.Unlock()
		b := slices.Clone(bad)
		bad = bad[:0]
		return b
	}
}

// The runner signals a provider's process group only while the provider is
// not reaped: after wait4 its pid (the group id) may be reused (issue 9).
func TestGroupSignalledOnlyBeforeReap(t *testing.T) {
	bad := watchGroupKills(t)
	tests := []struct {
		name    string
		mode    string
		timeout time.Duration
		cancel  bool
	}{
		{"exit 0", "ok", 0, false},
		{"exit 1", "fail", 0, false},
		{"killed by a signal", "signal", 0, false},
		{"timeout", "hang", 200 * time.Millisecond, false},
		{"cancel", "hang", 0, true},
		{"grandchild left", "ok-grandchild", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var extra []string
			if strings.HasSuffix(tc.mode, "-grandchild") {
				extra = []string{filepath.Join(t.TempDir(), "gc.pid")}
			}
			r := helper(tc.mode, extra...)
			if tc.timeout > 0 {
				r.Timeout = tc.timeout
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				time.AfterFunc(200*time.Millisecond, cancel)
			}
			r.RunFile(ctx, "t", "m", "s")
			if extra != nil {
				gc := readPID(t, extra[0])
				obtest.WaitFor(t, 10*time.Second, "the grandchild to die", func() bool { return obtest.Gone(gc) })
			}
			if b := bad(); len(b) > 0 {
				t.Fatalf("%d group signals after reaping: %q", len(b), b)
			}
		})
	}
	// A provider that exits just as its deadline fires: the deadline's kill
	// must not land after the reap either.
	for i := range 20 {
		r := helper("ok")
		r.Timeout = time.Duration(5+i) * time.Millisecond
		r.RunFile(context.Background(), "t", "m", "s")
	}
	if b := bad(); len(b) > 0 {
		t.Fatalf("%d group signals after reaping: %q", len(b), b)
	}
}

// memfdHolders lists the processes holding an fd of a memfd named name.
func memfdHolders(name string) []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/fd")
	for _, dir := range procs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if l, _ := os.Readlink(filepath.Join(dir, e.Name())); strings.HasPrefix(l, "/memfd:"+name+" ") || l == "/memfd:"+name {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// kill -9 of the daemon leaves no provider and no memfd holder behind
// (issue 10, "no orphan, ever"): the provider dies with the daemon.
func TestProviderDiesWithDaemon(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "provider.pid")
	name := fmt.Sprintf("onebit-orphan-test-%d", os.Getpid())
	daemon := exec.Command(os.Args[0], "-helper", "daemon", pidFile, name)
	var stderr obtest.Buffer
	daemon.Stderr = &stderr
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			daemon.Process.Kill()
			daemon.Wait()
		}
	})
	prov := readPID(t, pidFile)
	t.Cleanup(func() {
		if !obtest.Gone(prov) {
			syscall.Kill(prov, syscall.SIGKILL) // the orphan this test found
		}
	})
	obtest.WaitFor(t, 10*time.Second, "the provider to hold the region memfd", func() bool {
		return slices.Contains(memfdHolders(name), prov)
	})
	if err := daemon.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	daemon.Wait()
	waited = true
	obtest.WaitFor(t, 10*time.Second, "the provider to die with the daemon", func() bool { return obtest.Gone(prov) })
	obtest.WaitFor(t, 10*time.Second, "no process to hold the region memfd", func() bool { return len(memfdHolders(name)) == 0 })
}
