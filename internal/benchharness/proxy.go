package benchharness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
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

// ProxyResult is section b: the plain route through onebitd against the
// decoder directly, measured interleaved.
type ProxyResult struct {
	// Latency at concurrency 1, one request of each in turn.
	Direct, Via Summary
	Added       Summary // per pair: via - direct
	// Time to the first byte of a streamed answer.
	DirectTTFB, ViaTTFB, AddedTTFB Summary
	Throughput                     []ThroughputRow
}

// ThroughputRow is one concurrency level: requests per second and
// latencies, direct and through onebitd.
type ThroughputRow struct {
	Concurrency           int
	DirectRPS, ViaRPS     float64
	DirectLat, ViaLat     Summary
	DirectCount, ViaCount int
	Errors                int
}

// plainStack is a simulator with proxySlots slots and a plain-route
// onebitd in front of it.
type plainStack struct {
	sim, proc       *Proc
	simURL, procURL string
}

func (s *plainStack) close() {
	if s.proc != nil {
		s.proc.Stop()
	}
	if s.sim != nil {
		s.sim.Stop()
	}
}

func newPlainStack(ctx context.Context, c *Config, name string) (*plainStack, error) {
	model, err := modelFile(c.WorkDir)
	if err != nil {
		return nil, err
	}
	s := &plainStack{}
	s.sim, s.simURL, err = startSim(ctx, c, model, "-c", "4096", "-np", fmt.Sprint(proxySlots))
	if err != nil {
		return nil, err
	}
	s.proc, s.procURL, err = startOnebitd(ctx, c, s.simURL, filepath.Join(c.WorkDir, name))
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func runProxy(ctx context.Context, c *Config, log *slog.Logger) (*ProxyResult, error) {
	s, err := newPlainStack(ctx, c, "proxy")
	if err != nil {
		return nil, err
	}
	defer s.close()
	hc := newClient()
	text := promptText(ProxyPromptTokens)
	body, streamBody := completionBody(text, ProxyNPredict, false), completionBody(text, ProxyNPredict, true)
	direct, via := s.simURL+"/completion", s.procURL+"/completion"
	res := &ProxyResult{}

	// Concurrency 1: pairs in alternating order.
	pairs := func(n int, body []byte, first bool) (d, v, added []time.Duration, err error) {
		for i := -20; i < n; i++ { // 20 pairs of warm-up
			var rd, rv reply
			if i%2 == 0 {
				if rd, err = post(ctx, hc, direct, body); err == nil {
					rv, err = post(ctx, hc, via, body)
				}
			} else {
				if rv, err = post(ctx, hc, via, body); err == nil {
					rd, err = post(ctx, hc, direct, body)
				}
			}
			if err != nil {
				return nil, nil, nil, err
			}
			if i < 0 {
				continue
			}
			td, tv := rd.dur, rv.dur
			if first {
				td, tv = rd.first, rv.first
			}
			d, v, added = append(d, td), append(v, tv), append(added, tv-td)
		}
		return d, v, added, nil
	}
	log.Info("proxy: latency at concurrency 1")
	d, v, a, err := pairs(c.count(500), body, false)
	if err != nil {
		return nil, err
	}
	res.Direct, res.Via, res.Added = Summarize(d), Summarize(v), Summarize(a)
	log.Info("proxy: time to first streamed byte")
	d, v, a, err = pairs(c.count(300), streamBody, true)
	if err != nil {
		return nil, err
	}
	res.DirectTTFB, res.ViaTTFB, res.AddedTTFB = Summarize(d), Summarize(v), Summarize(a)

	window := time.Duration(float64(2*time.Second) * min(c.Scale, 1))
	window = max(window, 300*time.Millisecond)
	for _, conc := range ProxyConcurrency {
		log.Info("proxy: throughput", "concurrency", conc)
		row := ThroughputRow{Concurrency: conc}
		var dl, vl []time.Duration
		var dt, vt time.Duration
		// direct, via, via, direct: each side sees the machine at both ends.
		for i, url := range []string{direct, via, via, direct} {
			_ = i
			lat, took, errs, err := load(ctx, hc, url, body, conc, window, 200_000)
			if err != nil {
				return nil, err
			}
			row.Errors += errs
			if url == direct {
				dl, dt = append(dl, lat...), dt+took
			} else {
				vl, vt = append(vl, lat...), vt+took
			}
		}
		row.DirectCount, row.ViaCount = len(dl), len(vl)
		row.DirectRPS, row.ViaRPS = float64(len(dl))/dt.Seconds(), float64(len(vl))/vt.Seconds()
		row.DirectLat, row.ViaLat = Summarize(dl), Summarize(vl)
		res.Throughput = append(res.Throughput, row)
	}
	return res, nil
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
