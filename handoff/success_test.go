package handoff

import (
	"context"
	"testing"

	"github.com/onebitd/onebitd/machine"
)

// TestHandoffSucceeds: both routes end in adopted / restored with the
// prompt's size, the provider's exit 0, the share's facts, and a cleanup
// that closed every received fd and removed every file (socket, tokens,
// layout; tokens and state); nothing is left behind and the audit agrees.
// With the socket removed by someone else before the end, it is not counted.
func TestHandoffSucceeds(t *testing.T) {
	cases := []struct {
		name         string
		file         bool
		share        func(*fakeDecoder, context.Context, string) error
		to           machine.State
		fds, files   int
		shared, done int // share events, adopts or restores by the decoder
	}{
		{name: "shared", to: machine.Adopted, fds: nfds + sharedMem, files: 0, shared: 1},
		{name: "shared, socket removed by hand", share: removeSocket, to: machine.Adopted, fds: nfds + sharedMem, files: 0, shared: 1},
		{name: "file", file: true, to: machine.Restored, fds: fileMem, files: stateFile},
	}
	warmUp(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.file, provOK, false, 0, nil)
			r.dec.share = tc.share
			base := fdCount(t)
			if want := map[bool]machine.Route{false: machine.RouteShared, true: machine.RouteFile}[tc.file]; r.h.Route() != want {
				t.Errorf("Route() = %s, want %s", r.h.Route(), want)
			}
			if reason := r.h.Run(r.ctx, r.m, testTokens); reason != "" {
				t.Fatalf("fell back: %s", reason)
			}
			if r.m.State() != tc.to {
				t.Fatalf("machine in %s, want %s", r.m.State(), tc.to)
			}
			ev := lastEvent(r.ev)
			if ev.NTokens != len(testTokens) || ev.Cleanup == nil || ev.Cleanup.FDsClosed != tc.fds || ev.Cleanup.FilesRemoved != tc.files {
				t.Errorf("%s event: n_tokens %d cleanup %+v; want %d tokens, %d fds, %d files", ev.Event, ev.NTokens, ev.Cleanup, len(testTokens), tc.fds, tc.files)
			}
			shares := 0
			for _, e := range r.ev.Events() {
				switch machine.Event(e.Event) {
				case machine.EvShare:
					shares++
					if e.ShareID == nil || e.NFDs != nfds || e.BytesMapped != nfds*2*4096 {
						t.Errorf("share event %+v", e)
					}
				case machine.EvPrefill:
					if e.ProviderExit == nil || *e.ProviderExit != 0 {
						t.Errorf("prefill event without provider_exit 0: %+v", e)
					}
				case machine.EvFallback:
					t.Errorf("a fallback event on success: %+v", e)
				}
			}
			if shares != tc.shared || len(r.dec.adopted)+len(r.dec.restored) != 1 {
				t.Errorf("%d share events, decoder adopted %v restored %v", shares, r.dec.adopted, r.dec.restored)
			}
			if !tc.file && (len(r.dec.adopted) != 1 || ev.ShareID == nil || *ev.ShareID != r.dec.adopted[0]) {
				t.Errorf("adopted %v, the adopt event names share_id %v", r.dec.adopted, ev.ShareID)
			}
			checkEmptyDir(t, r.dir)
			checkAudit(t, r)
			checkNoFDLeft(t, base)
		})
	}
}
