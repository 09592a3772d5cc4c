package handoff

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/machine"
	"github.com/onebitd/onebitd/metrics"
	"github.com/onebitd/onebitd/provider"
)

// The fallback matrix (issue 9 item 5): every step of both routes × every
// fault, through a real Handoff with real unix sockets, real memfds, an
// in-process decoder that really connects (fakeDecoder) and the real
// provider.Runner running this test binary as the provider. Each case
// asserts behaviour only (the reason, the step, the cleanup counts on the
// event, the HTTP status and provider exit, no file left in the slot dir, no
// fd left in this process, exactly one fallback event and the machine in
// fallback), so that it holds across a rewrite of the runner's internals.

// nfds is how many region fds the fake decoder shares.
const nfds = 3

// The files a run removes from the slot dir, by kind: cases count with
// these, so that a runner that keeps fewer files there (issue 11: one
// socket per slot, tokens and layout in memfds) changes them here.
const (
	sockFile   = 0 // the share socket is the slot's (kvshare-<K>.sock), kept
	tokensFile = 0 // tokens travel in a sealed memfd
	layoutFile = 0 // so does the share header for the provider
	stateFile  = 1 // <stem>.bin, or the .bin.tmp of a provider cut short
)

// The sealed memfds a run closes besides the region fds: tokens and layout
// on the shared route, tokens on the file route.
const (
	sharedMem = 2
	fileMem   = 1
)

// noExit: the fallback event carries no provider_exit.
const noExit = -100

// Ways a client (or the daemon) cuts a handoff short, besides the decoder's
// own hooks (clientLeaves, leaves).
const (
	goneBefore   = "before"        // the request's ctx is cancelled before Run
	goneProvider = "provider"      // the client leaves once the provider runs
	drainInProv  = "drain"         // Drain once the provider runs
	drainInRecv  = "drain-receive" // Drain while onebitd waits for the share message
)

// clientGone is how every reason of a client that left starts (the
// handlers use the same words).
const clientGone = "the client went away"

type fbCase struct {
	name    string
	file    bool // the file route (default: shared)
	share   func(*fakeDecoder, context.Context, string) error
	adopt   func(*fakeDecoder, context.Context) error
	restore func(*fakeDecoder, context.Context) error
	prov    string        // provider mode (default provOK)
	noProv  bool          // the provider executable does not exist
	provTO  time.Duration // Runner.Timeout (default 30s)
	cfg     func(*Config)
	setup   func(t *testing.T, dir, stem string)
	cut     string // goneBefore, goneProvider, drainInProv
	closed  bool   // the runner is closed before Run

	class  string // metrics.Classify of the fallback event
	step   string
	reason string // the fallback reason starts with it
	status int
	exit   int // provider_exit on the event, noExit for none
	fds    int // cleanup.fds_closed
	files  int // cleanup.files_removed
}

