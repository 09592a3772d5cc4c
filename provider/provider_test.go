package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/internal/obtest"
)

func helper(mode string, extra ...string) *Runner {
	return &Runner{Path: os.Args[0], Args: append([]string{"-helper", mode}, extra...), Timeout: 30 * time.Second}
}

func TestRunFile(t *testing.T) {
	tests := []struct {
		name     string
		mode     string
		kind     error
		exitCode int
		reason   string
	}{
		{"ok", "ok", nil, 0, ""},
		{"exit 1", "fail", ErrProviderExit, 1, "provider exited with status 1: simulated failure"},
		{"silent", "fail-silent", ErrProviderExit, 3, "provider exited with status 3 (no stderr output)"},
		{"carriage returns", "progress", ErrProviderExit, 4, "provider exited with status 4: last words"},
		{"long stderr", "long-stderr", ErrProviderExit, 1, "provider exited with status 1: " + strings.Repeat("x", MaxLineLen)},
		{"signal", "signal", ErrProviderExit, -1, "provider was killed by signal SIGTERM (no stderr output)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := helper(tc.mode).RunFile(context.Background(), "t.tokens", "m.gguf", "s.bin")
			if tc.kind == nil {
				if err != nil || res.ExitCode != 0 || res.Reason != "" {
					t.Fatalf("res %+v err %v", res, err)
				}
				return
			}
			if !errors.Is(err, tc.kind) {
				t.Fatalf("err %v, want %v", err, tc.kind)
			}
			if err.Error() != tc.reason || res.Reason != tc.reason {
				t.Fatalf("reason %q / %q, want %q", err.Error(), res.Reason, tc.reason)
			}
			if res.ExitCode != tc.exitCode || res.TimedOut {
				t.Fatalf("result %+v, want exit code %d", res, tc.exitCode)
			}
		})
	}
}

func TestRunStartFailure(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "provider")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "missing"), notExec} {
		r := &Runner{Path: path, Timeout: time.Second}
		res, err := r.RunFile(context.Background(), "t", "m", "s")
		if !errors.Is(err, ErrProviderStart) || !strings.HasPrefix(err.Error(), "provider could not start: ") {
			t.Fatalf("%s: err %v", path, err)
		}
		if res.ExitCode != -1 || res.Reason != err.Error() {
			t.Fatalf("%s: result %+v", path, res)
		}
	}
	if _, err := helper("ok").RunShared(context.Background(), "t", "m", "l", nil); !errors.Is(err, ErrProviderStart) {
		t.Fatalf("no fds: %v", err)
	}
	if _, err := helper("ok").RunShared(context.Background(), "t", "m", "l", []*os.File{nil}); !errors.Is(err, ErrProviderStart) ||
		err.Error() != "provider could not start: region fd 0 of 1 is missing" {
		t.Fatalf("nil fd: %v", err)
	}
}

func TestRunTimeoutKillsGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "gc.pid")
	r := helper("hang-grandchild", pidFile)
	r.Timeout = time.Second
	r.WaitDelay = 20 * time.Second // the group kill, not WaitDelay, must end the run
	res, err := r.RunFile(context.Background(), "t", "m", "s")
	if !errors.Is(err, ErrProviderTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want a timeout", err)
	}
	if want := "provider timed out after 1s (process group killed)"; err.Error() != want {
		t.Fatalf("reason %q, want %q", err, want)
	}
	if !res.TimedOut || res.ExitCode != -1 || res.Duration < time.Second || res.Duration > 10*time.Second {
		t.Fatalf("result %+v", res)
	}
	gc := readPID(t, pidFile)
	obtest.WaitFor(t, 10*time.Second, "the grandchild to die", func() bool { return obtest.Gone(gc) })
}

func TestRunCancelKillsGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "gc.pid")
	r := helper("hang-grandchild", pidFile)
	r.WaitDelay = 20 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	var gc int
	go func() {
		defer wg.Done()
		defer cancel()
		gc = readPID(t, pidFile)
	}()
	res, err := r.RunFile(ctx, "t", "m", "s")
	wg.Wait()
	if !errors.Is(err, ErrProviderCanceled) || !errors.Is(err, context.Canceled) || res.TimedOut {
		t.Fatalf("err %v res %+v, want a cancellation", err, res)
	}
	if err.Error() != "provider cancelled (process group killed)" {
		t.Fatalf("reason %q", err)
	}
	obtest.WaitFor(t, 10*time.Second, "the grandchild to die", func() bool { return obtest.Gone(gc) })
}

func TestRunParentDeadline(t *testing.T) {
	r := helper("hang")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	res, err := r.RunFile(ctx, "t", "m", "s")
	if !errors.Is(err, ErrProviderTimeout) || !res.TimedOut {
		t.Fatalf("err %v res %+v", err, res)
	}
	if err.Error() != "provider timed out at the request deadline (process group killed)" {
		t.Fatalf("reason %q", err)
	}
	// Already expired: no process is started.
	res, err = r.RunFile(ctx, "t", "m", "s")
	if !errors.Is(err, ErrProviderTimeout) || res.ExitCode != -1 {
		t.Fatalf("expired ctx: err %v res %+v", err, res)
	}
}

