package benchharness

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Machine describes where the numbers were taken.
type Machine struct {
	CPU      string
	Cores    int
	MemBytes int64
	Go       string
	Kernel   string
	Date     time.Time
	Load     string // /proc/loadavg at the start: other users of the machine
}

// DescribeMachine reads /proc for the CPU model, memory and load.
func DescribeMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.CPU = cpuModel(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m.MemBytes = memTotal(string(b))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			m.Load = strings.Join(f[:3], " ")
		}
	}
	if m.CPU == "" {
		m.CPU = runtime.GOARCH
	}
	return m
}

// cpuModel is the first "model name" of a /proc/cpuinfo text.
func cpuModel(cpuinfo string) string {
	for line := range strings.SplitSeq(cpuinfo, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// memTotal is MemTotal of a /proc/meminfo text, in bytes.
func memTotal(meminfo string) int64 {
	for line := range strings.SplitSeq(meminfo, "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
