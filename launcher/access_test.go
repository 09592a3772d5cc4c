package launcher

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/internal/obtest"
)

// A launched decoder with a per-boot key and a unix socket (DESIGN §2d,
// issue 10): only the launcher's client gets in; the key is in a 0600 file,
// not on the command line, not in the log; a restart keeps the address; Stop
// removes the key and the socket.
func TestAccessControl(t *testing.T) {
	tests := []struct {
		name       string
		apiKey     bool
		unixSocket bool
		ownDir     bool
	}{
		{"key and socket in a temp dir", true, true, false},
		{"key and socket in a given dir", true, true, true},
		{"key over tcp", true, false, false},
		{"socket without key", false, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _ := config(t)
			var logs obtest.Buffer
			cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{t}, &logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
			cfg.APIKey, cfg.UnixSocket = tc.apiKey, tc.unixSocket
			if tc.ownDir {
				cfg.RunDir = filepath.Join(t.TempDir(), "run")
			}
			d := start(t, cfg)
			ctx := context.Background()
			runDir := filepath.Dir(d.KeyFile())
			if tc.unixSocket {
				sock := strings.TrimPrefix(d.URL(), "unix://")
				if sock == d.URL() || filepath.Base(sock) != SocketName {
					t.Fatalf("URL %q, want unix://…/%s", d.URL(), SocketName)
				}
				runDir = filepath.Dir(sock)
			}
			if tc.ownDir && runDir != cfg.RunDir {
				t.Fatalf("run dir %q, want %q", runDir, cfg.RunDir)
			}
			if st, err := os.Stat(runDir); err != nil || st.Mode().Perm() != 0o700 {
				t.Fatalf("run dir %v %v, want mode 0700", st.Mode(), err)
			}
			var key string
			if tc.apiKey {
				st, err := os.Stat(d.KeyFile())
				if err != nil || st.Mode().Perm() != 0o600 {
					t.Fatalf("key file %v %v, want mode 0600", st, err)
				}
				if key, err = decoder.ReadKeyFile(d.KeyFile()); err != nil || !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(key) {
					t.Fatalf("key %q %v", key, err)
				}
				cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(d.PID()) + "/cmdline")
				if err != nil || strings.Contains(string(cmdline), key) || !strings.Contains(string(cmdline), "--api-key-file") {
					t.Fatalf("decoder command line %q (%v): the key file, never the key", cmdline, err)
				}
			} else if d.KeyFile() != "" {
				t.Fatalf("KeyFile %q without APIKey", d.KeyFile())
			}

			// The launcher's client gets in; one without the key does not.
			if p, err := d.Client().Props(ctx); err != nil || p.TotalSlots != cfg.Slots {
				t.Fatalf("props through Client: %+v %v", p, err)
			}
			bare, err := decoder.New(d.URL(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer bare.HTTP().CloseIdleConnections()
			if err := bare.Health(ctx); err != nil {
				t.Fatalf("/health must stay open: %v", err)
			}
			_, err = bare.Props(ctx)
			if tc.apiKey && !decoder.IsStatus(err, 401) {
				t.Fatalf("props without the key: %v, want 401", err)
			}
			if !tc.apiKey && err != nil {
				t.Fatalf("props: %v", err)
			}

			// kill -9: the restarted decoder has the same address and key
			// (the stale socket file is replaced).
			pid := d.PID()
			if err := unix.Kill(pid, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
			// A restarted decoder that answers with the same client (same
			// address, same key). Polled: the supervisor may not have seen
			// the exit yet when the kill returns.
			obtest.WaitFor(t, 20*time.Second, "a restarted decoder answering /props with the same client", func() bool {
				if d.Ready() != nil || d.PID() == 0 || d.PID() == pid {
					return false
				}
				_, err := d.Client().Props(ctx)
				return err == nil
			})
			if key != "" && strings.Contains(logs.String(), key) {
				t.Fatal("the key is in the log")
			}
			if err := d.Stop(); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{filepath.Join(runDir, KeyFileName), filepath.Join(runDir, SocketName)} {
				if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left after Stop (%v)", f, err)
				}
			}
			if _, err := os.Stat(runDir); tc.ownDir == errors.Is(err, os.ErrNotExist) {
				t.Errorf("run dir after Stop: %v (given dirs stay, temp dirs go)", err)
			}
		})
	}
}

func TestRunDirRefused(t *testing.T) {
	open := t.TempDir()
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	for _, dir := range []string{open, long} {
		cfg, _ := config(t)
		cfg.APIKey, cfg.UnixSocket, cfg.RunDir = true, true, dir
		if _, err := Start(context.Background(), cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("run dir %s: %v, want ErrConfig", dir, err)
		}
		if _, err := os.Stat(filepath.Join(dir, KeyFileName)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("key file left in %s", dir)
		}
	}
	cfg, _ := config(t, "--api-key-file", "/tmp/k")
	if _, err := Start(context.Background(), cfg); !errors.Is(err, ErrConfig) {
		t.Errorf("user's --api-key-file: %v, want ErrConfig", err)
	}
}
