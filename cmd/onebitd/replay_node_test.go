package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
)

// twoNodeEvents are the golden log's events as node-a wrote them, and again
// as node-b would have (its own request ids, a second later).
func twoNodeEvents() (a, b []event.Event) {
	a = replayLogEvents()
	for _, e := range a {
		e.Node = "node-b"
		if e.RequestID != "" {
			e.RequestID = "b-" + e.RequestID
		}
		e.Time = e.Time.Add(time.Second)
		b = append(b, e)
	}
	return a, b
}

// TestReplayNode: --node keeps one node's events, from the stream (the
// server filters) and from log files alike; --since prints only requests
// that began at or after T.
func TestReplayNode(t *testing.T) {
	evA, evB := twoNodeEvents()
	dir := t.TempDir()
	both := filepath.Join(dir, "both.jsonl")
	onlyB := filepath.Join(dir, "b.jsonl")
	if err := os.WriteFile(both, append(encodeLog(evA), encodeLog(evB)...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(onlyB, encodeLog(evB), 0o600); err != nil {
		t.Fatal(err)
	}
	b := openTestBus(t, bus.Config{Listen: "127.0.0.1:0", JetStream: true, StoreDir: t.TempDir()})
	for _, evs := range [][]event.Event{evA, evB} {
		for i := range evs {
			b.Emit(&evs[i])
		}
	}
	n := uint64(len(evA) + len(evB))
	obtest.WaitFor(t, 10*time.Second, "stream acks", func() bool { return b.Stats().Published == n })
	stream := []string{"--nats-url", b.ClientURL(), "--nats-creds", b.ReaderCreds(), "--stream", bus.StreamName}

	want, errOut, code := replayRun(t, onlyB)
	if code != 0 || !strings.Contains(want, "b-req-") {
		t.Fatalf("replay of node-b's log: exit %d, %s\n%s", code, errOut, want)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"files, --node", []string{"--node", "node-b", both}, want},
		{"stream, --node", append([]string{"--node", "node-b"}, stream...), want},
		{"stream, --node unknown", append([]string{"--node", "node-z"}, stream...),
			"audit: 0 events, 0 boots, 0 requests (0 done, 0 failed, 0 interrupted, 0 incomplete, 0 in flight), 0 fallbacks\naudit: OK\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := replayRun(t, tt.args...)
			if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr %q\n%s", code, errOut, out)
			}
			if out != tt.want {
				t.Fatalf("output:\n%s\nwant:\n%s", out, tt.want)
			}
		})
	}

	// --since between the two nodes' runs: node-b's requests only, the
	// audit of everything.
	since := evB[0].Time.Add(-time.Millisecond).Format(time.RFC3339Nano)
	for _, args := range [][]string{{"--since", since, both}, append([]string{"--since", since}, stream...)} {
		out, errOut, code := replayRun(t, args...)
		if code != 0 || errOut != "" {
			t.Fatalf("%v: exit %d, stderr %q", args, code, errOut)
		}
		if strings.Contains(out, "request req-") || !strings.Contains(out, "request b-req-") ||
			!strings.Contains(out, "audit: 66 events") {
			t.Fatalf("%v:\n%s", args, out)
		}
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{"2026-11-30T10:00:00Z", time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC), true},
		{"2026-11-30T10:00:00.5+01:00", time.Date(2026, 11, 30, 9, 0, 0, 5e8, time.UTC), true},
		{"90m", now.Add(-90 * time.Minute), true},
		{"0s", now, true},
		{"-5m", time.Time{}, false},
		{"yesterday", time.Time{}, false},
		{"", time.Time{}, false},
	}
	for _, tt := range tests {
		got, err := parseSince(tt.in, now)
		if (err == nil) != tt.ok || (tt.ok && !got.Equal(tt.want)) {
			t.Errorf("parseSince(%q) = %v, %v; want %v ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}
