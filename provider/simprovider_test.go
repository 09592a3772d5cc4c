package provider

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/provjob"
)

var simProvider struct {
	once sync.Once
	path string
	err  error
}

// simProviderBin builds onebit-provider-sim once for this test binary.
func simProviderBin(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds onebit-provider-sim")
	}
	simProvider.once.Do(func() {
		dir, err := os.MkdirTemp("", "provider-test-bin")
		if err != nil {
			simProvider.err = err
			return
		}
		simProvider.path = filepath.Join(dir, "onebit-provider-sim")
		out, err := exec.Command("go", "build", "-o", simProvider.path, "github.com/onebitd/onebitd/cmd/onebit-provider-sim").CombinedOutput()
		if err != nil {
			simProvider.err = errors.New(string(out))
		}
	})
	if simProvider.err != nil {
		t.Fatalf("build onebit-provider-sim: %v", simProvider.err)
	}
	return simProvider.path
}

// The warm supervisor with the shipped sim provider (--serve): a file-route
// job writes its state file; a reported failure leaves the provider up; a
// hung job is killed, gone at Run's return, and the provider comes back.
func TestWarmWithSimProvider(t *testing.T) {
	bin := simProviderBin(t)
	dir := t.TempDir()
	model := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(model, []byte("sim model"), 0o600); err != nil {
		t.Fatal(err)
	}
	job := func(state string) *provjob.Job {
		return &provjob.Job{Version: 1, Route: "file", Tokens: []int{1, 2, 3, 4}, Model: model, State: filepath.Join(dir, state)}
	}
	tests := []struct {
		name  string
		args  []string
		kind  error
		state bool
	}{
		{"ok", []string{"--compact"}, nil, true},
		{"fail", []string{"--fail"}, ErrProviderFailed, false},
		{"hang", []string{"--hang"}, ErrProviderTimeout, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := StartWarm(context.Background(), WarmConfig{Path: bin, Args: tc.args, Socket: filepath.Join(t.TempDir(), "p.sock"),
				Timeout: 500 * time.Millisecond, StartTimeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			pid := w.PID()
			res, err := w.Run(context.Background(), job(tc.name+".bin"), nil)
			gone := obtest.Gone(pid)
			if tc.kind == nil && err != nil || tc.kind != nil && !errors.Is(err, tc.kind) {
				t.Fatalf("err %v res %+v, want %v", err, res, tc.kind)
			}
			if _, serr := os.Stat(filepath.Join(dir, tc.name+".bin")); (serr == nil) != tc.state {
				t.Fatalf("state file: %v, want it written %v", serr, tc.state)
			}
			switch tc.kind {
			case ErrProviderTimeout:
				if !gone || !strings.HasSuffix(err.Error(), "(process group killed)") {
					t.Fatalf("provider gone %v at Run's return; reason %q", gone, err)
				}
				obtest.WaitFor(t, 20*time.Second, "a restarted provider", func() bool { return w.Ready() == nil && w.PID() != pid })
			default:
				if gone || w.PID() != pid {
					t.Fatalf("the provider was killed for an answered job (pid %d -> %d)", pid, w.PID())
				}
			}
		})
	}
}
