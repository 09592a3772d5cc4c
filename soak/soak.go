package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/onebitd/onebitd/internal/simfault"
	"github.com/onebitd/onebitd/internal/simkv"
)

// Errors of the package.
var (
	// ErrConfig: the configuration cannot run (a missing binary, a bad value).
	ErrConfig = errors.New("soak: invalid configuration")
	// ErrStart: a stack did not start.
	ErrStart = errors.New("soak: a stack did not start")
)

// Config is one soak run.
type Config struct {
	Duration time.Duration // how long requests are sent (the checks come after)
	Onebitd  string        // the onebitd binary
	Sim      string        // onebit-decoder-sim
	Provider string        // onebit-provider-sim
	Seed     uint64        // the fault decks and prompts (0: from the clock)
	NPredict int           // tokens per answer (default 12)
	MaxReqs  int           // most requests per stack (default 100000)
	Log      io.Writer     // progress lines (nil: none)
	KeepDir  bool          // keep the temp dir (state dirs, event logs) for a post-mortem
}

// Timeouts the stacks run with: small, so that a hang costs seconds.
const (
	providerTimeout = 2 * time.Second
	acceptTimeout   = time.Second
	shareTimeout    = 3 * time.Second
	applyTimeout    = 5 * time.Second
	shareSlowDelay  = 1500 * time.Millisecond // > acceptTimeout, < shareTimeout
	provSlowDelay   = 300 * time.Millisecond  // < providerTimeout: succeeds
	requestTimeout  = 60 * time.Second        // an answer later than this is a hang
	terminalWait    = 10 * time.Second        // the log names the request's end
	settleWait      = 10 * time.Second        // fds, files and children back
	restartWait     = 60 * time.Second        // a killed decoder serves again
)

var reOnebitd = regexp.MustCompile(`"msg":"onebitd serving".*"listen":"(http://[^"]+)"`)

// stack is one onebitd with its launched decoder (and provider).
type stack struct {
	name     string
	route    string // plain, file, shared
	warm     bool
	dir      string // state dir
	slotDir  string
	p        *proc
	url      string
	log      *logTail
	baseline fds
	baseSock []string // describeSockets at the baseline
}

// Run runs a soak and returns its report; the error is for a soak that could
// not run (a violation is in the report).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.NPredict == 0 {
		cfg.NPredict = 12
	}
	if cfg.MaxReqs == 0 {
		cfg.MaxReqs = 100000
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	for _, b := range []string{cfg.Onebitd, cfg.Sim, cfg.Provider} {
		if fi, err := os.Stat(b); err != nil || fi.IsDir() {
			return nil, fmt.Errorf("%w: binary %q: %v", ErrConfig, b, err)
		}
	}
	root, err := os.MkdirTemp("", "onebit-soak-")
	if err != nil {
		return nil, err
	}
	if !cfg.KeepDir {
		defer os.RemoveAll(root)
	}
	model := filepath.Join(root, "model.gguf")
	if err := os.WriteFile(model, []byte("GGUF-SIM model soak\n"), 0o600); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, root: root, model: model, rep: newReport(cfg), hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
	r.rep.Dir = root
	defer r.hc.CloseIdleConnections()
	r.handoffAlways = supportsHandoffFlag(cfg.Onebitd)

	// Parent-death signals fire when the thread that started the child
	// exits: keep this one for the whole run.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer r.stopAll()
	for _, s := range []*stack{
		{name: "plain", route: "plain"},
		{name: "file", route: "file"},
		{name: "shared", route: "shared"},
		{name: "shared-warm", route: "shared", warm: true},
	} {
		if err := r.start(s); err != nil {
			return nil, err
		}
		r.stacks = append(r.stacks, s)
	}
	r.plain = r.stacks[0]
	work := r.stacks[1:]
	for _, s := range work {
		if err := r.warmUp(ctx, s); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(cfg.Log, "soak: %d stacks up (seed %d), sending requests for %v\n", len(r.stacks), cfg.Seed, cfg.Duration)

	t0 := time.Now()
	deadline := t0.Add(cfg.Duration)
	var wg sync.WaitGroup
	for i, s := range work {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.loop(ctx, s, rand.New(rand.NewPCG(cfg.Seed, uint64(i+1))), deadline)
		}()
	}
	progress := time.NewTicker(30 * time.Second)
	stopProgress := make(chan struct{})
	go func() {
		for {
			select {
			case <-progress.C:
				fmt.Fprintf(cfg.Log, "soak: %v: %d requests\n", time.Since(t0).Round(time.Second), r.rep.total())
			case <-stopProgress:
				return
			}
		}
	}()
	wg.Wait()
	progress.Stop()
	close(stopProgress)
	r.rep.Elapsed = time.Since(t0)
	fmt.Fprintf(cfg.Log, "soak: %d requests in %v; final checks\n", r.rep.total(), r.rep.Elapsed.Round(time.Second))
	r.finalChecks(work)
	return r.rep, nil
}