func fallbackCases() []fbCase {
	ms := func(d time.Duration) func(*Config) {
		return func(c *Config) { c.AcceptTimeout, c.ShareTimeout, c.ApplyTimeout = d, d, d }
	}
	tooLong := binary.LittleEndian.AppendUint32(nil, fdpass.MaxHeaderLen+1)
	hdr := shareHeader(nfds)
	truncated := append(binary.LittleEndian.AppendUint32(nil, uint32(len(hdr)+100)), hdr...)
	beyond := strings.Replace(string(shareHeader(1)), `"offset":4096`, `"offset":2097152`, 1)
	return []fbCase{
		// listen
		{name: "share sockets closed (onebitd stopping)", closed: true,
			class: metrics.ClassCancelled, step: machine.StepListen, reason: ErrClosed.Error(), exit: noExit},
		{name: "client gone before the handoff", cut: goneBefore,
			class: metrics.ClassCancelled, step: machine.StepListen, reason: clientGone, exit: noExit},

		// share
		{name: "share answers 501 (no shareable region)", share: answer(apiErr("share", 501, "not_supported_error", "no shareable region: the cache is recurrent")),
			class: metrics.ClassDecoderUnsupported, step: machine.StepShare, reason: "decoder answered share with 501 not_supported_error: no shareable region", status: 501, exit: noExit, files: sockFile},
		{name: "share answers 400", share: answer(apiErr("share", 400, "invalid_request_error", "the socket path is not absolute")),
			class: metrics.ClassDecoderRefused, step: machine.StepShare, reason: "decoder answered share with 400", status: 400, exit: noExit, files: sockFile},
		{name: "share answers 500", share: answer(apiErr("share", 500, "server_error", "mmap failed")),
			class: metrics.ClassDecoderError, step: machine.StepShare, reason: "decoder answered share with 500 server_error: mmap failed", status: 500, exit: noExit, files: sockFile},
		{name: "share sends the message then answers 500", share: then(sendConsumed, apiErr("share", 500, "server_error", "late failure")),
			class: metrics.ClassDecoderError, step: machine.StepShare, reason: "decoder answered share with 500", status: 500, exit: noExit, fds: nfds, files: sockFile},
		{name: "share does not answer in time", share: hangUntilDone, cfg: func(c *Config) { c.ShareTimeout = 200 * time.Millisecond },
			class: metrics.ClassTimeout, step: machine.StepShare, reason: "the decoder did not answer the share request in time (200ms)", exit: noExit, files: sockFile},
		{name: "socket removed by hand during share (not counted)", share: then(removeSocket, apiErr("share", 500, "server_error", "x")),
			class: metrics.ClassDecoderError, step: machine.StepShare, reason: "decoder answered share with 500", status: 500, exit: noExit, fds: nfds, files: 0},
		{name: "share answers without a share_id", share: then(sendConsumed, errNoIDAnswer),
			class: metrics.ClassDecoderError, step: machine.StepShare, reason: "the decoder's share answer has no share_id", exit: noExit, fds: nfds, files: sockFile},
		{name: "client gone during share", share: clientLeaves("share"),
			class: metrics.ClassCancelled, step: machine.StepShare, reason: clientGone, exit: noExit, files: sockFile},

		// receive
		{name: "decoder never connects (accept timeout)", share: noConnect, cfg: ms(200 * time.Millisecond),
			class: metrics.ClassTimeout, step: machine.StepReceive, reason: fdpass.ErrAcceptTimeout.Error(), exit: noExit, files: sockFile},
		{name: "decoder connects and sends nothing", share: connectSilent, cfg: ms(200 * time.Millisecond),
			class: metrics.ClassTimeout, step: machine.StepReceive, reason: fdpass.ErrReceiveTimeout.Error(), exit: noExit, files: sockFile},
		{name: "bad header (not JSON)", share: sendHeader(`{"version":1,"layout_hash":`),
			class: metrics.ClassBadShareMessage, step: machine.StepReceive, reason: fdpass.ErrBadHeader.Error(), exit: noExit, files: sockFile},
		{name: "bad header (version 2)", share: sendHeader(`{"version":2,"layout_hash":"ab"}`),
			class: metrics.ClassBadShareMessage, step: machine.StepReceive, reason: fdpass.ErrVersion.Error(), exit: noExit, files: sockFile},
		{name: "layout names an fd that was not sent", share: sendHeader(string(shareHeader(nfds + 1))),
			class: metrics.ClassBadShareMessage, step: machine.StepReceive, reason: fdpass.ErrRegion.Error(), exit: noExit, files: sockFile},
		{name: "layout region beyond its memfd", share: sendHeader(beyond),
			class: metrics.ClassBadShareMessage, step: machine.StepReceive, reason: fdpass.ErrRegion.Error(), exit: noExit, files: sockFile},
		{name: "truncated header", share: sendRaw(truncated),
			class: metrics.ClassBadShareMessage, step: machine.StepReceive, reason: fdpass.ErrShortMessage.Error(), exit: noExit, files: sockFile},
		{name: "header larger than accepted", share: sendRaw(tooLong),
			class: metrics.ClassBadShareMessage, step: machine.StepReceive, reason: fdpass.ErrHeaderTooLarge.Error(), exit: noExit, files: sockFile},
		{name: "too many fds (MSG_CTRUNC)", share: sendValid, cfg: func(c *Config) { c.MaxFDs = nfds - 1 },
			class: metrics.ClassBadShareMessage, step: machine.StepReceive, reason: fdpass.ErrCtrunc.Error(), exit: noExit, files: sockFile},
		{name: "client gone while waiting for the message", share: clientLeavesAfter(connectSilent),
			class: metrics.ClassCancelled, step: machine.StepReceive, reason: clientGone, exit: noExit, files: sockFile},
		{name: "onebitd drains while waiting for the message", cut: drainInRecv,
			class: metrics.ClassCancelled, step: machine.StepReceive, reason: ErrDraining.Error(), exit: noExit, files: sockFile},
		{name: "client gone before the decoder connects", share: clientLeavesAfter(noConnect),
			class: metrics.ClassCancelled, step: machine.StepReceive, reason: clientGone, exit: noExit, files: sockFile},

		// peer
		{name: "peer pid is not the decoder's", cfg: func(c *Config) { c.PeerPID = func() int { return 1 } },
			class: metrics.ClassPeerRefused, step: machine.StepPeer, reason: errWrongPeer.Error() + " (peer pid " + strconv.Itoa(os.Getpid()), exit: noExit, files: sockFile},
		{name: "peer uid is not the decoder's", cfg: func(c *Config) { c.PeerPID = nil; c.PeerUID = os.Getuid() + 1 },
			class: metrics.ClassPeerRefused, step: machine.StepPeer, reason: errWrongPeer.Error() + " (peer uid", exit: noExit, files: sockFile},
		{name: "another process connects first", share: stranger,
			class: metrics.ClassPeerRefused, step: machine.StepPeer, reason: errWrongPeer.Error() + " (peer pid", exit: noExit, files: sockFile},
		{name: "another process connects first, share then fails", share: then(stranger, apiErr("share", 500, "server_error", "x")),
			class: metrics.ClassPeerRefused, step: machine.StepPeer, reason: errWrongPeer.Error(), exit: noExit, files: sockFile},

		// tokens: memfds in memory, no fault to inject short of exhausting fds

		// provider
		{name: "provider exits 3", prov: provFail,
			class: metrics.ClassProviderFailed, step: machine.StepProvider, reason: "provider exited with status 3: " + helperStderr, exit: 3, fds: nfds + sharedMem, files: sockFile + tokensFile + layoutFile},
		{name: "provider times out", prov: provHang, provTO: 300 * time.Millisecond,
			class: metrics.ClassTimeout, step: machine.StepProvider, reason: "provider timed out after 300ms (process group killed)", exit: -1, fds: nfds + sharedMem, files: sockFile + tokensFile + layoutFile},
		{name: "provider writes the regions, then fails", prov: provWriteFail,
			class: metrics.ClassProviderFailed, step: machine.StepProvider, reason: "provider exited with status 1: wrote the regions, then lost the device", exit: 1, fds: nfds + sharedMem, files: sockFile + tokensFile + layoutFile},
		{name: "provider cannot start", noProv: true,
			class: metrics.ClassProviderFailed, step: machine.StepProvider, reason: "provider could not start", exit: -1, fds: nfds + sharedMem, files: sockFile + tokensFile + layoutFile},
		{name: "client gone while the provider runs", prov: provHang, cut: goneProvider,
			class: metrics.ClassCancelled, step: machine.StepProvider, reason: clientGone, exit: -1, fds: nfds + sharedMem, files: sockFile + tokensFile + layoutFile},
		{name: "onebitd drains while the provider runs", prov: provHang, cut: drainInProv,
			class: metrics.ClassCancelled, step: machine.StepProvider, reason: ErrDraining.Error(), exit: -1, fds: nfds + sharedMem, files: sockFile + tokensFile + layoutFile},

		// adopt
		{name: "adopt refuses the share_id (400)", adopt: refuse(apiErr("adopt", 400, "invalid_request_error", "share_id 1 is not the last share of slot 0")),
			class: metrics.ClassDecoderRefused, step: machine.StepAdopt, reason: "decoder answered adopt with 400 invalid_request_error: share_id 1", status: 400, exit: noExit, fds: nfds + sharedMem, files: sockFile + tokensFile + layoutFile},
		{name: "adopt answers 500", adopt: refuse(apiErr("adopt", 500, "server_error", "x")),
			class: metrics.ClassDecoderError, step: machine.StepAdopt, reason: "decoder answered adopt with 500", status: 500, exit: noExit, fds: nfds + sharedMem, files: sockFile + tokensFile + layoutFile},
		{name: "adopt does not answer in time", adopt: lateAnswer("adopt"), cfg: func(c *Config) { c.ApplyTimeout = 200 * time.Millisecond },
			class: metrics.ClassTimeout, step: machine.StepAdopt, reason: "the decoder did not answer the adopt request in time (200ms)", exit: noExit, fds: nfds + sharedMem, files: sockFile + tokensFile + layoutFile},
		{name: "client gone during adopt", adopt: leaves("adopt"),
			class: metrics.ClassCancelled, step: machine.StepAdopt, reason: clientGone, exit: noExit, fds: nfds + sharedMem, files: sockFile + tokensFile + layoutFile},

		// file route
		{name: "file: client gone before the handoff", file: true, cut: goneBefore,
			class: metrics.ClassCancelled, step: machine.StepTokens, reason: clientGone, exit: noExit},
		{name: "file: provider exits 3", file: true, prov: provFail,
			class: metrics.ClassProviderFailed, step: machine.StepProvider, reason: "provider exited with status 3: " + helperStderr, fds: fileMem, exit: 3, files: tokensFile},
		{name: "file: provider times out (its .tmp removed)", file: true, prov: provHang, provTO: 300 * time.Millisecond,
			class: metrics.ClassTimeout, step: machine.StepProvider, reason: "provider timed out after 300ms (process group killed)", fds: fileMem, exit: -1, files: tokensFile + stateFile},
		{name: "file: provider writes part of the state, then fails", file: true, prov: provWriteFail,
			class: metrics.ClassProviderFailed, step: machine.StepProvider, reason: "provider exited with status 1: wrote the regions, then lost the device", fds: fileMem, exit: 1, files: tokensFile + stateFile},
		{name: "file: provider cannot start", file: true, noProv: true,
			class: metrics.ClassProviderFailed, step: machine.StepProvider, reason: "provider could not start", fds: fileMem, exit: -1, files: tokensFile},
		{name: "file: client gone while the provider runs", file: true, prov: provHang, cut: goneProvider,
			class: metrics.ClassCancelled, step: machine.StepProvider, reason: clientGone, fds: fileMem, exit: -1, files: tokensFile + stateFile},
		{name: "file: restore refused (400)", file: true, restore: refuse(apiErr("restore", 400, "invalid_request_error", "failed to restore slot state")),
			class: metrics.ClassDecoderRefused, step: machine.StepRestore, reason: "decoder answered restore with 400 invalid_request_error: failed to restore", status: 400, fds: fileMem, exit: noExit, files: tokensFile + stateFile},
		{name: "file: restore answers 500", file: true, restore: refuse(apiErr("restore", 500, "server_error", "x")),
			class: metrics.ClassDecoderError, step: machine.StepRestore, reason: "decoder answered restore with 500", status: 500, fds: fileMem, exit: noExit, files: tokensFile + stateFile},
		{name: "file: restore does not answer in time", file: true, restore: lateAnswer("restore"), cfg: func(c *Config) { c.ApplyTimeout = 200 * time.Millisecond },
			class: metrics.ClassTimeout, step: machine.StepRestore, reason: "the decoder did not answer the restore request in time (200ms)", fds: fileMem, exit: noExit, files: tokensFile + stateFile},
		{name: "file: client gone during restore", file: true, restore: leaves("restore"),
			class: metrics.ClassCancelled, step: machine.StepRestore, reason: clientGone, fds: fileMem, exit: noExit, files: tokensFile + stateFile},
	}
}

