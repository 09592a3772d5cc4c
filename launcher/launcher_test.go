package launcher

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
)

// simBin is the onebit-decoder-sim binary built by TestMain.
var simBin string

const helperEnv = "LAUNCHER_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(parentHelper())
	}
	dir, err := os.MkdirTemp("", "launcher-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	simBin = filepath.Join(dir, "onebit-decoder-sim")
	out, err := exec.Command("go", "build", "-o", simBin, "github.com/onebitd/onebitd/cmd/onebit-decoder-sim").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build onebit-decoder-sim: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// parentHelper is the re-exec'd "onebitd": it starts a decoder, prints its
// pid and waits to be killed.
func parentHelper() int {
	dir := os.Getenv("LAUNCHER_TEST_DIR")
	d, err := Start(context.Background(), Config{
		Bin:     os.Getenv("LAUNCHER_TEST_BIN"),
		Model:   filepath.Join(dir, "model.gguf"),
		SlotDir: dir,
		Slots:   1,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(d.PID())
	select {}
}

// config is a Config for the simulator with its files in a temp dir.
func config(t *testing.T, args ...string) (Config, *event.Mem) {
	t.Helper()
	dir := t.TempDir()
	model := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(model, []byte("sim model for launcher tests"), 0o600); err != nil {
		t.Fatal(err)
	}
	slots := filepath.Join(dir, "slots")
	if err := os.Mkdir(slots, 0o700); err != nil {
		t.Fatal(err)
	}
	sink := &event.Mem{}
	return Config{
		Bin:          simBin,
		Args:         args,
		Model:        model,
		SlotDir:      slots,
		Slots:        2,
		StallTimeout: 20 * time.Second,
		StopGrace:    5 * time.Second,
		Sink:         sink,
		Logger:       slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}, sink
}

// testWriter sends log output to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func health(url string) int {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := c.Get(url + "/health")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func eventNames(m *event.Mem) []string {
	var names []string
	for _, e := range m.Events() {
		names = append(names, e.Event)
	}
	return names
}

func start(t *testing.T, cfg Config) *Decoder {
	t.Helper()
	d, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop() })
	return d
}

func TestStartReady(t *testing.T) {
	cfg, sink := config(t)
	d := start(t, cfg)
	if err := d.Ready(); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	if !strings.HasPrefix(d.URL(), "http://127.0.0.1:") {
		t.Errorf("URL %q", d.URL())
	}
	if got := health(d.URL()); got != 200 {
		t.Errorf("/health %d", got)
	}
	pid := d.PID()
	if pid <= 0 {
		t.Fatalf("PID %d", pid)
	}
	// Its own process group.
	if pgid, err := unix.Getpgid(pid); err != nil || pgid != pid {
		t.Errorf("pgid %d (%v), want %d", pgid, err, pid)
	}
	if got := eventNames(sink); strings.Join(got, ",") != EventStarting+","+EventReady {
		t.Errorf("events %v", got)
	}
	for _, e := range sink.Events() {
		if e.RequestID != "" {
			t.Errorf("event %s has request id %q", e.Event, e.RequestID)
		}
	}
}

func TestLoadingDelay(t *testing.T) {
	const delay = 600 * time.Millisecond
	cfg, _ := config(t, "--loading-delay", delay.String())
	t0 := time.Now()
	d := start(t, cfg)
	if el := time.Since(t0); el < delay {
		t.Errorf("ready after %s, before the loading delay %s", el, delay)
	}
	if got := health(d.URL()); got != 200 {
		t.Errorf("/health %d after Start", got)
	}
}

func TestStall(t *testing.T) {
	cfg, _ := config(t, "--loading-delay", "1h")
	cfg.StallTimeout = 400 * time.Millisecond
	_, err := Start(context.Background(), cfg)
	if !errors.Is(err, ErrStalled) {
		t.Fatalf("err %v, want ErrStalled", err)
	}
	if !strings.Contains(err.Error(), "Loading model") {
		t.Errorf("error does not say what /health answered: %v", err)
	}
}

