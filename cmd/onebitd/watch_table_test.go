package main

import (
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/internal/obtest"
)

// TestWatchCommandTableAndFilters: on a terminal `onebitd watch` draws the
// live table (frames that start by going back over the previous one);
// --node keeps one node's requests, --route one route's.
func TestWatchCommandTableAndFilters(t *testing.T) {
	b := openTestBus(t, bus.Config{Listen: "127.0.0.1:0"})
	url, creds := b.ClientURL(), b.ReaderCreds()
	tests := []struct {
		name     string
		args     []string
		want     []string // in the last frame
		wantNot  []string // anywhere
		frameEnd string   // what the last frame must show
	}{
		{"node", []string{"--node", "node-b"}, []string{"node-b", "r1", "done", "the provider exited"}, []string{"node-a"}, "done"},
		{"route", []string{"--route", "shared", "--failed"}, []string{"r2", "the provider exited"}, []string{" r1 "}, "fallback"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startWatch(t, true, append([]string{"--nats-url", url, "--nats-creds", creds}, tt.args...)...)
			for _, node := range []string{"node-a", "node-b"} {
				for _, e := range watchEvents(node) {
					b.Emit(e)
				}
			}
			var last string
			obtest.WaitFor(t, 10*time.Second, "the last frame", func() bool {
				frames := strings.Split(s.stdout.String(), "\x1b[J")
				last = frames[len(frames)-1]
				for _, w := range tt.want {
					if !strings.Contains(last, w) {
						return false
					}
				}
				return true
			})
			s.stop(t)
			if !strings.HasPrefix(last, "NODE ") {
				t.Errorf("last frame does not start with the header: %q", last)
			}
			for _, w := range tt.wantNot {
				if strings.Contains(s.stdout.String(), w) {
					t.Errorf("output has %q:\n%s", w, s.stdout.String())
				}
			}
		})
	}
}