func TestRunGrandchildHoldsStderr(t *testing.T) {
	tests := []struct {
		mode   string
		kind   error
		reason string
	}{
		{"exit-grandchild", ErrProviderExit, "provider exited with status 1: left a child behind"},
		{"ok-grandchild", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "gc.pid")
			r := helper(tc.mode, pidFile)
			r.WaitDelay = 200 * time.Millisecond
			res, err := r.RunFile(context.Background(), "t", "m", "s")
			if tc.kind == nil && err != nil || tc.kind != nil && !errors.Is(err, tc.kind) {
				t.Fatalf("err %v, want %v", err, tc.kind)
			}
			if res.Reason != tc.reason || res.TimedOut {
				t.Fatalf("result %+v, want reason %q", res, tc.reason)
			}
			gc := readPID(t, pidFile)
			obtest.WaitFor(t, 10*time.Second, "the grandchild to die", func() bool { return obtest.Gone(gc) })
		})
	}
}

func memfd(t *testing.T, content string) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("region", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "region")
	t.Cleanup(func() { f.Close() })
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestRunSharedPassesExactlyTheFDs(t *testing.T) {
	// A file this process holds open but does not pass must not reach the child.
	memfd(t, "secret")
	for _, contents := range [][]string{{"alpha"}, {"alpha", "beta", "gamma"}} {
		t.Run(strings.Join(contents, "+"), func(t *testing.T) {
			report := filepath.Join(t.TempDir(), "report")
			var files []*os.File
			for _, c := range contents {
				files = append(files, memfd(t, c))
			}
			res, err := helper("fds", report).RunShared(context.Background(), "t.tokens", "m.gguf", "l.json", files)
			if err != nil {
				t.Fatalf("res %+v err %v", res, err)
			}
			b, err := os.ReadFile(report)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.SplitN(string(b), "\n", 2)
			var wantFDs, fdList []string
			for i, c := range contents {
				fd := 3 + i
				wantFDs = append(wantFDs, strings.Join([]string{strconv.Itoa(fd), c}, "="))
				fdList = append(fdList, strconv.Itoa(fd))
			}
			if lines[0] != strings.Join(wantFDs, ",") {
				t.Fatalf("child saw fds %q, want %q", lines[0], strings.Join(wantFDs, ","))
			}
			wantArgs := "--tokens t.tokens --model m.gguf --layout l.json --fds " + strings.Join(fdList, ",")
			if lines[1] != wantArgs {
				t.Fatalf("child args %q, want %q", lines[1], wantArgs)
			}
			// The caller still owns the files.
			for _, f := range files {
				if _, err := f.Stat(); err != nil {
					t.Fatalf("runner closed a passed file: %v", err)
				}
			}
		})
	}
}

// captureHandler records log records.
type captureHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r)
	return nil
}
func (h *captureHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *captureHandler) WithGroup(string) slog.Handler      { return h }

func TestRunLogsStderrLines(t *testing.T) {
	h := &captureHandler{}
	r := helper("fail")
	r.Logger = slog.New(h)
	if _, err := r.RunFile(context.Background(), "t", "m", "s"); err == nil {
		t.Fatal("want failure")
	}
	var lines []string
	for _, rec := range h.recs {
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "provider_stderr" {
				if rec.Level != slog.LevelDebug {
					t.Errorf("stderr line logged at %v", rec.Level)
				}
				lines = append(lines, a.Value.String())
			}
			return true
		})
	}
	if strings.Join(lines, "|") != "starting|simulated failure" {
		t.Fatalf("logged stderr lines %q", lines)
	}
}

func TestWriteTokens(t *testing.T) {
	dir := t.TempDir()
	for i, tokens := range [][]int{{1, 1000, 3}, {}, {-1, 1 << 40}} {
		p := filepath.Join(dir, strconv.Itoa(i)+".tokens")
		if err := WriteTokens(p, tokens); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		if err := json.Unmarshal(b, &got); err != nil || len(got) != len(tokens) {
			t.Fatalf("%s: %q -> %v, %v", p, b, got, err)
		}
		for j := range got {
			if got[j] != tokens[j] {
				t.Fatalf("%s: %v, want %v", p, got, tokens)
			}
		}
		if !bytes.HasPrefix(b, []byte("[")) {
			t.Fatalf("%q", b)
		}
		fi, _ := os.Stat(p)
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("mode %v", fi.Mode())
		}
		if err := WriteTokens(p, tokens); !errors.Is(err, fs.ErrExist) {
			t.Fatalf("existing file: %v", err)
		}
	}
}

func TestCloseOnExecInherited(t *testing.T) {
	// A pipe without close-on-exec, as a shell or supervisor might leave.
	var p [2]int
	if err := unix.Pipe2(p[:], 0); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	seen := func() string {
		report := filepath.Join(t.TempDir(), "report")
		if _, err := helper("fds", report).RunShared(context.Background(), "t", "m", "l", []*os.File{memfd(t, "alpha")}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(report)
		if err != nil {
			t.Fatal(err)
		}
		return strings.SplitN(string(b), "\n", 2)[0]
	}
	if got := seen(); !strings.Contains(got, strconv.Itoa(p[0])+"=") {
		t.Fatalf("child saw %q: the leak this guards against did not happen", got)
	}
	if err := CloseOnExecInherited(); err != nil {
		t.Fatal(err)
	}
	if got := seen(); got != "3=alpha" {
		t.Fatalf("child saw %q, want only 3=alpha", got)
	}
}