// TestFallbackMatrix runs every case of fallbackCases. The cases run one at
// a time: "no fd left" is counted on /proc/self/fd, which is the whole
// process's.
func TestFallbackMatrix(t *testing.T) {
	warmUp(t)
	for _, tc := range fallbackCases() {
		t.Run(tc.name, func(t *testing.T) { runFallback(t, tc) })
	}
}

// rig is one case's handoff: slot dir, decoder, provider, machine.
type rig struct {
	dir, pidFile string
	dec          *fakeDecoder
	h            *Handoff
	m            *machine.Machine
	ev           *event.Mem
	ctx          context.Context
	cancel       context.CancelFunc
}

func newRig(t *testing.T, file bool, prov string, noProv bool, provTO time.Duration, cfgFn func(*Config)) *rig {
	t.Helper()
	r := &rig{dir: shortDir(t), pidFile: filepath.Join(t.TempDir(), "provider.pid"), ev: &event.Mem{}}
	r.dec = newFakeDecoder(t, nfds, r.dir)
	t.Cleanup(r.dec.close)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	t.Cleanup(r.cancel)
	r.dec.cancel = r.cancel
	cfg := Config{SlotDir: r.dir, Model: "m.gguf", Share: !file,
		AcceptTimeout: 30 * time.Second, ShareTimeout: 30 * time.Second, ApplyTimeout: 30 * time.Second,
		CheckPeerCreds: true, PeerPID: os.Getpid}
	if cfgFn != nil {
		cfgFn(&cfg)
	}
	if prov == "" {
		prov = provOK
	}
	if provTO == 0 {
		provTO = 30 * time.Second
	}
	run := &provider.Runner{Path: os.Args[0], Args: []string{"-helper", prov, r.pidFile}, Timeout: provTO}
	if noProv {
		run.Path = filepath.Join(t.TempDir(), "no-such-provider")
	}
	r.h = NewHandoff(cfg, r.dec, Exec{Runner: run}, nil)
	_ = r.h.Listen() // as the daemon does at startup; a failure shows at the listen step
	t.Cleanup(func() { r.h.Close() })
	route := machine.RouteShared
	if file {
		route = machine.RouteFile
	}
	r.m = machine.New(NewRequestID(), 0, route, event.NewRecorder("test", r.ev), nil)
	return r
}