type runner struct {
	cfg           Config
	root, model   string
	hc            *http.Client
	rep           *Report
	stacks        []*stack
	plain         *stack
	handoffAlways bool

	plainMu sync.Mutex
	plainAn map[string]string
}

// supportsHandoffFlag reports whether onebitd has --handoff (then the soak
// passes --handoff always, so that every request tries the handoff).
func supportsHandoffFlag(bin string) bool {
	out, _ := exec.Command(bin, "serve", "-h").CombinedOutput()
	return strings.Contains(string(out), "-handoff ")
}

func (r *runner) start(s *stack) error {
	s.dir = filepath.Join(r.root, s.name)
	s.slotDir = filepath.Join(s.dir, "slots")
	if err := os.MkdirAll(s.slotDir, 0o700); err != nil {
		return err
	}
	args := []string{"serve", "--listen", "127.0.0.1:0", "--state-dir", s.dir, "--slot-dir", s.slotDir,
		"--model", r.model, "--log-format", "json", "--nats-listen", "off", "--node", "soak-" + s.name,
		"--provider-timeout", providerTimeout.String(), "--accept-timeout", acceptTimeout.String(),
		"--share-timeout", shareTimeout.String(), "--adopt-timeout", applyTimeout.String()}
	dec := []string{"-c", "8192", "--compact"}
	if s.route != "plain" {
		args = append(args, "--provider", r.cfg.Provider, "--provider-arg=--compact",
			"--provider-arg=--fault-from-prompt", "--provider-arg=--fault-delay="+provSlowDelay.String())
		if r.handoffAlways {
			args = append(args, "--handoff", "always")
		}
		dec = append(dec, "--fault-from-prompt", "--fault-delay", shareSlowDelay.String())
	}
	if s.route == "shared" {
		args = append(args, "--kv-share")
	}
	if s.warm {
		args = append(args, "--provider-mode", "serve")
	}
	args = append(append(args, "--decoder-bin", r.cfg.Sim, "--"), dec...)
	p, url, err := startProc("onebitd "+s.name, r.cfg.Onebitd, reOnebitd, 60*time.Second, args...)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStart, err)
	}
	s.p, s.url = p, url
	s.log = newLogTail(filepath.Join(s.dir, "events.jsonl"))
	if !poll(restartWait, func() bool { return r.ready(s) }) {
		return fmt.Errorf("%w: %s: /health never answered 200", ErrStart, s.name)
	}
	return nil
}

