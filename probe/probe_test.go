package probe

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/onebitd/onebitd/launcher"
)

// simBin is the onebit-decoder-sim binary built by TestMain.
var simBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "probe-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	simBin = filepath.Join(dir, "onebit-decoder-sim")
	if out, err := exec.Command("go", "build", "-o", simBin, "github.com/onebitd/onebitd/cmd/onebit-decoder-sim").CombinedOutput(); err != nil {
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

// decoderSim starts the simulator as a process with the given extra args;
// slotSave false starts it without --slot-save-path (the launcher always
// passes one, so that case runs the binary through a wrapper script).
func decoderSim(t *testing.T, slotSave bool, args ...string) (url, slotDir string) {
	t.Helper()
	dir := t.TempDir()
	model := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(model, []byte("probe test model"), 0o600); err != nil {
		t.Fatal(err)
	}
	slotDir = filepath.Join(dir, "slots")
	if err := os.Mkdir(slotDir, 0o700); err != nil {
		t.Fatal(err)
	}
	bin := simBin
	if !slotSave {
		// Drop "--slot-save-path DIR" from the launcher's argv.
		bin = filepath.Join(dir, "sim.sh")
		script := `#!/bin/sh
a=""
while [ $# -gt 0 ]; do
  if [ "$1" = "--slot-save-path" ]; then shift 2; continue; fi
  a="$a '$1'"; shift
done
eval exec '` + simBin + `' $a
`
		if err := os.WriteFile(bin, []byte(script), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	d, err := launcher.Start(context.Background(), launcher.Config{
		Bin: bin, Model: model, SlotDir: slotDir, Slots: 2, Args: args, StallTimeout: 20 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop() })
	return d.URL(), slotDir
}

// upstream puts an upstream llama-server's answer to share and adopt (400
// "Invalid action") in front of a simulator.
func upstream(t *testing.T, target string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{DisableKeepAlives: true}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a := r.URL.Query().Get("action"); strings.HasPrefix(r.URL.Path, "/slots/") && (a == "share" || a == "adopt") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"code":400,"message":"Invalid action","type":"invalid_request_error"}}`)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts.URL
}

var allChecks = []string{CheckHealth, CheckProps, CheckSlotActions, CheckIDSlot, CheckRestore,
	CheckShare, CheckNoShareID, CheckOlder, CheckAdopt, CheckReused, CheckRecurrent}

func TestProbe(t *testing.T) {
	type want map[string]Status // check → status; checks not named: PASS
	tests := []struct {
		name     string
		url      func(t *testing.T) (string, string)
		slot     int
		want     want
		wantOK   bool
		detailIn map[string]string
	}{
		{
			name: "simulator",
			url:  func(t *testing.T) (string, string) { return decoderSim(t, true) },
			slot: 1,
			want: want{CheckRecurrent: NotSupported}, wantOK: true,
		},
		{
			name:     "lax share_id",
			url:      func(t *testing.T) (string, string) { return decoderSim(t, true, "--lax-share-id") },
			want:     want{CheckNoShareID: Fail, CheckOlder: Fail, CheckReused: Fail, CheckRecurrent: NotSupported},
			detailIn: map[string]string{CheckOlder: "ACCEPTED"},
		},
		{
			name: "recurrent",
			url:  func(t *testing.T) (string, string) { return decoderSim(t, true, "--recurrent") },
			want: want{CheckShare: NotSupported, CheckNoShareID: NotSupported, CheckOlder: NotSupported,
				CheckAdopt: NotSupported, CheckReused: NotSupported},
			wantOK:   true,
			detailIn: map[string]string{CheckRecurrent: "no shareable region"},
		},
		{
			name: "upstream llama-server",
			url: func(t *testing.T) (string, string) {
				u, dir := decoderSim(t, true)
				return upstream(t, u), dir
			},
			want: want{CheckShare: NotSupported, CheckNoShareID: NotSupported, CheckOlder: NotSupported,
				CheckAdopt: NotSupported, CheckReused: NotSupported, CheckRecurrent: NotSupported},
			wantOK:   true,
			detailIn: map[string]string{CheckShare: "upstream"},
		},
		{
			name: "no --slot-save-path",
			url:  func(t *testing.T) (string, string) { return decoderSim(t, false) },
			want: want{CheckSlotActions: Fail, CheckIDSlot: Skip, CheckRestore: Skip, CheckShare: Skip, CheckNoShareID: Skip,
				CheckOlder: Skip, CheckAdopt: Skip, CheckReused: Skip, CheckRecurrent: Skip},
			detailIn: map[string]string{CheckSlotActions: "--slot-save-path"},
		},
		{
			name: "slot past the end",
			url:  func(t *testing.T) (string, string) { return decoderSim(t, true) },
			slot: 2,
			want: want{CheckProps: Fail, CheckSlotActions: Skip, CheckIDSlot: Skip, CheckRestore: Skip, CheckShare: Skip, CheckNoShareID: Skip,
				CheckOlder: Skip, CheckAdopt: Skip, CheckReused: Skip, CheckRecurrent: Skip},
			detailIn: map[string]string{CheckProps: "total_slots 2"},
		},
		{
			name: "unreachable",
			url:  func(*testing.T) (string, string) { return "http://127.0.0.1:1", "" },
			want: want{CheckHealth: Fail, CheckProps: Skip, CheckSlotActions: Skip, CheckIDSlot: Skip, CheckRestore: Skip, CheckShare: Skip, CheckNoShareID: Skip,
				CheckOlder: Skip, CheckAdopt: Skip, CheckReused: Skip, CheckRecurrent: Skip},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, slotDir := tt.url(t)
			rep, err := Run(context.Background(), Config{DecoderURL: u, Slot: tt.slot, SlotDir: slotDir, Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			var table strings.Builder
			_ = rep.WriteTable(&table)
			t.Log("\n" + table.String())
			var names []string
			for _, c := range rep.Checks {
				names = append(names, c.Name)
				want, ok := tt.want[c.Name]
				if !ok {
					want = Pass
				}
				if c.Status != want {
					t.Errorf("%s: %s (%s), want %s", c.Name, c.Status, c.Detail, want)
				}
				if c.Detail == "" {
					t.Errorf("%s: no detail", c.Name)
				}
			}
			if !slices.Equal(names, allChecks) {
				t.Errorf("checks %q\nwant %q", names, allChecks)
			}
			if rep.OK != tt.wantOK || rep.Failed() == tt.wantOK {
				t.Errorf("OK %v, Failed %v, want OK %v", rep.OK, rep.Failed(), tt.wantOK)
			}
			for name, s := range tt.detailIn {
				if d := rep.Get(name).Detail; !strings.Contains(d, s) {
					t.Errorf("%s detail %q lacks %q", name, d, s)
				}
			}
			if slotDir != "" {
				if _, err := os.Stat(filepath.Join(slotDir, ProbeFile)); err == nil {
					t.Errorf("%s left in the slot dir", ProbeFile)
				}
			}
		})
	}
}

// TestLeavesSlotEmpty: after a probe the slot holds nothing (nothing adopted):
// a completion on it evaluates the whole prompt.
func TestLeavesSlotEmpty(t *testing.T) {
	u, slotDir := decoderSim(t, true)
	if _, err := Run(context.Background(), Config{DecoderURL: u, SlotDir: slotDir}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(u+"/slots/0?action=save", "application/json", strings.NewReader(`{"filename":"after.bin"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"n_saved":0`) {
		t.Errorf("slot after the probe: %s", b)
	}
}

func TestConfigRefused(t *testing.T) {
	for _, c := range []Config{{DecoderURL: "localhost:8080"}, {DecoderURL: "http://x", Slot: -1}} {
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// TestProbeKeyedDecoder: a decoder behind an API key (llama-server
// --api-key-file, here drawn by the launcher) is probed with the key file;
// without it the probe is not conformant (llama-server's 401).
func TestProbeKeyedDecoder(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(model, []byte("probe test model"), 0o600); err != nil {
		t.Fatal(err)
	}
	slotDir := filepath.Join(dir, "slots")
	if err := os.Mkdir(slotDir, 0o700); err != nil {
		t.Fatal(err)
	}
	d, err := launcher.Start(context.Background(), launcher.Config{
		Bin: simBin, Model: model, SlotDir: slotDir, Slots: 2, StallTimeout: 20 * time.Second,
		APIKey: true, UnixSocket: true, RunDir: filepath.Join(dir, "run"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop() })
	rep, err := Run(context.Background(), Config{DecoderURL: d.URL(), SlotDir: slotDir, APIKeyFile: d.KeyFile(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		t.Fatalf("with the key: %+v", rep)
	}
	rep, err = Run(context.Background(), Config{DecoderURL: d.URL(), SlotDir: slotDir, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK {
		t.Fatal("conformant without the key: the decoder is not protected")
	}
}
