package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buildSim builds this command into a temp dir.
func buildSim(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH")
	}
	bin := filepath.Join(t.TempDir(), "onebit-decoder-sim")
	out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// sim is a running simulator process.
type sim struct {
	cmd  *exec.Cmd
	url  string
	mu   sync.Mutex
	logs strings.Builder
	done chan struct{} // stderr drained
}

func (s *sim) stderr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logs.String()
}

// startSim runs the binary and waits for its "listening on" line.
func startSim(t *testing.T, bin string, args ...string) *sim {
	t.Helper()
	s := &sim{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	pipe, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s.cmd.ProcessState == nil {
			_ = s.cmd.Process.Kill()
			<-s.done
			_ = s.cmd.Wait()
		}
	})
	urlc := make(chan string, 1)
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			s.logs.WriteString(line + "\n")
			s.mu.Unlock()
			if u, ok := strings.CutPrefix(line, "onebit-decoder-sim listening on "); ok {
				urlc <- u
			}
		}
	}()
	select {
	case s.url = <-urlc:
	case <-s.done:
		_ = s.cmd.Wait()
		t.Fatalf("the simulator exited before listening:\n%s", s.stderr())
	case <-time.After(20 * time.Second):
		t.Fatalf("no listening line after 20s:\n%s", s.stderr())
	}
	return s
}

// wait waits for the process to exit and returns its exit code.
func (s *sim) wait(t *testing.T) int {
	t.Helper()
	<-s.done
	err := s.cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatal(err)
	return -1
}

func TestBinary(t *testing.T) {
	bin := buildSim(t)
	dir := t.TempDir()
	model := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(model, []byte("GGUF-SIM cmd test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startSim(t, bin, "--port", "0", "-m", model, "-c", "512", "-np", "2", "--slot-save-path", dir, "--token-delay", "10ms")
	client := &http.Client{Timeout: 20 * time.Second}
	defer client.CloseIdleConnections()

	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get(s.url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health not ok: %v\n%s", err, s.stderr())
		}
		time.Sleep(10 * time.Millisecond)
	}

	resp, err := client.Post(s.url+"/completion", "application/json", strings.NewReader(`{"prompt":"Hello the world","n_predict":4}`))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Content string
		Timings struct {
			PromptN int `json:"prompt_n"`
		}
	}
	err = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || c.Content == "" || c.Timings.PromptN == 0 {
		t.Fatalf("/completion: %d %v %+v", resp.StatusCode, err, c)
	}

	// SIGTERM during a stream: the stream finishes, then the process exits 0.
	resp, err = client.Post(s.url+"/completion", "application/json", strings.NewReader(`{"prompt":"Hello","n_predict":20,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if _, err := rd.ReadString('\n'); err != nil {
		t.Fatalf("first event: %v", err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	events := 1
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			break
		}
		if strings.HasPrefix(line, "data: ") {
			events++
		}
	}
	if events != 21 { // 20 tokens + the final event
		t.Errorf("stream cut by SIGTERM after %d events, want 21", events)
	}
	if code := s.wait(t); code != 0 {
		t.Errorf("exit code %d after SIGTERM\n%s", code, s.stderr())
	}
	if !strings.Contains(s.stderr(), "msg=stopped") {
		t.Errorf("no graceful stop logged:\n%s", s.stderr())
	}
}

func TestBinaryBadFlags(t *testing.T) {
	bin := buildSim(t)
	tests := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--frobnicate", "1"}, 2, "flag provided but not defined: -frobnicate"},
		{[]string{"-c", "512"}, 2, "-m/--model is required"},
		{[]string{"-m", "/nonexistent/model.gguf"}, 1, "cannot load model"},
	}
	for _, tc := range tests {
		out, err := exec.Command(bin, tc.args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != tc.code || !strings.Contains(string(out), tc.msg) {
			t.Errorf("%v: %v, output %q; want exit %d and %q", tc.args, err, out, tc.code, tc.msg)
		}
	}
}

// TestBinaryUnixSocket: --host PATH.sock listens on a unix socket created
// with the process umask (as llama-server does: the directory protects it),
// announces "listening on unix://PATH", and --api-key-file protects every
// endpoint but /health.
func TestBinaryUnixSocket(t *testing.T) {
	bin := buildSim(t)
	dir := t.TempDir()
	model := filepath.Join(dir, "model.gguf")
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(model, []byte("GGUF-SIM cmd test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keys, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "decoder.sock")
	s := startSim(t, bin, "--host", sock, "-m", model, "-c", "512", "--api-key-file", keys)
	if s.url != "unix://"+sock {
		t.Fatalf("listening on %q, want unix://%s", s.url, sock)
	}
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	umask := syscall.Umask(0)
	syscall.Umask(umask)
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != os.FileMode(0o777&^umask) {
		t.Errorf("socket mode %v, want a socket with %#o (umask %#o)", fi.Mode(), 0o777&^umask, umask)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	defer client.CloseIdleConnections()
	for _, tc := range []struct {
		path, key string
		status    int
	}{
		{"/health", "", 200},
		{"/props", "", 401},
		{"/props", "wrong", 401},
		{"/props", "s3cret", 200},
	} {
		req, _ := http.NewRequest("GET", "http://sim"+tc.path, nil)
		if tc.key != "" {
			req.Header.Set("Authorization", "Bearer "+tc.key)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v\n%s", tc.path, err, s.stderr())
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s with key %q: %d, want %d", tc.path, tc.key, resp.StatusCode, tc.status)
		}
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := s.wait(t); code != 0 {
		t.Errorf("exit %d\n%s", code, s.stderr())
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after a clean stop: %v", err)
	}
}
