package provider

import (
	"fmt"
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseOnExecInherited sets close-on-exec on every fd from 3 up. Go opens
// every fd close-on-exec, but fds this process inherited without the flag
// (from a shell, a supervisor) would otherwise reach every provider next to
// its region fds. Call it once at the start of the daemon, before starting
// goroutines that exec.
func CloseOnExecInherited() error {
	err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	// Kernels before 5.11: walk /proc/self/fd.
	ents, rerr := os.ReadDir("/proc/self/fd")
	if rerr != nil {
		return fmt.Errorf("provider: set close-on-exec on inherited fds: %w (close_range: %v)", rerr, err)
	}
	for _, e := range ents {
		fd, cerr := strconv.Atoi(e.Name())
		if cerr != nil || fd < 3 {
			continue
		}
		unix.CloseOnExec(fd) // the fd of the directory listing itself is already closed: harmless
	}
	return nil
}