func writeScript(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "decoder.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestExitsAtOnce(t *testing.T) {
	tests := []struct {
		name string
		bin  func(t *testing.T) string
		args []string
		want error
		says []string
	}{
		{
			name: "script exits 1",
			bin: func(t *testing.T) string {
				return writeScript(t, "echo 'error: failed to load model' >&2\necho 'main: exiting due to model loading error' >&2\nexit 1\n")
			},
			want: ErrExited,
			says: []string{"exit status 1", "failed to load model", "exiting due to model loading error"},
		},
		{
			name: "simulator refuses a flag",
			bin:  func(*testing.T) string { return simBin },
			args: []string{"--no-such-flag"},
			want: ErrExited,
			says: []string{"no-such-flag"},
		},
		{
			name: "killed by a signal",
			bin:  func(t *testing.T) string { return writeScript(t, "echo bye >&2\nkill -9 $$\n") },
			want: ErrExited,
			says: []string{"signal: killed", "bye"},
		},
		{
			name: "no such binary",
			bin:  func(t *testing.T) string { return filepath.Join(t.TempDir(), "missing") },
			says: []string{"no such file"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, sink := config(t, tt.args...)
			cfg.Bin = tt.bin(t)
			t0 := time.Now()
			_, err := Start(context.Background(), cfg)
			if err == nil {
				t.Fatal("Start succeeded")
			}
			if el := time.Since(t0); el > 5*time.Second {
				t.Errorf("took %s to fail", el)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("err %v, want %v", err, tt.want)
			}
			for _, s := range tt.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error lacks %q:\n%v", s, err)
				}
			}
			if got := eventNames(sink); strings.Join(got, ",") != EventStarting+","+EventExited {
				t.Errorf("events %v", got)
			}
		})
	}
}

func TestConfigRefused(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
	}{
		{"no binary", func(c *Config) { c.Bin = "" }},
		{"no slot dir", func(c *Config) { c.SlotDir = "" }},
		{"no slots", func(c *Config) { c.Slots = 0 }},
		{"user --port", func(c *Config) { c.Args = []string{"--port", "9"} }},
		{"user --host=", func(c *Config) { c.Args = []string{"--host=0.0.0.0"} }},
		{"user -np", func(c *Config) { c.Args = []string{"-np", "4"} }},
		{"user --slot-save-path", func(c *Config) { c.Args = []string{"--slot-save-path", "/tmp"} }},
		{"user -m with Model", func(c *Config) { c.Args = []string{"-m", "x.gguf"} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, _ := config(t)
			tt.edit(&cfg)
			if _, err := Start(context.Background(), cfg); !errors.Is(err, ErrConfig) {
				t.Fatalf("err %v, want ErrConfig", err)
			}
		})
	}
}

func TestArgv(t *testing.T) {
	c := Config{Host: "127.0.0.1", Model: "/m.gguf", SlotDir: "/s", Slots: 3, Args: []string{"-c", "8192", "-fa", "off"}}
	got := strings.Join(c.argv(4242), " ")
	want := "--host 127.0.0.1 --port 4242 -m /m.gguf --slot-save-path /s -np 3 -c 8192 -fa off"
	if got != want {
		t.Errorf("argv\n got %s\nwant %s", got, want)
	}
	c.Model = ""
	if got := strings.Join(c.argv(1), " "); strings.Contains(got, "-m") {
		t.Errorf("argv without a model: %s", got)
	}
}

func TestRestartAfterKill(t *testing.T) {
	cfg, sink := config(t)
	d := start(t, cfg)
	url, pid := d.URL(), d.PID()
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Either we catch the restarting state, or the exited event proves it
	// happened; Ready must never hang.
	obtest.WaitFor(t, 10*time.Second, "the exited event", func() bool {
		for _, n := range eventNames(sink) {
			if n == EventExited {
				return true
			}
		}
		return false
	})
	killed := time.Now()
	obtest.WaitFor(t, 20*time.Second, "a new ready decoder", func() bool {
		return d.Ready() == nil && d.PID() != 0 && d.PID() != pid
	})
	t.Logf("ready again %s after kill -9", time.Since(killed).Round(time.Millisecond))
	if d.URL() != url {
		t.Errorf("URL changed: %s → %s", url, d.URL())
	}
	if got := health(url); got != 200 {
		t.Errorf("/health %d on the same URL after restart", got)
	}
	if !obtest.Gone(pid) {
		t.Errorf("old pid %d still runs", pid)
	}
	got := strings.Join(eventNames(sink), ",")
	want := strings.Join([]string{EventStarting, EventReady, EventExited, EventStarting, EventReady}, ",")
	if got != want {
		t.Errorf("events %s\nwant %s", got, want)
	}
	for _, e := range sink.Events() {
		if e.Event == EventExited && e.Reason != "signal: killed" {
			t.Errorf("exited reason %q", e.Reason)
		}
	}
}

