package launcher

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/internal/obtest"
)

// unreapedChild reports whether pid is an unreaped child of this process
// (running or a zombie) leading its own process group.
func unreapedChild(pid int) bool {
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

// The launcher signals the decoder's process group only while the decoder
// is not reaped: after wait4 its pid (the group id) may belong to another
// process (issue 9). Covers the exit the supervisor sees (kill -9, then a
// restart) and Stop.
func TestGroupSignalledOnlyBeforeReap(t *testing.T) {
	var mu sync.Mutex
	var late []string
	orig := groupKill
	groupKill = func(pgid int, sig syscall.Signal) error {
		if !unreapedChild(pgid) {
			mu.Lock()
			late = append(late, fmt.Sprintf("kill(-%d, %v)", pgid, sig))
			mu.Unlock()
		}
		return orig(pgid, sig)
	}
	t.Cleanup(func() { groupKill = orig })

	cfg, _ := config(t)
	d := start(t, cfg)
	pid := d.PID()
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	obtest.WaitFor(t, 20*time.Second, "a restarted decoder", func() bool {
		return d.Ready() == nil && d.PID() != 0 && d.PID() != pid
	})
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(late) > 0 {
		t.Fatalf("group signals after the decoder was reaped: %q", slices.Clone(late))
	}
}