var testTokens = func() []int {
	toks := make([]int, 300)
	for i := range toks {
		toks[i] = 1000 + i%97
	}
	return toks
}()

func runFallback(t *testing.T, tc fbCase) {
	r := newRig(t, tc.file, tc.prov, tc.noProv, tc.provTO, tc.cfg)
	r.dec.share, r.dec.adoptErr, r.dec.restoreErr = tc.share, tc.adopt, tc.restore
	if tc.setup != nil {
		tc.setup(t, r.dir, r.m.ID())
	}
	if tc.closed {
		r.h.Close()
	}
	base := fdCount(t)

	cutDone := make(chan struct{})
	switch tc.cut {
	case goneBefore:
		r.cancel()
		close(cutDone)
	case drainInRecv:
		r.dec.share = clientLeavesAfter(connectSilent)
		r.dec.cancel = r.h.Drain
		close(cutDone)
	case goneProvider, drainInProv:
		cut := r.cancel
		if tc.cut == drainInProv {
			cut = r.h.Drain
		}
		go func() {
			defer close(cutDone)
			waitFile(r.pidFile, 20*time.Second) // the provider runs
			cut()
		}()
	default:
		close(cutDone)
	}
	start := time.Now()
	reason := r.h.Run(r.ctx, r.m, testTokens)
	took := time.Since(start)
	<-cutDone

	// No case waits out a default deadline (30 s here): a fault is noticed
	// when it happens, a client that leaves is let go at once.
	if took > 10*time.Second {
		t.Errorf("the handoff took %v to fall back", took)
	}

	checkFallback(t, r, tc.step, reason)
	ev := lastEvent(r.ev)
	if !strings.HasPrefix(reason, tc.reason) {
		t.Errorf("reason %q\n  want it to start with %q", reason, tc.reason)
	}
	if c := metrics.Classify(&ev); c != tc.class {
		t.Errorf("the metrics class the reason %q falls in is %s, want %s", reason, c, tc.class)
	}
	if ev.HTTPStatus != tc.status {
		t.Errorf("http_status %d, want %d", ev.HTTPStatus, tc.status)
	}
	switch {
	case tc.exit == noExit && ev.ProviderExit != nil:
		t.Errorf("provider_exit %d, want none", *ev.ProviderExit)
	case tc.exit != noExit && (ev.ProviderExit == nil || *ev.ProviderExit != tc.exit):
		t.Errorf("provider_exit %v, want %d", ev.ProviderExit, tc.exit)
	}
	if c := ev.Cleanup; c.FDsClosed != tc.fds || c.FilesRemoved != tc.files {
		t.Errorf("cleanup fds_closed %d files_removed %d, want %d and %d", c.FDsClosed, c.FilesRemoved, tc.fds, tc.files)
	}
	if len(r.dec.adopted)+len(r.dec.restored) != 0 {
		t.Errorf("the decoder adopted %v / restored %v on a fallback", r.dec.adopted, r.dec.restored)
	}
	if tc.prov == provHang {
		// The §2 invariant: the provider's process group is dead before
		// the request is forwarded.
		pid := readPID(t, r.pidFile)
		if !obtest.Gone(pid) {
			t.Errorf("provider %d still runs after the fallback", pid)
		}
	}
	checkAudit(t, r)
	r.dec.closeHeld()
	checkNoFDLeft(t, base)
}

