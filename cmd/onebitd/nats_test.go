package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/internal/obtest"
)

// emitReplayLog publishes the golden log's events into b's stream and
// waits until the stream acknowledged them all.
func emitReplayLog(t *testing.T, b *bus.Bus) {
	t.Helper()
	evs := replayLogEvents()
	for i := range evs {
		b.Emit(&evs[i])
	}
	obtest.WaitFor(t, 10*time.Second, "stream acks", func() bool { return b.Stats().Published == uint64(len(evs)) })
}

// TestReplayStream reads the stream of a daemon's embedded server with the
// reader's credentials; without them, or with another server's, it is
// refused (exit 2, the reason on stderr).
func TestReplayStream(t *testing.T) {
	b := openTestBus(t, bus.Config{Listen: "127.0.0.1:0", JetStream: true, StoreDir: t.TempDir()})
	emitReplayLog(t, b)
	url := b.ClientURL()
	otherDir := t.TempDir()
	openTestBus(t, bus.Config{Listen: bus.ListenOff, StateDir: otherDir})
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"reader creds", []string{"--nats-url", url, "--nats-creds", b.ReaderCreds(), "--stream", bus.StreamName, "--failed"}, 0,
			"audit: 33 events", ""},
		{"reader nkey, timelines", []string{"--stream", bus.StreamName, "--nats-url", url, "--nats-nkey", b.ReaderCreds()}, 0,
			"audit: OK", ""},
		{"no creds", []string{"--nats-url", url, "--stream", bus.StreamName}, 2, "", "Authorization Violation"},
		{"another server's reader", []string{"--nats-url", url, "--stream", bus.StreamName,
			"--nats-creds", bus.ReaderCredsPath(otherDir)}, 2, "", "Authorization Violation"},
		{"unknown stream", []string{"--nats-url", url, "--nats-creds", b.ReaderCreds(), "--stream", "NOPE"}, 2, "", "stream not found"},
		{"creds without stream", []string{"--nats-creds", b.ReaderCreds(), "x.jsonl"}, 2, "", "--nats-creds and --stream go together"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := replayRun(t, tt.args...)
			if code != tt.code || !strings.Contains(out, tt.stdout) || !strings.Contains(errOut, tt.stderr) {
				t.Fatalf("exit %d (want %d), stderr %q (want %q)\n%s", code, tt.code, errOut, tt.stderr, out)
			}
		})
	}
}

// TestDefaultReaderCreds: after `make run` (state dir ./onebitd-state),
// `onebitd watch` and `onebitd replay --stream ONEBIT` need no credential
// flag: they use ./onebitd-state/nats-reader.nk.
func TestDefaultReaderCreds(t *testing.T) {
	t.Chdir(t.TempDir())
	b := openTestBus(t, bus.Config{Listen: "127.0.0.1:0", StateDir: defaultStateDir, JetStream: true, StoreDir: t.TempDir()})
	if want := bus.ReaderCredsPath(defaultStateDir); b.ReaderCreds() != want {
		t.Fatalf("reader creds at %q, want %q", b.ReaderCreds(), want)
	}
	s := startWatch(t, false, "--nats-url", b.ClientURL())
	if !strings.Contains(s.stderr.String(), "as "+bus.ReaderCredsPath(defaultStateDir)) {
		t.Errorf("watch does not say which credentials it uses: %q", s.stderr.String())
	}
	emitReplayLog(t, b)
	obtest.WaitFor(t, 10*time.Second, "events in watch", func() bool { return strings.Count(s.stdout.String(), "\n") == 33 })
	s.stop(t)
	if out, errOut, code := replayRun(t, "--nats-url", b.ClientURL(), "--stream", bus.StreamName); code != 0 {
		t.Fatalf("replay --stream with the default creds: exit %d, stderr %q\n%s", code, errOut, out)
	}
}

// TestHelpExitsZero: -h is a request for help, not a usage error (issue 9).
// serve is checked where its flags are parsed.
func TestHelpExitsZero(t *testing.T) {
	for _, cmd := range []string{"watch", "replay", "probe-decoder"} {
		for _, h := range []string{"-h", "--help", "-help"} {
			t.Run(cmd+" "+h, func(t *testing.T) {
				var stdout, stderr bytes.Buffer
				var code int
				switch cmd {
				case "watch":
					code = watchRun(context.Background(), []string{h}, &stdout, &stderr, false, nil)
				case "replay":
					code = runReplay(context.Background(), []string{h}, &stdout, &stderr, false)
				case "probe-decoder":
					code = probeRun(context.Background(), []string{h}, &stdout, &stderr)
				}
				if code != 0 || !strings.Contains(stderr.String(), "nats") && cmd != "probe-decoder" {
					t.Fatalf("%s %s: exit %d, stderr %q", cmd, h, code, stderr.String())
				}
			})
		}
	}
}
