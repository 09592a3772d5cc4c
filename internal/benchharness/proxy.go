package benchharness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy workload: a short prompt and a few generated tokens, so that the
// decoder is fast and onebitd's share of the time is visible.
const (
	ProxyPromptTokens = 16
	ProxyNPredict     = 4
	proxySlots        = 8
)

// ProxyConcurrency are the throughput runs of section b.
var ProxyConcurrency = []int{8, 64}

// Proxy targets: the decoder directly, a bare Go reverse proxy in front of
// it (the floor of any HTTP hop), onebitd's plain route.
const (
	TargetDirect  = "direct"
	TargetBare    = "bare proxy"
	TargetOnebitd = "onebitd"
)

// ProxyTargets in report order.
var ProxyTargets = []string{TargetDirect, TargetBare, TargetOnebitd}

// ProxyResult is section b: the plain route through onebitd against the
// decoder directly and against a bare reverse proxy, measured interleaved.
type ProxyResult struct {
	// Latency and TTFB (first byte of a streamed answer) at concurrency 1
	// per target; Added* are per-round differences: onebitd − direct, bare −
	// direct, onebitd − bare.
	Latency, TTFB              map[string]Summary
	Added, AddedBare, AddedOwn Summary
	TTFBAdded, TTFBAddedBare   Summary
	TTFBAddedOwn               Summary
	// AddedCmp and OwnCmp test the whole-request samples side by side
	// (onebitd vs direct, onebitd vs bare proxy; benchmath's U test).
	AddedCmp, OwnCmp Comparison
	Throughput       []ThroughputRow
}

// ThroughputRow is one concurrency level per target: requests per second,
// latency, and CPU time per request of each process (from /proc/PID/stat).
type ThroughputRow struct {
	Concurrency int
	RPS         map[string]float64
	Lat         map[string]Summary
	// CPU per request: the decoder, the proxy (bare or onebitd; 0 direct)
	// and the load generator.
	DecoderCPU, ProxyCPU, ClientCPU map[string]time.Duration
	Errors                          int
}

// plainStack is a simulator with proxySlots slots, a plain-route onebitd
// and a bare proxy in front of it.
type plainStack struct {
	sim, proc, bare          *Proc
	simURL, procURL, bareURL string
}

func (s *plainStack) close() {
	for _, p := range []*Proc{s.bare, s.proc, s.sim} {
		if p != nil {
			p.Stop()
		}
	}
}