// checkAudit forwards and finishes the request and has replay's auditor
// read its events: legal transitions, cleanup facts that cover what was
// received, one reason per fallback.
func checkAudit(t *testing.T, r *rig) {
	t.Helper()
	for _, ev := range []machine.Event{machine.EvForward, machine.EvFinish} {
		if err := r.m.Fire(ev, machine.Attrs{}); err != nil {
			t.Fatal(err)
		}
	}
	a := eventlog.NewAuditor()
	for i, e := range r.ev.Events() {
		a.Add(i+1, e)
	}
	if rep := a.Finish(); !rep.OK() {
		t.Errorf("the audit refuses the handoff's events: %+v", rep.Violations)
	}
}

// checkFallback asserts what every fallback has in common: the reason is
// on exactly one fallback event, the last one, with the step and cleanup;
// the machine is in fallback; the slot dir is empty.
func checkFallback(t *testing.T, r *rig, step, reason string) {
	t.Helper()
	if reason == "" {
		t.Fatalf("the handoff succeeded; events %+v", r.ev.Events())
	}
	if r.m.State() != machine.Fallback || r.m.Route() != machine.RouteFallback {
		t.Errorf("machine in %s on route %s, want fallback", r.m.State(), r.m.Route())
	}
	n := 0
	for _, e := range r.ev.Events() {
		if e.Event == string(machine.EvFallback) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d fallback events, want 1: %+v", n, r.ev.Events())
	}
	ev := lastEvent(r.ev)
	if ev.Event != string(machine.EvFallback) || ev.Reason != reason || ev.Step != step {
		t.Errorf("last event %s step %q reason %q; want fallback at step %q with the returned reason %q", ev.Event, ev.Step, ev.Reason, step, reason)
	}
	if ev.Cleanup == nil {
		t.Fatalf("the fallback event has no cleanup")
	}
	checkEmptyDir(t, r.dir)
}

