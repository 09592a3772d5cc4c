package providersim

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/simfault"
	"github.com/onebitd/onebitd/internal/simkv"
	"github.com/onebitd/onebitd/provjob"
)

// TestPromptFaults: with --fault-from-prompt the exec'd provider takes the
// fault that the job's tokens name, and only that job; without the switch
// a marker is plain text.
func TestPromptFaults(t *testing.T) {
	dir := t.TempDir()
	modelPath, _ := writeModel(t, dir, "a")
	for _, tc := range []struct {
		fault    simfault.Fault
		noSwitch bool
		code     int // -1: killed by the test's deadline
		lastLine string
		written  bool
		minTime  time.Duration
	}{
		{fault: simfault.None, written: true},
		{fault: simfault.ProvFail, code: 1, lastLine: "simulated failure"},
		{fault: simfault.ProvFail, noSwitch: true, written: true},
		{fault: simfault.ProvSlow, written: true, minTime: 200 * time.Millisecond},
		{fault: simfault.ProvWriteThenFail, code: 1, lastLine: "simulated failure after writing", written: true},
		{fault: simfault.ProvHang, code: -1},
		{fault: simfault.ProvKeepWriting, code: -1, written: true},
		{fault: simfault.GenSlow, written: true}, // the decoder's: ignored
	} {
		t.Run(string(tc.fault)+map[bool]string{true: " without the switch"}[tc.noSwitch], func(t *testing.T) {
			tokens := simkv.Tokenize(" the decoder and "+simfault.Marker(tc.fault)+" the prefill", true)
			tokFile := writeTokens(t, t.TempDir(), tokensJSON(tokens))
			state := filepath.Join(t.TempDir(), "s.bin")
			args := []string{"--compact", "--fault-delay", "200ms", "--tokens", tokFile, "--model", modelPath, "--state", state}
			if !tc.noSwitch {
				args = append(args, "--fault-from-prompt")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			r := runSim(t, ctx, nil, args...)
			if r.code != tc.code || (tc.lastLine != "" && r.lastLine != tc.lastLine) {
				t.Fatalf("exit %d %q, want %d %q", r.code, r.lastLine, tc.code, tc.lastLine)
			}
			if r.elapsed < tc.minTime {
				t.Errorf("took %v, want at least %v", r.elapsed, tc.minTime)
			}
			if _, err := os.Stat(state); (err == nil) != tc.written {
				t.Errorf("state file written: %v, want %v", err == nil, tc.written)
			}
		})
	}
}

// TestServePromptFaults: a warm provider takes each job's own fault and
// serves the next job normally.
func TestServePromptFaults(t *testing.T) {
	d := startDecoder(t)
	w := startWarm(t, "--fault-from-prompt", "--fault-delay", "100ms")
	deadline := time.Now().Add(10 * time.Second)
	for _, tc := range []struct {
		fault  simfault.Fault
		ok     bool
		reason string
	}{
		{simfault.ProvFail, false, "simulated failure"},
		{simfault.None, true, ""},
		{simfault.ProvWriteThenFail, false, "simulated failure after writing"},
		{simfault.ProvSlow, true, ""},
	} {
		msg, _ := d.share()
		tokens := simkv.Tokenize(" the cache "+simfault.Marker(tc.fault)+" of the slot", true)
		c := w.send(t, &provjob.Job{Version: 1, Route: provjob.RouteShared, Tokens: tokens, Model: d.model, Layout: msg.Raw}, msg.Files)
		rep, err := provjob.ReadReply(c, deadline)
		c.Close()
		msg.Close()
		if err != nil || rep.OK != tc.ok || rep.Reason != tc.reason {
			t.Errorf("%s: %+v %v, want ok %v %q", tc.fault, rep, err, tc.ok, tc.reason)
		}
		if tc.fault == simfault.ProvSlow && rep.PrefillMs < 100 {
			t.Errorf("prov-slow took %.1f ms", rep.PrefillMs)
		}
	}
}