// warmUp sends fault-free requests through every entry point, streamed and
// not, then takes onebitd's fd baseline.
func (r *runner) warmUp(ctx context.Context, s *stack) error {
	for _, ep := range entries {
		for _, stream := range []bool{false, true} {
			p := basePrompt(r.cfg.Seed, 0)
			a, err := complete(ctx, r.hc, s.url, ep, stream, p, r.cfg.NPredict, nil)
			if err != nil || a.status != http.StatusOK {
				return fmt.Errorf("%w: %s: warm-up %s: %v %d %s", ErrStart, s.name, ep, err, a.status, a.body)
			}
			if !r.waitTerminal(s, a.reqID) {
				return fmt.Errorf("%w: %s: warm-up request %s never ended in the event log", ErrStart, s.name, a.reqID)
			}
		}
	}
	r.hc.CloseIdleConnections()
	var err error
	ok := poll(settleWait, func() bool {
		s.baseline, err = countFDs(s.p.pid())
		return err == nil && s.baseline.memfds == 0 && len(r.unexpectedChildren(s, true)) == 0
	})
	if !ok {
		return fmt.Errorf("%w: %s: no quiet baseline after the warm-up (%v, %v)", ErrStart, s.name, s.baseline, err)
	}
	s.baseline, _ = countFDs(s.p.pid())
	s.baseSock = describeSockets(s.p.pid())
	r.rep.baseline(s.name, s.baseline)
	return nil
}

