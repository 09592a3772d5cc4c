package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/provjob"
)

func startWarm(t *testing.T, mode string, timeout time.Duration) (*Warm, *event.Mem, WarmConfig) {
	t.Helper()
	sink := &event.Mem{}
	cfg := WarmConfig{Path: os.Args[0], Socket: filepath.Join(t.TempDir(), "provider.sock"), Timeout: timeout,
		StartTimeout: 10 * time.Second, Sink: sink}
	if mode != "" {
		cfg.Args = []string{"-start", mode}
	}
	w, err := StartWarm(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Stop() })
	return w, sink, cfg
}

func sharedJob(model string) *provjob.Job {
	return &provjob.Job{Version: 1, Route: "shared", Tokens: []int{1, 2, 3}, Model: model, Layout: []byte(`{"version":1}`)}
}

func eventNames(m *event.Mem) []string {
	var names []string
	for _, e := range m.Events() {
		names = append(names, e.Event)
	}
	return names
}

// Jobs a provider answers: success on both routes, a failure it reports
// itself (it stays up), and jobs refused before anything is sent.
func TestWarmJobs(t *testing.T) {
	w, _, _ := startWarm(t, "", 10*time.Second)
	pid := w.PID()
	region := memfd(t, "region")
	tests := []struct {
		name   string
		job    *provjob.Job
		files  []*os.File
		kind   error
		exit   int
		reason string
	}{
		{"shared ok", sharedJob("m.gguf"), []*os.File{region}, nil, 0, ""},
		{"file ok", &provjob.Job{Version: 1, Route: "file", Tokens: []int{1}, Model: "m.gguf", State: "/slots/x.bin"}, nil, nil, 0, ""},
		{"reported failure", sharedJob("fail"), []*os.File{region}, ErrProviderFailed, 1, "provider failed: simulated failure"},
		{"invalid job", sharedJob("m.gguf"), nil, ErrProviderStart, -1, "provider job not sent: provjob: the job's fds do not match its route: a shared job without region fds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := w.Run(context.Background(), tc.job, tc.files)
			if tc.kind == nil && err != nil || tc.kind != nil && !errors.Is(err, tc.kind) {
				t.Fatalf("err %v, want %v", err, tc.kind)
			}
			if res.ExitCode != tc.exit || res.Reason != tc.reason || (err != nil && err.Error() != tc.reason) {
				t.Fatalf("result %+v err %v, want exit %d reason %q", res, err, tc.exit, tc.reason)
			}
		})
	}
	if w.PID() != pid {
		t.Fatalf("the provider was restarted (%d -> %d) though every job was answered", pid, w.PID())
	}
	if _, err := region.Stat(); err != nil {
		t.Fatalf("the caller's region fd was closed: %v", err)
	}
}

// A job past its deadline, a provider that dies mid-job, an invalid reply
// and a cancellation: the provider's process group is dead when Run
// returns (no write lands after the fallback), and a new provider serves.
func TestWarmKillBeforeReturn(t *testing.T) {
	tests := []struct {
		model  string
		cancel bool
		kind   error
		reason string
	}{
		{"hang", false, ErrProviderTimeout, "provider timed out after 300ms (process group killed)"},
		{"hang", true, ErrProviderCanceled, "provider cancelled (process group killed)"},
		{"die", false, ErrProviderLost, ""},
		{"garbage", false, ErrProviderLost, "the warm provider did not answer the job: provjob: the provider's reply is not valid"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s cancel=%v", tc.model, tc.cancel), func(t *testing.T) {
			w, sink, _ := startWarm(t, "", 300*time.Millisecond)
			if tc.cancel {
				w.cfg.Timeout = 0
			}
			pid := w.PID()
			region := memfd(t, "clean")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				time.AfterFunc(200*time.Millisecond, cancel)
			}
			res, err := w.Run(ctx, sharedJob(tc.model), []*os.File{region})
			gone := obtest.Gone(pid) // at once, not polled: the invariant
			if !errors.Is(err, tc.kind) || res.ExitCode != -1 {
				t.Fatalf("err %v res %+v, want %v", err, res, tc.kind)
			}
			if tc.reason != "" && !strings.HasPrefix(err.Error(), tc.reason) || !strings.HasSuffix(err.Error(), "(process group killed)") {
				t.Fatalf("reason %q, want %q…(process group killed)", err, tc.reason)
			}
			if !gone {
				t.Fatalf("provider %d still alive when Run returned", pid)
			}
			var before [8]byte
			region.ReadAt(before[:], 0)
			// Restarted: the supervisor has seen the exit and the new
			// provider is ready (its events say so; a PID alone can be read
			// before the supervisor handled the exit).
			want := []string{EventWarmStarting, EventWarmReady, EventWarmExited, EventWarmStarting, EventWarmReady}
			obtest.WaitFor(t, 20*time.Second, "a restarted provider", func() bool {
				return slices.Equal(eventNames(sink), want) && w.Ready() == nil && w.PID() != 0 && w.PID() != pid
			})
			var after [8]byte
			region.ReadAt(after[:], 0)
			if before != after {
				t.Fatalf("the region changed after Run returned: %q -> %q", before, after)
			}
			if _, err := w.Run(context.Background(), sharedJob("m.gguf"), []*os.File{region}); err != nil {
				t.Fatalf("a job on the restarted provider: %v", err)
			}
			if got := eventNames(sink); !slices.Equal(got, want) {
				t.Fatalf("events %v, want %v", got, want)
			}
			// A provider that died by itself may be seen exiting before Run kills it.
			if r := sink.Events()[2].Reason; !strings.HasPrefix(r, "killed by onebitd: ") && !(tc.model == "die" && r == "exit status 3") {
				t.Fatalf("exited reason %q", r)
			}
		})
	}
}

