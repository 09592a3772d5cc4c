package providersim

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
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/internal/simkv"
)

// simBin is the onebit-provider-sim binary built by TestMain.
var simBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "providersim-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	simBin = filepath.Join(dir, "onebit-provider-sim")
	out, err := exec.Command("go", "build", "-o", simBin, "github.com/onebitd/onebitd/cmd/onebit-provider-sim").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build onebit-provider-sim: %v\n%s", err, out)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return code
}

type simRun struct {
	code     int
	lastLine string
	elapsed  time.Duration
}

// runSim runs the binary with args and files inherited at fd 3+i; ctx may
// kill it.
func runSim(t *testing.T, ctx context.Context, files []*os.File, args ...string) simRun {
	t.Helper()
	cmd := exec.CommandContext(ctx, simBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.ExtraFiles = files
	start := time.Now()
	err := cmd.Run()
	r := simRun{code: cmd.ProcessState.ExitCode(), elapsed: time.Since(start)}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run %v: %v", args, err)
	}
	lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
	r.lastLine = lines[len(lines)-1]
	if r.code != 0 && len(lines) != 1 {
		t.Errorf("stderr has %d lines, want one: %q", len(lines), stderr.String())
	}
	return r
}

func writeTokens(t *testing.T, dir string, content string) string {
	t.Helper()
	p := filepath.Join(dir, "req.tokens")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func tokensJSON(tokens []int) string {
	s := make([]string, len(tokens))
	for i, t := range tokens {
		s[i] = fmt.Sprint(t)
	}
	return "[" + strings.Join(s, ",") + "]"
}

func TestSimFileRoute(t *testing.T) {
	dir := t.TempDir()
	modelPath, model := writeModel(t, dir, "a")
	tokens := simkv.Tokenize("the decoder and the prefill share a cache", true)
	good := writeTokens(t, dir, tokensJSON(tokens))
	tests := []struct {
		name     string
		tokens   string // file content; "" = the good file
		flags    []string
		code     int
		lastLine string // prefix
		written  bool
	}{
		{name: "ok", written: true},
		{name: "slow", flags: []string{"--slow", "50ms"}, written: true},
		{name: "compact", flags: []string{"--compact"}, written: true},
		{name: "start is for the shared route", flags: []string{"--start", "1"}, code: 2, lastLine: "bad command line: --start is for the shared route"},
		{name: "write then fail", flags: []string{"--write-then-fail"}, code: 1, lastLine: "simulated failure after writing", written: true},
		{name: "fail", flags: []string{"--fail"}, code: 1, lastLine: "simulated failure"},
		{name: "fail exit code", flags: []string{"--fail", "--exit-code", "9"}, code: 9, lastLine: "simulated failure"},
		{name: "empty tokens", tokens: "[]", code: 2, lastLine: "invalid tokens file"},
		{name: "bad token", tokens: "[1, 5000]", code: 2, lastLine: "invalid tokens file"},
		{name: "not json", tokens: "hello", code: 2, lastLine: "invalid tokens file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tokFile := good
			if tc.tokens != "" {
				tokFile = writeTokens(t, t.TempDir(), tc.tokens)
			}
			out := filepath.Join(t.TempDir(), "slot0.bin")
			args := append(append([]string{}, tc.flags...), "--tokens", tokFile, "--model", modelPath, "--state", out)
			r := runSim(t, context.Background(), nil, args...)
			if r.code != tc.code || !strings.HasPrefix(r.lastLine, tc.lastLine) {
				t.Fatalf("exit %d, last line %q; want %d, %q", r.code, r.lastLine, tc.code, tc.lastLine)
			}
			if tc.written {
				g := &DefaultGeometry
				if slices.Contains(tc.flags, "--compact") {
					g = nil
				}
				checkStateFile(t, out, model, tokens, g)
			} else if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("state file exists after a failure: %v", err)
			}
			if _, err := os.Stat(out + ".tmp"); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("temporary file left: %v", err)
			}
		})
	}
}

func TestSimSharedRoute(t *testing.T) {
	dir := t.TempDir()
	modelPath, model := writeModel(t, dir, "a")
	otherPath, _ := writeModel(t, dir, "b")
	tokens := simkv.Tokenize("the token of the slot is in the cache", true)
	tokFile := writeTokens(t, dir, tokensJSON(tokens))
	long := make([]int, 65)
	for i := range long {
		long[i] = simkv.WordBase
	}
	longFile := writeTokens(t, t.TempDir(), tokensJSON(long))

	tests := []struct {
		name     string
		g        geometry
		model    string
		tokens   string
		flags    []string
		code     int
		lastLine string
		written  bool
	}{
		{name: "fd per region", g: defaultGeometry, written: true},
		{name: "compact", g: defaultGeometry, flags: []string{"--compact"}, written: true},
		{name: "packed", g: geometry{nCtx: 64, nLayer: 2, stride: 2048, packed: true}, written: true},
		{name: "many layers small stride", g: geometry{nCtx: 256, nLayer: 4, stride: 64}, written: true},
		{name: "write then fail", g: defaultGeometry, flags: []string{"--write-then-fail"}, code: 1, lastLine: "simulated failure after writing", written: true},
		{name: "layout mismatch", g: defaultGeometry, model: otherPath, code: 2, lastLine: "layout hash mismatch: decoder "},
		{name: "too many tokens", g: defaultGeometry, tokens: longFile, code: 2, lastLine: "the shared regions cannot hold the prompt: 65 tokens"},
		{name: "fail", g: defaultGeometry, flags: []string{"--fail"}, code: 1, lastLine: "simulated failure"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, files := makeShare(t, model, tc.g)
			layout := filepath.Join(t.TempDir(), "req.json")
			if err := os.WriteFile(layout, headerJSON(t, h), 0o600); err != nil {
				t.Fatal(err)
			}
			fds := make([]string, len(files))
			for i := range files {
				fds[i] = fmt.Sprint(3 + i)
			}
			m, tf := modelPath, tokFile
			if tc.model != "" {
				m = tc.model
			}
			if tc.tokens != "" {
				tf = tc.tokens
			}
			args := append(append([]string{}, tc.flags...), "--tokens", tf, "--model", m, "--layout", layout, "--fds", strings.Join(fds, ","))
			r := runSim(t, context.Background(), files, args...)
			if r.code != tc.code || !strings.HasPrefix(r.lastLine, tc.lastLine) {
				t.Fatalf("exit %d, last line %q; want %d, %q", r.code, r.lastLine, tc.code, tc.lastLine)
			}
			if tc.name == "layout mismatch" {
				_, other := writeModel(t, dir, "b")
				want := fmt.Sprintf("layout hash mismatch: decoder %s, provider model %s", h.LayoutHash, LayoutHash(other, &h))
				if r.lastLine != want {
					t.Fatalf("last line %q, want %q", r.lastLine, want)
				}
			}
			full := !slices.Contains(tc.flags, "--compact")
			if tc.written {
				checkShared(t, h, files, model, tokens, full)
			} else {
				checkShared(t, h, files, model, nil, full) // untouched: all zero
			}
		})
	}
}