func TestNotReadyWhileRestarting(t *testing.T) {
	// A decoder that takes long to load after a crash: Ready answers at once
	// with a readable error meanwhile.
	cfg, _ := config(t, "--loading-delay", "300ms")
	d := start(t, cfg)
	pid := d.PID()
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var nr *NotReadyError
	obtest.WaitFor(t, 10*time.Second, "Ready to report the restart", func() bool {
		err := d.Ready()
		return errors.As(err, &nr)
	})
	if !errors.Is(nr, ErrNotReady) || !strings.Contains(nr.Error(), "the decoder is restarting") {
		t.Errorf("Ready: %v", nr)
	}
	obtest.WaitFor(t, 20*time.Second, "ready again", func() bool { return d.Ready() == nil })
}

func TestStopLeavesNoProcess(t *testing.T) {
	cfg, _ := config(t)
	d, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	pid := d.PID()
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
		t.Errorf("kill(%d, 0) = %v after Stop, want ESRCH", pid, err)
	}
	if d.PID() != 0 {
		t.Errorf("PID %d after Stop", d.PID())
	}
	if err := d.Ready(); !errors.Is(err, ErrNotReady) {
		t.Errorf("Ready after Stop: %v", err)
	}
	if err := d.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestStopKillsWhenTERMIgnored(t *testing.T) {
	cfg, _ := config(t)
	// The shell ignores TERM and keeps running after the simulator (same
	// process group) got it: only the SIGKILL after the grace ends it.
	cfg.Bin = writeScript(t, "trap '' TERM\n'"+simBin+"' \"$@\"\nwhile :; do sleep 0.05; done\n")
	cfg.StopGrace = 300 * time.Millisecond
	d, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	pid := d.PID()
	t0 := time.Now()
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el < cfg.StopGrace {
		t.Errorf("Stop took %s, less than the grace: TERM was not ignored?", el)
	}
	if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
		t.Errorf("kill(%d, 0) = %v after Stop, want ESRCH", pid, err)
	}
	// The shell's sleep, killed with the group, is reaped by init.
	obtest.WaitFor(t, 5*time.Second, "the process group to be empty", func() bool {
		return errors.Is(unix.Kill(-pid, 0), unix.ESRCH)
	})
}

func TestContextBoundsStartOnly(t *testing.T) {
	// Ends while loading: Start returns at once and nothing runs.
	cfg, _ := config(t, "--loading-delay", "1h")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := Start(ctx, cfg); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want context.DeadlineExceeded", err)
	}
	if el := time.Since(t0); el > 5*time.Second {
		t.Errorf("took %s", el)
	}
	if kids := liveChildren(t); len(kids) > 0 {
		t.Errorf("children still running: %v", kids)
	}

	// Started: the end of ctx does not stop it (a server drains first).
	cfg2, _ := config(t)
	ctx2, cancel2 := context.WithCancel(context.Background())
	d, err := Start(ctx2, cfg2)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	cancel2()
	if got := health(d.URL()); got != 200 || d.Ready() != nil {
		t.Errorf("after ctx ended: /health %d, Ready %v", got, d.Ready())
	}
}

// liveChildren lists this process's children that are not zombies.
func liveChildren(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		_, after, ok := strings.Cut(string(b), ") ")
		f := strings.Fields(after)
		if ok && len(f) > 1 && f[0] != "Z" && f[1] == strconv.Itoa(os.Getpid()) {
			kids = append(kids, pid)
		}
	}
	return kids
}

func TestParentDeathKillsDecoder(t *testing.T) {
	cfg, _ := config(t)
	dir := filepath.Dir(cfg.Model) // holds model.gguf
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "LAUNCHER_TEST_BIN="+simBin, "LAUNCHER_TEST_DIR="+dir)
	cmd.Stderr = testWriter{t}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper printed no pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		t.Fatalf("helper printed %q", line)
	}
	if obtest.Gone(pid) {
		t.Fatalf("decoder %d not running", pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	obtest.WaitFor(t, 10*time.Second, fmt.Sprintf("decoder %d to die with its parent", pid), func() bool { return obtest.Gone(pid) })
}

// BenchmarkStartStop: spawn the simulator, wait for /health 200, stop it.
func BenchmarkStartStop(b *testing.B) {
	dir := b.TempDir()
	model := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(model, []byte("bench model"), 0o600); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		d, err := Start(context.Background(), Config{Bin: simBin, Model: model, SlotDir: dir, Slots: 1})
		if err != nil {
			b.Fatal(err)
		}
		_ = d.Stop()
	}
}
