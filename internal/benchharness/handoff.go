package benchharness

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
	"github.com/onebitd/onebitd/handlers"
	"github.com/onebitd/onebitd/handoff"
	"github.com/onebitd/onebitd/machine"
	"github.com/onebitd/onebitd/provider"
	"github.com/onebitd/onebitd/slots"
)

// HandoffSizes are the prompt lengths of section a (tokens, BOS included).
var HandoffSizes = []int{251, 3189, 12722}

// Handoff geometry: -c 20480 with the sim's default 114688-byte cells is
// 2240 MiB of KV (3 memfd chunks of at most 1 GiB).
const (
	HandoffCtx      = 20480
	HandoffCellSize = 114688
)

// Phases of the handoff, named after the event that ends them.
const (
	PhaseListen  = "listen"  // received → listen: the share socket is bound
	PhaseShare   = "share"   // listen → share: ?action=share answered, message received and checked
	PhasePrefill = "prefill" // → prefill: tokens (and layout) files written, provider run
	PhaseAdopt   = "adopt"   // prefill → adopt: ?action=adopt answered, fds closed, files removed
	PhaseRestore = "restore" // prefill → restore: ?action=restore answered, files removed
	PhaseForward = "forward" // adopt/restore → forward: the request is on its way to the decoder
)

// routePhases are the phases of each route, in order.
var routePhases = map[string][]string{
	string(machine.RouteShared): {PhaseListen, PhaseShare, PhasePrefill, PhaseAdopt, PhaseForward},
	string(machine.RouteFile):   {PhasePrefill, PhaseRestore, PhaseForward},
}

// phaseCall is the outside call inside each phase, subtracted to get
// onebitd's own time.
var phaseCall = map[string]string{PhaseShare: opShare, PhasePrefill: opProvider, PhaseAdopt: opAdopt, PhaseRestore: opRestore}

// HandoffRow is one route at one prompt length.
type HandoffRow struct {
	Route  string
	Tokens int
	// Raw is each phase of the onebitd process, from its event log.
	Raw map[string]Summary
	// Handoff is the decoder-facing handoff of the onebitd process (shared:
	// share + adopt phases; file: restore phase), raw: decoder work included.
	Handoff Summary
	// Client is the whole request as the client saw it (onebitd process).
	Client Summary
	// InRaw and Own are the same phases of the in-process onebitd: raw, and
	// minus the outside call inside each (decoder round trip, provider run),
	// per request.
	InRaw map[string]Summary
	Own   map[string]Summary
	// Handling is onebitd's own time around the decoder's handoff calls
	// (shared: listen + share + adopt; file: restore), OwnTotal every phase.
	Handling Summary
	OwnTotal Summary
	// RTT is the decoder round trip per call (share, adopt, restore,
	// tokenize); Reported the decoder's own timings.*_ms of its reply.
	RTT      map[string]Summary
	Reported map[string]Summary
	Provider Summary
	// Fallbacks counts requests that did not take the route (not sampled).
	Fallbacks int
	// Per-round values (round index → value) behind the paired ratios:
	// RawRounds per phase and HandoffRounds from the onebitd process,
	// HandlingRounds from the in-process onebitd.
	RawRounds      map[string]Rounds
	HandoffRounds  Rounds
	HandlingRounds Rounds
	// With a warm provider (in-process): the provider's own reported
	// prefill_ms, the prefill phase minus it, and the whole request (client
	// side) minus it, per request.
	ProviderReported, PrefillOverhead, WholeOverReported Summary
}

// HandoffResult is section a.
type HandoffResult struct {
	Rows     []HandoffRow
	Rounds   int
	CellSize int    // the simulator's KV cell size in bytes
	SlotFS   string // file system of the slot directories, from /proc/mounts
	// Warm is the warm provider's figures (DESIGN §2c), or why they are
	// missing.
	Warm *WarmResult
}