// loop sends one request at a time until deadline (or MaxReqs), each with a
// fault drawn from a shuffled deck of the faults that apply to the stack.
func (r *runner) loop(ctx context.Context, s *stack, rng *rand.Rand, deadline time.Time) {
	var deck []*Fault
	for n := 0; n < r.cfg.MaxReqs && time.Now().Before(deadline) && ctx.Err() == nil; n++ {
		if len(deck) == 0 {
			for i := range Faults {
				f := &Faults[i]
				if f.Shared && s.route != "shared" {
					continue
				}
				copies := 1
				if f.Marker == simfault.None && f.Harness == hNone {
					copies = noneCopies
				}
				for range copies {
					deck = append(deck, f)
				}
			}
			rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		f := deck[0]
		deck = deck[1:]
		r.one(ctx, s, f, rng)
	}
}

// basePrompt is the i-th of a few deterministic prompts of 150-300 tokens in
// the simulator's tokenizer.
func basePrompt(seed uint64, i int) string {
	rng := rand.New(rand.NewPCG(seed, uint64(1000+i)))
	vocab := []string{"the", "cache", "of", "decoder", "slot", "token", "prefill", "and", "is", "water"}
	n := 150 + rng.IntN(150)
	var b strings.Builder
	for tok := 0; tok < n; {
		if rng.IntN(3) == 0 {
			fmt.Fprintf(&b, " %c%c%c", 'k'+rng.IntN(10), 'a'+rng.IntN(26), 'a'+rng.IntN(26))
			tok += 4
		} else {
			b.WriteString(" " + vocab[rng.IntN(len(vocab))])
			tok++
		}
	}
	return b.String()
}

const nBasePrompts = 6

// promptFor is base prompt i with f's marker after its first word.
func promptFor(seed uint64, i int, f *Fault) string {
	p := basePrompt(seed, i)
	if f.Marker == simfault.None {
		return p
	}
	j := strings.IndexByte(p[1:], ' ') + 1
	return p[:j] + " " + simfault.Marker(f.Marker) + p[j:]
}

// plainAnswer is the plain route's text for (prompt, ep), computed once.
func (r *runner) plainAnswer(ctx context.Context, prompt string, ep Entry) (string, error) {
	key := string(ep) + "\x00" + prompt
	r.plainMu.Lock()
	defer r.plainMu.Unlock()
	if r.plainAn == nil {
		r.plainAn = make(map[string]string)
	}
	if t, ok := r.plainAn[key]; ok {
		return t, nil
	}
	cctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	a, err := complete(cctx, r.hc, r.plain.url, ep, false, prompt, r.cfg.NPredict, nil)
	if err != nil || a.status != http.StatusOK || a.bad != "" || a.route != "plain" {
		return "", fmt.Errorf("plain answer: %v status %d route %q %s %s", err, a.status, a.route, a.bad, a.body)
	}
	r.plainAn[key] = a.text
	return a.text, nil
}

// minStreamTokens is the shortest answer a mid-stream fault is tried on.
const minStreamTokens = 4

// longAnswerPrompt is the first of the base prompts (from i on) with f's
// marker whose plain answer through ep has at least minStreamTokens tokens.
func (r *runner) longAnswerPrompt(ctx context.Context, f *Fault, ep Entry, i int) (string, error) {
	for k := range nBasePrompts {
		p := promptFor(r.cfg.Seed, (i+k)%nBasePrompts, f)
		text, err := r.plainAnswer(ctx, p, ep)
		if err != nil {
			return "", err
		}
		if len(simkv.Tokenize(text, false)) >= minStreamTokens {
			return p, nil
		}
	}
	return "", fmt.Errorf("no base prompt has a plain answer of %d tokens through %s (seed %d)", minStreamTokens, ep, r.cfg.Seed)
}

// one sends one request with fault f and checks it.
func (r *runner) one(ctx context.Context, s *stack, f *Fault, rng *rand.Rand) {
	ep := entries[rng.IntN(len(entries))]
	stream := f.Harness != hNone || rng.IntN(2) == 0
	prompt := promptFor(r.cfg.Seed, rng.IntN(nBasePrompts), f)
	// The plain answer is fetched first: the stacks are independent, and
	// a gen-500 prompt on the plain stack is plain text (no fault switch).
	var want string
	if f.Expect == outIdentical {
		var err error
		if want, err = r.plainAnswer(ctx, prompt, ep); err != nil {
			r.rep.add(s.name, f, ep, stream, outViolation, "", false, err.Error())
			return
		}
	}
	if f.Harness != hNone {
		// Mid-stream needs a stream that lasts: a prompt whose answer
		// is several tokens long (a greedy answer may end at once).
		var err error
		if prompt, err = r.longAnswerPrompt(ctx, f, ep, rng.IntN(nBasePrompts)); err != nil {
			r.rep.add(s.name, f, ep, stream, outViolation, "", false, err.Error())
			return
		}
	}
	// One request at a time, on a stack at rest: the warm provider may be
	// waiting out its restart backoff after a hang killed it.
	if !poll(2*settleWait, func() bool { return r.ready(s) }) {
		r.rep.add(s.name, f, ep, stream, outViolation, "", false, fmt.Sprintf("%s: not ready (/health) in %v", s.name, 2*settleWait))
		return
	}
	var killed int
	mid := func() bool {
		switch f.Harness {
		case hClientGone:
			return true
		case hKillDecoder:
			killed = r.decoderPID(s)
			if killed > 0 {
				_ = syscall.Kill(killed, syscall.SIGKILL)
			}
		}
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, requestTimeout)
	a, err := complete(cctx, r.hc, s.url, ep, stream, prompt, r.cfg.NPredict, mid)
	hung := cctx.Err() != nil && ctx.Err() == nil
	cancel()

	what := fmt.Sprintf("%s %s stream=%v req %s", s.name, ep, stream, a.reqID)
	got, why := outViolation, ""
	switch {
	case hung:
		why = fmt.Sprintf("%s: no answer in %v (a hang)", what, requestTimeout)
	case err != nil:
		why = fmt.Sprintf("%s: %v", what, err)
	case a.bad != "":
		why = fmt.Sprintf("%s: %s: %s", what, a.bad, a.body)
	case a.left:
		got = outClientLeft
	case a.status == http.StatusOK && !a.errEvent:
		if f.Expect == outIdentical && a.text != want {
			why = fmt.Sprintf("%s: text %q, plain %q", what, tail(a.text), tail(want))
		} else {
			got = outIdentical
		}
	case a.errShape:
		got = outCleanError
	default:
		why = fmt.Sprintf("%s: status %d, not llama-server's error shape: %s", what, a.status, a.body)
	}
	if got != outViolation && got != f.Expect {
		why = fmt.Sprintf("%s: outcome %s, want %s (status %d %s)", what, got, f.Expect, a.status, a.body)
		got = outViolation
	}
	if f.Harness == hKillDecoder && killed == 0 && got != outViolation {
		why, got = what+": no decoder to kill", outViolation
	}
	if got != outViolation && f.Fallback && a.route != "fallback" {
		why, got = fmt.Sprintf("%s: route %q, want fallback (the fault did not fire)", what, a.route), outViolation
	}
	if got != outViolation && !f.Fallback && a.route != s.route {
		why, got = fmt.Sprintf("%s: route %q, want %s (nothing in this request should fail the handoff)", what, a.route, s.route), outViolation
	}
	if a.reqID == "" && got != outViolation {
		why, got = what+": no X-Onebit-Request-Id", outViolation
	}
	// The request must end in the log; then nothing of it may remain.
	if a.reqID != "" {
		if !r.waitTerminal(s, a.reqID) {
			why, got = joinWhy(why, fmt.Sprintf("%s: not terminal in the event log after %v (%+v)", what, terminalWait, s.log.get(a.reqID))), outViolation
		} else if st := s.log.get(a.reqID); f.Fallback && got != outViolation && !slices.Contains(f.Steps, st.step) {
			why, got = fmt.Sprintf("%s: fell back at step %q (%s), not at the fault's %v: the fault did not fire", what, st.step, st.reason, f.Steps), outViolation
		}
	}
	if f.Harness == hKillDecoder && !poll(restartWait, func() bool { return r.ready(s) }) {
		why, got = joinWhy(why, what+": the decoder was not serving again after "+restartWait.String()), outViolation
	}
	leak := r.settled(s, false)
	if leak != "" {
		why = joinWhy(why, what+": "+leak)
	}
	step := ""
	if st := s.log.get(a.reqID); st != nil {
		step = st.step
	}
	r.rep.add(s.name, f, ep, stream, got, routeOf(a.route, step), leak != "", why)
}

func joinWhy(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// routeOf is the route column's key: the route, with the failed step of a
// fallback.
func routeOf(route, step string) string {
	if route == "fallback" && step != "" {
		return "fallback@" + step
	}
	if route == "" {
		return "-"
	}
	return route
}

// ready reports whether s's /health answers 200 and, on a warm stack,
// names the warm provider ready.
func (r *runner) ready(s *stack) bool {
	ok, provider := health(r.hc, s.url)
	return ok && (!s.warm || provider == "ok")
}

func (r *runner) waitTerminal(s *stack, id string) bool {
	return poll(terminalWait, func() bool {
		_ = s.log.update()
		return s.log.get(id).terminal()
	})
}

// decoderPID is the pid of s's launched decoder (0 when none runs).
func (r *runner) decoderPID(s *stack) int {
	for _, pid := range children(s.p.pid()) {
		if !zombie(pid) && strings.HasPrefix(cmdline(pid), r.cfg.Sim+" ") {
			return pid
		}
	}
	return 0
}

// unexpectedChildren describes what is wrong with s's children: exactly one
// decoder, plus the warm provider on a warm stack (between requests it may
// be waiting out its restart backoff, up to 10 s; at rest it must run).
func (r *runner) unexpectedChildren(s *stack, atRest bool) []string {
	var bad []string
	nDec, nWarm := 0, 0
	for _, pid := range children(s.p.pid()) {
		if zombie(pid) {
			bad = append(bad, fmt.Sprintf("zombie %d", pid))
			continue
		}
		cl := cmdline(pid)
		switch {
		case strings.HasPrefix(cl, r.cfg.Sim+" "):
			nDec++
		case s.warm && strings.HasPrefix(cl, r.cfg.Provider+" ") && strings.Contains(cl, "--serve"):
			nWarm++
		default:
			bad = append(bad, fmt.Sprintf("%d %s", pid, truncate(cl, 120)))
		}
	}
	if nDec != 1 {
		bad = append(bad, fmt.Sprintf("%d decoders", nDec))
	}
	if nWarm > 1 || (s.warm && atRest && nWarm == 0) {
		bad = append(bad, fmt.Sprintf("%d warm providers", nWarm))
	}
	return bad
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// slotDirLeftovers lists the slot dir's files other than kvshare-*.sock.
func slotDirLeftovers(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if ok, _ := filepath.Match("kvshare-*.sock", e.Name()); !ok {
			out = append(out, e.Name())
		}
	}
	return out
}

// settled waits until s is back at rest after a request: no file left in
// the slot dir, no memfd and no more non-socket fds than the baseline, the
// expected children. It returns what is still wrong after settleWait.
func (r *runner) settled(s *stack, atRest bool) string {
	var last string
	wait := settleWait
	if atRest {
		wait = 2 * settleWait // the warm provider's backoff is at most 10 s
	}
	ok := poll(wait, func() bool {
		var bad []string
		if left := slotDirLeftovers(s.slotDir); len(left) > 0 {
			bad = append(bad, fmt.Sprintf("slot dir holds %v", left))
		}
		f, err := countFDs(s.p.pid())
		if err != nil {
			bad = append(bad, fmt.Sprintf("onebitd's fds: %v", err))
		} else if f.memfds > 0 || f.other > s.baseline.other {
			bad = append(bad, fmt.Sprintf("onebitd holds %v fds, baseline %v", f, s.baseline))
		}
		if c := r.unexpectedChildren(s, atRest); len(c) > 0 {
			bad = append(bad, fmt.Sprintf("children: %v", c))
		}
		last = strings.Join(bad, "; ")
		return len(bad) == 0
	})
	if ok {
		return ""
	}
	return last
}

// finalChecks: every stack at rest with its fds (sockets included) back at
// the baseline, no process of the run but the stacks and their expected
// children, every request terminal; then each onebitd stops on SIGTERM
// (exit 0, nothing left running) and `onebitd replay` passes on its log.
func (r *runner) finalChecks(work []*stack) {
	r.hc.CloseIdleConnections()
	for _, s := range work {
		c := &r.rep.stack(s.name).Final
		c.Settled = r.settled(s, true)
		var f fds
		ok := poll(settleWait, func() bool {
			f, _ = countFDs(s.p.pid())
			return f.total() <= s.baseline.total() && f.memfds == 0
		})
		c.FDs = f
		if !ok {
			c.FDLeak = fmt.Sprintf("onebitd holds %v fds, baseline %v; sockets %v, at the baseline %v",
				f, s.baseline, describeSockets(s.p.pid()), s.baseSock)
		}
		_ = s.log.update()
		c.Open = s.log.open()
		c.Requests = s.log.count()
	}
	// Every process of the run is a stack's onebitd or one of its children.
	stacks := map[int]bool{}
	for _, s := range r.stacks {
		stacks[s.p.pid()] = true
	}
	for _, pid := range procsMentioning(r.root, stacks) {
		if !stacks[ppid(pid)] {
			r.rep.Orphans = append(r.rep.Orphans, fmt.Sprintf("%d (parent %d) %s", pid, ppid(pid), truncate(cmdline(pid), 120)))
		}
	}
	for _, s := range r.stacks {
		code := s.p.stop(30 * time.Second)
		if s.route == "plain" {
			continue
		}
		c := &r.rep.stack(s.name).Final
		c.ExitCode = code
		mine := s.dir + string(filepath.Separator) // not shared-warm's when s is shared
		if !poll(settleWait, func() bool { return len(procsMentioning(mine, nil)) == 0 }) {
			c.AfterExit = fmt.Sprintf("still running after onebitd exited: %v", procsMentioning(mine, nil))
		}
		out, err := exec.Command(r.cfg.Onebitd, "replay", filepath.Join(s.dir, "events.jsonl")).CombinedOutput()
		c.Replay = "pass"
		if err != nil {
			c.Replay = fmt.Sprintf("FAIL (%v): %s", err, tail(string(out)))
		}
	}
	if o := procsMentioning(r.root, nil); len(o) > 0 {
		r.rep.Orphans = append(r.rep.Orphans, fmt.Sprintf("after every onebitd exited: %v", o))
	}
	slices.Sort(r.rep.Orphans)
}

// stopAll stops every stack still running (the deferred cleanup of Run).
func (r *runner) stopAll() {
	for _, s := range r.stacks {
		s.p.stop(10 * time.Second)
	}
}