func lastEvent(m *event.Mem) event.Event {
	evs := m.Events()
	if len(evs) == 0 {
		return event.Event{}
	}
	return evs[len(evs)-1]
}

func checkEmptyDir(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range ents {
		if ok, _ := filepath.Match("kvshare-*.sock", e.Name()); ok {
			continue // the slots' share sockets, kept until Close
		}
		t.Errorf("left in the slot dir: %s", e.Name())
	}
}

// checkNoFDLeft waits (bounded) for the fd count to come back to base: a
// leak never does.
func checkNoFDLeft(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for fdCount(t) != base {
		if time.Now().After(deadline) {
			t.Fatalf("%d fds open, %d before the handoff:\n%s", fdCount(t), base, fdList(t))
		}
		time.Sleep(5 * time.Millisecond) // polling interval
	}
}

// fdCount is the number of open fds of this process.
func fdCount(t testing.TB) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

func fdList(t testing.TB) string {
	es, _ := os.ReadDir("/proc/self/fd")
	var b strings.Builder
	for _, e := range es {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		fmt.Fprintf(&b, "  %s -> %s\n", e.Name(), l)
	}
	return b.String()
}

// warmUp runs one handoff of each route so that what the runtime opens once
// (the poller, a pidfd probe) is open before the cases count fds.
func warmUp(t *testing.T) {
	for _, file := range []bool{false, true} {
		r := newRig(t, file, provOK, false, 0, nil)
		if reason := r.h.Run(r.ctx, r.m, testTokens); reason != "" {
			t.Fatalf("warm-up handoff fell back: %s", reason)
		}
	}
}

// waitFile polls (bounded) until path exists; the caller's assertions fail
// if it never does.
func waitFile(path string, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for delay := time.Millisecond; time.Now().Before(deadline); delay = min(2*delay, 20*time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(delay) // polling interval
	}
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the provider's pid file: %v", err)
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// shortDir is a new slot dir whose socket paths fit sockaddr_un whatever
// the test's name (t.TempDir's paths carry it).
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ho")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