// Row finds the row of route at tokens.
func (r *HandoffResult) Row(route string, tokens int) *HandoffRow {
	for i := range r.Rows {
		if r.Rows[i].Route == route && r.Rows[i].Tokens == tokens {
			return &r.Rows[i]
		}
	}
	return nil
}

// handoffStack is one route: a simulator, a onebitd process and an
// in-process onebitd (the same packages, outside calls timed) in front of
// the same simulator. Requests are sent one at a time.
type handoffStack struct {
	route    string // machine route
	label    string // the rows' Route: the route, or RouteSharedWarm
	warm     bool   // --provider-mode serve: one warm provider
	sim      *Proc
	proc     *Proc
	procURL  string
	stateDir string
	slotDir  string
	inURL    string
	calls    *callLog
	events   *eventsByRequest
	stops    []func()
	sent     int // requests sent to this stack's decoder slot: the prompt variant alternates
}

func (s *handoffStack) close() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
	s.stops = nil
}

// RouteSharedWarm labels the rows of the shared route with a warm provider
// (--provider-mode serve).
const RouteSharedWarm = "shared, warm provider"

func newHandoffStack(ctx context.Context, c *Config, route machine.Route, warm bool, model string) (_ *handoffStack, err error) {
	name := string(route)
	s := &handoffStack{route: string(route), label: string(route), warm: warm, calls: &callLog{}, events: &eventsByRequest{}}
	if warm {
		name, s.label = string(route)+"-warm", RouteSharedWarm
	}
	s.stateDir = filepath.Join(c.WorkDir, "handoff-"+name)
	if err := os.MkdirAll(s.stateDir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	slotDir := filepath.Join(s.stateDir, "slots")
	if c.SlotBase != "" {
		d, err := os.MkdirTemp(c.SlotBase, "onebit-bench-slots-")
		if err != nil {
			return nil, err
		}
		s.stops = append(s.stops, func() { _ = os.RemoveAll(d) })
		slotDir = filepath.Join(d, name)
	}
	if err := os.MkdirAll(slotDir, 0o700); err != nil {
		return nil, err
	}
	s.slotDir = slotDir
	cell := c.cellSize()
	sim, simURL, err := startSim(ctx, c, model, "-c", fmt.Sprint(HandoffCtx), "-np", "1", "--cell-size", fmt.Sprint(cell), "--slot-save-path", slotDir)
	if err != nil {
		return nil, err
	}
	s.sim = sim
	s.stops = append(s.stops, sim.Stop)
	provArgs := []string{"--cell-size=" + fmt.Sprint(cell)} // the provider writes cells of the decoder's size
	args := []string{"--slot-dir", slotDir, "--provider", c.bin("onebit-provider-sim"), "--model", model, "--provider-arg=" + provArgs[0]}
	if route == machine.RouteShared {
		args = append(args, "--kv-share")
	}
	if warm {
		args = append(args, "--provider-mode", "serve")
	}
	s.proc, s.procURL, err = startOnebitd(ctx, c, simURL, s.stateDir, args...)
	if err != nil {
		return nil, err
	}
	s.stops = append(s.stops, s.proc.Stop)

	// The in-process onebitd: serve's wiring with the outside calls timed.
	dec, err := decoder.New(simURL, &http.Client{Transport: &timedTransport{base: decoder.NewTransport(), log: s.calls}})
	if err != nil {
		return nil, err
	}
	w, _, err := eventlog.Open(filepath.Join(s.stateDir, "inproc-events.jsonl"), eventlog.SyncBatch, nil)
	if err != nil {
		return nil, err
	}
	s.stops = append(s.stops, func() { _ = w.Close() })
	b, err := bus.Open(ctx, bus.Config{Listen: bus.ListenOff, Node: "bench-inproc"})
	if err != nil {
		return nil, err
	}
	s.stops = append(s.stops, func() { _ = b.Close() })
	var inner handoff.Provider = handoff.Exec{Runner: &provider.Runner{Path: c.bin("onebit-provider-sim"), Args: provArgs, Timeout: 60 * time.Second}}
	if warm {
		wp, err := provider.StartWarm(ctx, provider.WarmConfig{Path: c.bin("onebit-provider-sim"), Args: provArgs, Socket: filepath.Join(s.stateDir, "inproc-provider.sock"),
			Timeout: 60 * time.Second, Logger: slog.New(&reportedPrefill{log: s.calls})})
		if err != nil {
			return nil, fmt.Errorf("warm provider: %w", err)
		}
		s.stops = append(s.stops, func() { _ = wp.Stop() })
		inner = handoff.Warm{W: wp}
	}
	prov := &timedProvider{p: inner, log: s.calls}
	// The onebitd process listens on the slot's share socket in slotDir;
	// the in-process copy has its own (the share body names the path the
	// decoder connects to).
	inSlotDir := slotDir
	if route == machine.RouteShared {
		inSlotDir = filepath.Join(slotDir, "inproc")
		if err := os.MkdirAll(inSlotDir, 0o700); err != nil {
			return nil, err
		}
	}
	h := handoff.NewHandoff(handoff.Config{SlotDir: inSlotDir, Model: model, Share: route == machine.RouteShared,
		CheckPeerCreds: true, PeerUID: os.Getuid()}, dec, prov, nil)
	if err := h.Listen(); err != nil {
		return nil, err
	}
	s.stops = append(s.stops, func() { _ = h.Close() })
	front, err := handlers.New(handlers.Config{
		Decoder: dec,
		Pool:    slots.New(1, 256),
		Handoff: h,
		Sink:    event.NewRecorder("bench-inproc", s.events, w, b),
	})
	if err != nil {
		return nil, err
	}
	url, stop, err := serveInProcess(front)
	if err != nil {
		return nil, err
	}
	s.inURL = url
	s.stops = append(s.stops, stop)
	return s, nil
}

// handoffSample is one request's measurements.
type handoffSample struct {
	id     string
	round  int
	client time.Duration
	calls  []call
}

func runHandoff(ctx context.Context, c *Config, log *slog.Logger) (*HandoffResult, error) {
	model, err := modelFile(c.WorkDir)
	if err != nil {
		return nil, err
	}
	var stacks []*handoffStack
	defer func() {
		for _, s := range stacks {
			s.close()
		}
	}()
	kinds := []struct {
		route machine.Route
		warm  bool
	}{{machine.RouteFile, false}, {machine.RouteShared, false}}
	warm := hasProviderModeServe(ctx, c.bin("onebitd"))
	if warm {
		kinds = append(kinds, struct {
			route machine.Route
			warm  bool
		}{machine.RouteShared, true})
	}
	for _, k := range kinds {
		s, err := newHandoffStack(ctx, c, k.route, k.warm, model)
		if err != nil {
			return nil, fmt.Errorf("handoff %s stack (warm provider %v): %w", k.route, k.warm, err)
		}
		stacks = append(stacks, s)
	}
	// Two variants per size, sent in turn, so that no request finds its
	// prompt already in the slot.
	bodies := map[int][2][]byte{}
	for _, n := range HandoffSizes {
		var b [2][]byte
		for v := range b {
			text := promptVariant(n, v)
			if got := promptTokens(text); got != n {
				return nil, fmt.Errorf("prompt of %d tokens has %d", n, got)
			}
			b[v] = completionBody(text, 1, false)
		}
		bodies[n] = b
	}
	hc := newClient()
	type key struct {
		route  string
		tokens int
		inproc bool
	}
	samples := map[key][]handoffSample{}
	fallbacks := map[key]int{}
	one := func(s *handoffStack, n int, inproc bool, round int) error {
		url := s.procURL
		if inproc {
			url = s.inURL
		}
		s.calls.take()
		s.sent++ // the slot's last prompt was the other variant
		r, err := post(ctx, hc, url+"/completion", bodies[n][s.sent%2])
		if err != nil {
			return fmt.Errorf("%s route, %d tokens: %w", s.label, n, err)
		}
		calls := s.calls.take()
		k := key{s.label, n, inproc}
		if r.route != s.route || r.promptN != 1 {
			fallbacks[k]++
			log.Warn("handoff did not take the route", "route", s.label, "tokens", n, "got", r.route, "prompt_n", r.promptN)
			return nil
		}
		if round >= 0 {
			samples[k] = append(samples[k], handoffSample{id: r.id, round: round, client: r.dur, calls: calls})
		}
		return nil
	}
	rounds := c.count(30)
	if c.CPUProfile != "" {
		f, err := os.Create(c.CPUProfile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}
	for round := -2; round < rounds; round++ { // two rounds of warm-up
		if round%10 == 0 {
			log.Info("handoff", "round", max(round, 0), "of", rounds)
		}
		for _, n := range HandoffSizes {
			for _, s := range stacks {
				for _, inproc := range []bool{false, true} {
					if err := ctx.Err(); err != nil {
						return nil, err
					}
					if err := one(s, n, inproc, round); err != nil {
						return nil, err
					}
				}
			}
		}
	}

	res := &HandoffResult{Rounds: rounds, CellSize: c.cellSize(), SlotFS: fsOf(stacks[0].slotDir)}
	for _, s := range stacks {
		// onebitd flushes its event log when it stops.
		s.proc.Stop()
		logged := map[string][]event.Event{}
		if _, err := eventlog.ReadFile(filepath.Join(s.stateDir, "events.jsonl"), func(_ int, e event.Event) error {
			logged[e.RequestID] = append(logged[e.RequestID], e)
			return nil
		}); err != nil {
			return nil, fmt.Errorf("read %s route event log: %w", s.label, err)
		}
		for _, n := range HandoffSizes {
			row, err := handoffRow(s, n, samples[key{s.label, n, false}], samples[key{s.label, n, true}], logged)
			if err != nil {
				return nil, err
			}
			row.Fallbacks = fallbacks[key{s.label, n, false}] + fallbacks[key{s.label, n, true}]
			res.Rows = append(res.Rows, row)
		}
	}
	res.Warm = warmResult(res, warm)
	return res, nil
}

// phasesOf is each phase's duration from a request's events (elapsed_us).
func phasesOf(route string, evs []event.Event) (map[string]time.Duration, error) {
	at := map[string]int64{}
	for _, e := range evs {
		at[e.Event] = e.ElapsedUS
	}
	out := map[string]time.Duration{}
	prev := int64(0)
	for _, p := range routePhases[route] {
		t, ok := at[p]
		if !ok {
			return nil, fmt.Errorf("%w: %s route request lacks %q", ErrMissingEvents, route, p)
		}
		out[p] = time.Duration(t-prev) * time.Microsecond
		prev = t
	}
	return out, nil
}

// handoffPart is the decoder-facing part of the handoff per route.
func handoffPart(route string, ph map[string]time.Duration) time.Duration {
	if route == string(machine.RouteShared) {
		return ph[PhaseShare] + ph[PhaseAdopt]
	}
	return ph[PhaseRestore]
}

// handlingPart is onebitd's own handling around the decoder's handoff
// calls (the target of the shared route: share + adopt handling).
func handlingPart(route string, own map[string]time.Duration) time.Duration {
	if route == string(machine.RouteShared) {
		return own[PhaseListen] + own[PhaseShare] + own[PhaseAdopt]
	}
	return own[PhaseRestore]
}

func handoffRow(s *handoffStack, n int, proc, inproc []handoffSample, logged map[string][]event.Event) (HandoffRow, error) {
	row := HandoffRow{Route: s.label, Tokens: n, Raw: map[string]Summary{}, InRaw: map[string]Summary{}, Own: map[string]Summary{},
		RTT: map[string]Summary{}, Reported: map[string]Summary{}, RawRounds: map[string]Rounds{}, HandoffRounds: Rounds{}, HandlingRounds: Rounds{}}
	raw := map[string][]time.Duration{}
	var handoff, client []time.Duration
	for _, sm := range proc {
		ph, err := phasesOf(s.route, logged[sm.id])
		if err != nil {
			return row, fmt.Errorf("request %s: %w", sm.id, err)
		}
		for p, d := range ph {
			raw[p] = append(raw[p], d)
			if row.RawRounds[p] == nil {
				row.RawRounds[p] = Rounds{}
			}
			row.RawRounds[p][sm.round] = d
		}
		handoff = append(handoff, handoffPart(s.route, ph))
		row.HandoffRounds[sm.round] = handoffPart(s.route, ph)
		client = append(client, sm.client)
	}
	inRaw, own, rtt, rep := map[string][]time.Duration{}, map[string][]time.Duration{}, map[string][]time.Duration{}, map[string][]time.Duration{}
	var handling, total, prov, reported, overhead, whole []time.Duration
	for _, sm := range inproc {
		ph, err := phasesOf(s.route, s.events.get(sm.id))
		if err != nil {
			return row, fmt.Errorf("in-process request %s: %w", sm.id, err)
		}
		o := map[string]time.Duration{}
		var tot time.Duration
		for p, d := range ph {
			inRaw[p] = append(inRaw[p], d)
			if op, ok := phaseCall[p]; ok {
				cd, _ := sum(sm.calls, op)
				d -= cd
			}
			o[p] = d
			own[p] = append(own[p], d)
			tot += d
		}
		handling = append(handling, handlingPart(s.route, o))
		row.HandlingRounds[sm.round] = handlingPart(s.route, o)
		total = append(total, tot)
		for _, op := range []string{opTokenize, opShare, opAdopt, opRestore} {
			if d, r := sum(sm.calls, op); d > 0 {
				rtt[op] = append(rtt[op], d)
				if r > 0 {
					rep[op] = append(rep[op], r)
				}
			}
		}
		if d, _ := sum(sm.calls, opProvider); d > 0 {
			prov = append(prov, d)
		}
		if _, r := sum(sm.calls, opPrefillReported); r > 0 {
			reported = append(reported, r)
			overhead = append(overhead, ph[PhasePrefill]-r)
			whole = append(whole, sm.client-r)
		}
	}
	for p, ds := range raw {
		row.Raw[p] = Summarize(ds)
	}
	for p, ds := range inRaw {
		row.InRaw[p] = Summarize(ds)
	}
	for p, ds := range own {
		row.Own[p] = Summarize(ds)
	}
	for op, ds := range rtt {
		row.RTT[op] = Summarize(ds)
	}
	for op, ds := range rep {
		row.Reported[op] = Summarize(ds)
	}
	row.Handoff, row.Client = Summarize(handoff), Summarize(client)
	row.Handling, row.OwnTotal, row.Provider = Summarize(handling), Summarize(total), Summarize(prov)
	row.ProviderReported, row.PrefillOverhead, row.WholeOverReported = Summarize(reported), Summarize(overhead), Summarize(whole)
	return row, nil
}

// fsOf is "TYPE at MOUNTPOINT" of the mount holding path (/proc/mounts,
// longest mount point that is a prefix), or "" when unknown.
func fsOf(path string) string {
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return ""
	}
	best, typ := "", ""
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		mp := f[1]
		if (path == mp || strings.HasPrefix(path, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > len(best) {
			best, typ = mp, f[2]
		}
	}
	if best == "" {
		return ""
	}
	return typ + " at " + best
}

// cellSize is section a's KV cell size.
func (c *Config) cellSize() int {
	if c.CellSize > 0 {
		return c.CellSize
	}
	return HandoffCellSize
}