func newPlainStack(ctx context.Context, c *Config, name string, bare bool) (*plainStack, error) {
	model, err := modelFile(c.WorkDir)
	if err != nil {
		return nil, err
	}
	s := &plainStack{}
	s.sim, s.simURL, err = startSim(ctx, c, model, "-c", "4096", "-np", fmt.Sprint(proxySlots), "--compact")
	if err != nil {
		return nil, err
	}
	s.proc, s.procURL, err = startOnebitd(ctx, c, s.simURL, filepath.Join(c.WorkDir, name))
	if err != nil {
		s.close()
		return nil, err
	}
	if bare {
		s.bare, s.bareURL, err = startBareProxy(ctx, s.simURL)
		if err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

func (s *plainStack) url(target string) string {
	switch target {
	case TargetBare:
		return s.bareURL + "/completion"
	case TargetOnebitd:
		return s.procURL + "/completion"
	}
	return s.simURL + "/completion"
}

func (s *plainStack) proxyPID(target string) int {
	switch target {
	case TargetBare:
		return s.bare.PID()
	case TargetOnebitd:
		return s.proc.PID()
	}
	return 0
}

// rounds sends n rounds of one request per target (order rotating each
// round) after 20 rounds of warm-up, and returns each target's durations
// (whole request, or to the first byte when first). A round with a failed
// request is dropped; more than 1 % of them (at least 3) fail the run.
func rounds(ctx context.Context, hc *http.Client, s *plainStack, n int, body []byte, first bool) (map[string][]time.Duration, error) {
	out := map[string][]time.Duration{}
	failed := 0
	for i := -20; i < n; i++ {
		got := map[string]time.Duration{}
		var err error
		for j := range ProxyTargets {
			t := ProxyTargets[(i+20+j)%len(ProxyTargets)]
			var r reply
			if r, err = post(ctx, hc, s.url(t), body); err != nil {
				break
			}
			got[t] = r.dur
			if first {
				got[t] = r.first
			}
		}
		if err != nil {
			if failed++; failed > max(3, n/100) || ctx.Err() != nil {
				return nil, err
			}
			continue
		}
		if i >= 0 {
			for t, d := range got {
				out[t] = append(out[t], d)
			}
		}
	}
	return out, nil
}

func diffs(a, b []time.Duration) Summary {
	d := make([]time.Duration, len(a))
	for i := range a {
		d[i] = a[i] - b[i]
	}
	return Summarize(d)
}

func runProxy(ctx context.Context, c *Config, log *slog.Logger) (*ProxyResult, error) {
	s, err := newPlainStack(ctx, c, "proxy", true)
	if err != nil {
		return nil, err
	}
	defer s.close()
	hc := newClient()
	text := promptText(ProxyPromptTokens)
	body, streamBody := completionBody(text, ProxyNPredict, false), completionBody(text, ProxyNPredict, true)
	res := &ProxyResult{Latency: map[string]Summary{}, TTFB: map[string]Summary{}}

	log.Info("proxy: latency at concurrency 1")
	lat, err := rounds(ctx, hc, s, c.count(500), body, false)
	if err != nil {
		return nil, err
	}
	log.Info("proxy: time to first streamed byte")
	ttfb, err := rounds(ctx, hc, s, c.count(300), streamBody, true)
	if err != nil {
		return nil, err
	}
	for _, t := range ProxyTargets {
		res.Latency[t], res.TTFB[t] = Summarize(lat[t]), Summarize(ttfb[t])
	}
	res.Added = diffs(lat[TargetOnebitd], lat[TargetDirect])
	res.AddedBare = diffs(lat[TargetBare], lat[TargetDirect])
	res.AddedOwn = diffs(lat[TargetOnebitd], lat[TargetBare])
	res.TTFBAdded = diffs(ttfb[TargetOnebitd], ttfb[TargetDirect])
	res.TTFBAddedBare = diffs(ttfb[TargetBare], ttfb[TargetDirect])
	res.TTFBAddedOwn = diffs(ttfb[TargetOnebitd], ttfb[TargetBare])
	res.AddedCmp = CompareDurations(lat[TargetOnebitd], lat[TargetDirect])
	res.OwnCmp = CompareDurations(lat[TargetOnebitd], lat[TargetBare])

	window := time.Duration(float64(2*time.Second) * min(c.Scale, 1))
	window = max(window, 300*time.Millisecond)
	self := os.Getpid()
	for _, conc := range ProxyConcurrency {
		log.Info("proxy: throughput", "concurrency", conc)
		row := ThroughputRow{Concurrency: conc, RPS: map[string]float64{}, Lat: map[string]Summary{},
			DecoderCPU: map[string]time.Duration{}, ProxyCPU: map[string]time.Duration{}, ClientCPU: map[string]time.Duration{}}
		lats := map[string][]time.Duration{}
		took := map[string]time.Duration{}
		cpu := map[string][3]time.Duration{}
		// Each target twice, in mirrored order, so each sees both ends of
		// the run.
		rev := slices.Clone(ProxyTargets)
		slices.Reverse(rev)
		order := append(slices.Clone(ProxyTargets), rev...)
		for _, t := range order {
			before := cpuOf(s.sim.PID(), s.proxyPID(t), self)
			l, d, errs, err := load(ctx, hc, s.url(t), body, conc, window, 200_000)
			if err != nil {
				return nil, err
			}
			after := cpuOf(s.sim.PID(), s.proxyPID(t), self)
			row.Errors += errs
			lats[t], took[t] = append(lats[t], l...), took[t]+d
			acc := cpu[t]
			for i := range acc {
				acc[i] += after[i] - before[i]
			}
			cpu[t] = acc
		}
		for _, t := range ProxyTargets {
			n := len(lats[t])
			row.RPS[t] = float64(n) / took[t].Seconds()
			row.Lat[t] = Summarize(lats[t])
			row.DecoderCPU[t] = cpu[t][0] / time.Duration(n)
			row.ProxyCPU[t] = cpu[t][1] / time.Duration(n)
			row.ClientCPU[t] = cpu[t][2] / time.Duration(n)
		}
		res.Throughput = append(res.Throughput, row)
	}
	return res, nil
}

// cpuOf is the CPU time of the decoder, the proxy (0 for none) and the
// load generator.
func cpuOf(decoder, proxy, client int) [3]time.Duration {
	var out [3]time.Duration
	for i, pid := range []int{decoder, proxy, client} {
		if pid > 0 {
			out[i], _ = CPUTime(pid)
		}
	}
	return out
}

// load runs conc workers posting body to url until window has passed or
// limit requests were sent; it returns each successful request's latency,
// the time taken and the number of failed requests.
func load(ctx context.Context, hc *http.Client, url string, body []byte, conc int, window time.Duration, limit int64) ([]time.Duration, time.Duration, int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu     sync.Mutex
		lat    []time.Duration
		errs   int
		issued atomic.Int64
		wg     sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(window)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			bad := 0
			for time.Now().Before(deadline) && issued.Add(1) <= limit && ctx.Err() == nil {
				r, err := post(ctx, hc, url, body)
				if err != nil {
					bad++
					continue
				}
				mine = append(mine, r.dur)
			}
			mu.Lock()
			lat, errs = append(lat, mine...), errs+bad
			mu.Unlock()
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return nil, 0, 0, err
	}
	if len(lat) == 0 {
		return nil, 0, errs, fmt.Errorf("%w: no request to %s succeeded", ErrBadResponse, url)
	}
	return lat, took, errs, nil
}