func TestSimHangIsKillable(t *testing.T) {
	dir := t.TempDir()
	modelPath, _ := writeModel(t, dir, "a")
	tokFile := writeTokens(t, dir, "[1]")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r := runSim(t, ctx, nil, "--hang", "--tokens", tokFile, "--model", modelPath, "--state", filepath.Join(dir, "s.bin"))
	if r.code != -1 || r.elapsed < 300*time.Millisecond {
		t.Fatalf("exit %d after %v; want killed (-1) after the 300ms deadline", r.code, r.elapsed)
	}
}

func TestSimHangEndsOnSIGTERM(t *testing.T) {
	dir := t.TempDir()
	modelPath, _ := writeModel(t, dir, "a")
	tokFile := writeTokens(t, dir, "[1]")
	cmd := exec.Command(simBin, "--hang", "--tokens", tokFile, "--model", modelPath, "--state", filepath.Join(dir, "s.bin"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// SIGTERM until the process reports it (the first may arrive before the
	// handler is installed, which kills it: also acceptable).
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-done:
			ws := cmd.ProcessState
			if ws.ExitCode() == 1 && strings.Contains(stderr.String(), "hang interrupted by a signal") {
				return
			}
			if ws.ExitCode() == -1 { // killed by SIGTERM before the handler
				return
			}
			t.Fatalf("exit %v, stderr %q", ws, stderr.String())
		case <-tick.C:
			cmd.Process.Signal(os.Interrupt)
		case <-deadline:
			cmd.Process.Kill()
			<-done
			t.Fatal("--hang did not end on SIGINT")
		}
	}
}

// TestSimTimeKnobs: --fixed-ms F --ms-per-token T make a run take at least
// F + T x tokens.
func TestSimTimeKnobs(t *testing.T) {
	dir := t.TempDir()
	modelPath, _ := writeModel(t, dir, "a")
	tokFile := writeTokens(t, dir, "[1,1000,1001,1002,1003,1004,1005,1006,1007,1008]")
	r := runSim(t, context.Background(), nil, "--fixed-ms", "40", "--ms-per-token", "3", "--compact",
		"--tokens", tokFile, "--model", modelPath, "--state", filepath.Join(dir, "s.bin"))
	if r.code != 0 || r.elapsed < 70*time.Millisecond {
		t.Fatalf("exit %d after %v, want 0 after at least 70ms", r.code, r.elapsed)
	}
	if r := runSim(t, context.Background(), nil, "--fixed-ms", "-1", "--tokens", tokFile, "--model", modelPath, "--state", filepath.Join(dir, "s.bin")); r.code != 2 {
		t.Fatalf("negative --fixed-ms: exit %d %q", r.code, r.lastLine)
	}
}

// sealedMemfd is a memfd holding data, sealed against writes (DESIGN §2b).
func sealedMemfd(t *testing.T, data []byte) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("provider-input", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "provider-input")
	t.Cleanup(func() { f.Close() })
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_GROW|unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestSimProcFDPaths (DESIGN §2b): tokens and layout arrive as sealed memfds
// named /proc/self/fd/N; the provider opens them as paths, unchanged.
func TestSimProcFDPaths(t *testing.T) {
	modelPath, model := writeModel(t, t.TempDir(), "a")
	tokens := simkv.Tokenize("the cache of the slot", true)
	h, regions := makeShare(t, model, defaultGeometry)
	files := append(append([]*os.File{}, regions...), sealedMemfd(t, []byte(tokensJSON(tokens))), sealedMemfd(t, headerJSON(t, h)))
	n := len(regions)
	fds := make([]string, n)
	for i := range fds {
		fds[i] = fmt.Sprint(3 + i)
	}
	r := runSim(t, context.Background(), files, "--tokens", fmt.Sprintf("/proc/self/fd/%d", 3+n), "--model", modelPath,
		"--layout", fmt.Sprintf("/proc/self/fd/%d", 4+n), "--fds", strings.Join(fds, ","))
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.lastLine)
	}
	checkShared(t, h, regions, model, tokens, true)
}
