package daemon

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads the daemon's /metrics over HTTP.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, raw)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatalf("/metrics is not the text format: %v", err)
	}
	return mf
}

// counter is the value of family name's series whose labels include want.
func counter(mf map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	var sum float64
	f := mf[name]
	if f == nil {
		return 0
	}
next:
	for _, m := range f.Metric {
		for k, v := range want {
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		}
	}
	return sum
}

// TestMetricsAfterRequests scrapes /metrics after handoffs that succeed and
// handoffs that fall back: the counts match the requests sent, the
// histograms counted every handoff, the fallbacks are classified, and
// every name passes promlint.
func TestMetricsAfterRequests(t *testing.T) {
	ok := newStack(t, stackOpts{provider: true, share: true})
	const nOK = 3
	for range nOK {
		if a := complete(t, ok.d.URL(), testPrompt); a.route != "shared" {
			t.Fatalf("%+v", a)
		}
	}
	bad := newStack(t, stackOpts{provider: true, share: true, providerArgs: []string{"--fail"}})
	const nBad = 2
	for range nBad {
		if a := complete(t, bad.d.URL(), testPrompt); a.route != "fallback" || a.status != 200 {
			t.Fatalf("%+v", a)
		}
	}
	for _, c := range []struct {
		s        *stack
		route    string
		n        int
		fallback bool
	}{{ok, "shared", nOK, false}, {bad, "fallback", nBad, true}} {
		waitDone(t, c.s)
		mf := scrape(t, c.s.d.URL())
		if got := counter(mf, "onebitd_requests_total", map[string]string{"route": c.route, "outcome": "done"}); got != float64(c.n) {
			t.Errorf("%s: onebitd_requests_total{route=%q,outcome=done} = %v, want %d", c.route, c.route, got, c.n)
		}
		if got := counter(mf, "onebitd_handoff_phase_seconds", map[string]string{"phase": "handoff"}); got != float64(c.n) {
			t.Errorf("%s: handoff phase observed %v times, want %d", c.route, got, c.n)
		}
		fb := counter(mf, "onebitd_fallbacks_total", map[string]string{"step": "provider", "reason_class": "provider_failed"})
		if c.fallback && fb != float64(c.n) || !c.fallback && fb != 0 {
			t.Errorf("%s: onebitd_fallbacks_total{step=provider,reason_class=provider_failed} = %v", c.route, fb)
		}
		if got := counter(mf, "onebitd_inflight_requests", nil); got != 0 {
			t.Errorf("%s: %v in flight after every answer", c.route, got)
		}
		// The dashboard is served by the daemon itself.
		if resp, err := http.Get(c.s.d.URL() + "/ui/"); err != nil || resp.StatusCode != 200 ||
			!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Errorf("/ui/: %v %v", resp, err)
		} else {
			resp.Body.Close()
		}
		problems, err := testutil.GatherAndLint(c.s.d.metrics.Registry())
		if err != nil || len(problems) != 0 {
			t.Errorf("promlint: %v %v", problems, err)
		}
	}
}

// waitDone waits until no request is in flight (a request's finish event
// follows its answer).
func waitDone(t *testing.T, s *stack) {
	t.Helper()
	obtest.WaitFor(t, 10*time.Second, "every request out of flight", func() bool { return s.d.HealthDetails().InFlight == 0 })
}