func TestWarmConcurrentJobs(t *testing.T) {
	w, _, _ := startWarm(t, "", 10*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			region := memfd(t, fmt.Sprint(i))
			if _, err := w.Run(context.Background(), sharedJob("m.gguf"), []*os.File{region}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestWarmStartFailures(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		mode   string
		kind   error
		substr string
	}{
		{"crash", ErrWarmExited, "exit status 2; its last stderr lines:\ncannot load the model"},
		{"never-listen", ErrWarmStalled, "its socket did not accept within 300ms"},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			sink := &event.Mem{}
			_, err := StartWarm(context.Background(), WarmConfig{Path: os.Args[0], Args: []string{"-start", tc.mode},
				Socket: filepath.Join(dir, tc.mode+".sock"), StartTimeout: 300 * time.Millisecond, StopGrace: time.Second, Sink: sink})
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("err %v, want %v with %q", err, tc.kind, tc.substr)
			}
			if got := eventNames(sink); !slices.Equal(got, []string{EventWarmStarting, EventWarmExited}) {
				t.Fatalf("events %v", got)
			}
		})
	}
	if _, err := StartWarm(context.Background(), WarmConfig{Path: filepath.Join(dir, "missing"), Socket: filepath.Join(dir, "m.sock")}); !errors.Is(err, ErrProviderStart) {
		t.Fatalf("missing binary: %v", err)
	}
}

func TestWarmStop(t *testing.T) {
	w, _, cfg := startWarm(t, "", time.Second)
	pid := w.PID()
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	if !obtest.Gone(pid) {
		t.Fatalf("provider %d alive after Stop", pid)
	}
	if _, err := os.Lstat(cfg.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after Stop: %v", err)
	}
	_, err := w.Run(context.Background(), sharedJob("m.gguf"), []*os.File{memfd(t, "x")})
	if !errors.Is(err, ErrProviderNotReady) || err.Error() != "the warm provider is stopped" {
		t.Fatalf("Run after Stop: %v", err)
	}
	if err := w.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

// kill -9 of the daemon with a job in flight leaves no warm provider and no
// memfd holder (issue 10).
func TestWarmProviderDiesWithDaemon(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "provider.pid")
	name := fmt.Sprintf("onebit-warm-orphan-test-%d", os.Getpid())
	daemon := exec.Command(os.Args[0], "-helper", "warm-daemon", pidFile, filepath.Join(dir, "provider.sock"), name)
	var stderr bytes.Buffer
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
			syscall.Kill(prov, syscall.SIGKILL)
		}
	})
	obtest.WaitFor(t, 10*time.Second, "the warm provider to hold the region memfd", func() bool {
		return slices.Contains(memfdHolders(name), prov)
	})
	daemon.Process.Signal(syscall.SIGKILL)
	daemon.Wait()
	waited = true
	obtest.WaitFor(t, 10*time.Second, "the warm provider to die with the daemon", func() bool { return obtest.Gone(prov) })
	obtest.WaitFor(t, 10*time.Second, "no process to hold the region memfd", func() bool { return len(memfdHolders(name)) == 0 })
}
