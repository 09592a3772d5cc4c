package metrics

import (
	"bufio"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/machine"
)

func ptr[T any](v T) *T { return &v }

// feedFile emits every event of a JSON Lines file (a copy of
// cmd/onebitd/testdata/replay/events.jsonl: two boots, every route, a
// decoder restart, two fallbacks, a request left in flight).
func feedFile(t *testing.T, m *Metrics, path string) []event.Event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var evs []event.Event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		e, err := event.Parse(sc.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e)
		m.Emit(&e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return evs
}

// hist returns the sample count and sum of onebitd_handoff_phase_seconds{route,phase}.
func hist(t *testing.T, m *Metrics, route, phase string) (uint64, float64) {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "onebitd_handoff_phase_seconds" {
			continue
		}
		for _, mt := range mf.Metric {
			if label(mt, "route") == route && label(mt, "phase") == phase {
				return mt.GetHistogram().GetSampleCount(), mt.GetHistogram().GetSampleSum()
			}
		}
	}
	return 0, 0
}

func label(mt *dto.Metric, name string) string {
	for _, l := range mt.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestReplayLogCounts(t *testing.T) {
	m := New(Config{})
	feedFile(t, m, "testdata/events.jsonl")

	counters := []struct {
		name string
		got  float64
		want float64
	}{
		{"requests shared/done", testutil.ToFloat64(m.requests.WithLabelValues("shared", "done")), 1},
		{"requests shared/failed", testutil.ToFloat64(m.requests.WithLabelValues("shared", "failed")), 1},
		{"requests file/done", testutil.ToFloat64(m.requests.WithLabelValues("file", "done")), 1},
		{"requests plain/done", testutil.ToFloat64(m.requests.WithLabelValues("plain", "done")), 1},
		{"requests fallback/done", testutil.ToFloat64(m.requests.WithLabelValues("fallback", "done")), 2},
		{"fallbacks adopt/decoder_refused", testutil.ToFloat64(m.fallbacks.WithLabelValues("adopt", ClassDecoderRefused)), 1},
		{"fallbacks provider/provider_failed", testutil.ToFloat64(m.fallbacks.WithLabelValues("provider", ClassProviderFailed)), 1},
		{"inflight (req-interrupted)", testutil.ToFloat64(m.inflight), 1},
		{"decoder restarts", testutil.ToFloat64(m.decoderRs), 1},
		{"provider restarts", testutil.ToFloat64(m.provRs), 0},
	}
	for _, c := range counters {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.requests); n != 5 {
		t.Errorf("requests_total has %d series, want 5", n)
	}
	if n := testutil.CollectAndCount(m.fallbacks); n != 2 {
		t.Errorf("fallbacks_total has %d series, want 2", n)
	}
	hists := []struct {
		route, phase string
		n            uint64
		sum          float64
	}{
		{"shared", PhaseHandoff, 2, 0.009},    // req-shared, req-after-restart: adopted at 4.5ms
		{"file", PhaseHandoff, 1, 0.0015},     // req-file restored at 1.5ms
		{"fallback", PhaseHandoff, 2, 0.0045}, // req-adopt-refused at 4.5ms, req-provider-failed at 0
		{"shared", "share", 3, 0.0045},        // 1.5ms each
		{"shared", "listen", 3, 0},            // elapsed 0 at the first event
		{"fallback", "forward", 2, 0.003},     // 1.5ms after the fallback
		{"shared", "fail", 1, 0.0015},
	}
	for _, h := range hists {
		n, sum := hist(t, m, h.route, h.phase)
		if n != h.n || !near(sum, h.sum) {
			t.Errorf("handoff_phase_seconds{route=%s,phase=%s}: count %d sum %g, want %d %g", h.route, h.phase, n, sum, h.n, h.sum)
		}
	}
}

// machineRun drives real machines through each route and returns, per
// request, its final elapsed_us.
func machineRun(t *testing.T, sink event.Sink) map[string]int64 {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	type step struct {
		ev machine.Event
		a  machine.Attrs
	}
	cl := &event.Cleanup{}
	runs := []struct {
		id    string
		route machine.Route
		steps []step
	}{
		{"p1", machine.RoutePlain, []step{{machine.EvForward, machine.Attrs{}}, {machine.EvFinish, machine.Attrs{HTTPStatus: 200}}}},
		{"f1", machine.RouteFile, []step{{machine.EvPrefill, machine.Attrs{NTokens: 40, ProviderExit: ptr(0)}},
			{machine.EvRestore, machine.Attrs{NTokens: 40, Cleanup: cl}}, {machine.EvForward, machine.Attrs{}}, {machine.EvFinish, machine.Attrs{HTTPStatus: 200}}}},
		{"s1", machine.RouteShared, []step{{machine.EvListen, machine.Attrs{}}, {machine.EvShare, machine.Attrs{ShareID: ptr(int64(1)), NFDs: 3}},
			{machine.EvPrefill, machine.Attrs{NTokens: 512}}, {machine.EvAdopt, machine.Attrs{ShareID: ptr(int64(1)), Cleanup: cl}},
			{machine.EvForward, machine.Attrs{}}, {machine.EvFinish, machine.Attrs{HTTPStatus: 200}}}},
		{"s501", machine.RouteShared, []step{{machine.EvListen, machine.Attrs{}},
			{machine.EvFallback, machine.Attrs{Step: machine.StepShare, HTTPStatus: 501, Reason: "the decoder has no shareable region (501)", Cleanup: cl}},
			{machine.EvForward, machine.Attrs{}}, {machine.EvFinish, machine.Attrs{HTTPStatus: 200}}}},
		{"ftimeout", machine.RouteFile, []step{
			{machine.EvFallback, machine.Attrs{Step: machine.StepProvider, Reason: "provider: timed out after 60s", Cleanup: cl}},
			{machine.EvForward, machine.Attrs{}}, {machine.EvFail, machine.Attrs{HTTPStatus: 502, Reason: "client went away"}}}},
		{"speer", machine.RouteShared, []step{{machine.EvListen, machine.Attrs{}},
			{machine.EvFallback, machine.Attrs{Step: machine.StepPeer, Reason: "the process that connected to the share socket is not the decoder", Cleanup: cl}},
			{machine.EvForward, machine.Attrs{}}, {machine.EvFinish, machine.Attrs{HTTPStatus: 200}}}},
	}
	last := make(map[string]int64)
	rec := event.NewRecorder("node-m", sink, event.SinkFunc(func(e *event.Event) { last[e.RequestID] = e.ElapsedUS }))
	for i, r := range runs {
		mc := machine.New(r.id, i, r.route, rec, log)
		for _, s := range r.steps {
			if err := mc.Fire(s.ev, s.a); err != nil {
				t.Fatalf("%s: %v", r.id, err)
			}
		}
	}
	return last
}

func TestMachineRunCounts(t *testing.T) {
	m := New(Config{})
	last := machineRun(t, m)
	want := map[[2]string]float64{
		{"plain", "done"}: 1, {"file", "done"}: 1, {"shared", "done"}: 1, {"fallback", "done"}: 2, {"fallback", "failed"}: 1,
	}
	for k, v := range want {
		if got := testutil.ToFloat64(m.requests.WithLabelValues(k[0], k[1])); got != v {
			t.Errorf("requests_total{route=%s,outcome=%s} = %v, want %v", k[0], k[1], got, v)
		}
	}
	fb := map[[2]string]float64{
		{"share", ClassDecoderUnsupported}: 1, {"provider", ClassTimeout}: 1, {"peer", ClassPeerRefused}: 1,
	}
	for k, v := range fb {
		if got := testutil.ToFloat64(m.fallbacks.WithLabelValues(k[0], k[1])); got != v {
			t.Errorf("fallbacks_total{step=%s,reason_class=%s} = %v, want %v", k[0], k[1], got, v)
		}
	}
	if got := testutil.ToFloat64(m.inflight); got != 0 {
		t.Errorf("inflight = %v after every request ended", got)
	}
	// The phases of a request add up to its last elapsed_us: over all
	// requests, the sum of every non-handoff phase is the sum of the ends.
	var wantSum float64
	for _, us := range last {
		wantSum += float64(us) / 1e6
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var gotSum float64
	var count uint64
	for _, mf := range mfs {
		if mf.GetName() != "onebitd_handoff_phase_seconds" {
			continue
		}
		for _, mt := range mf.Metric {
			if label(mt, "phase") != PhaseHandoff {
				gotSum += mt.GetHistogram().GetSampleSum()
				count += mt.GetHistogram().GetSampleCount()
			}
		}
	}
	if !near(gotSum, wantSum) {
		t.Errorf("phases sum to %gs, the requests' ends to %gs", gotSum, wantSum)
	}
	if count != 2+4+6+4+3+4 {
		t.Errorf("%d phase samples, want one per transition (23)", count)
	}
}

func TestLintAndLabels(t *testing.T) {
	m := New(Config{
		SlotsBusy: func() float64 { return 2 }, QueueDepth: func() float64 { return 3 },
		EventsPublished: func() float64 { return 40 }, EventsDropped: func() float64 { return 1 },
		EventlogLost: func() float64 { return 0 },
	})
	evs := feedFile(t, m, "testdata/events.jsonl")
	machineRun(t, m)
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	forbidden := map[string]bool{}
	for _, e := range evs {
		forbidden[e.RequestID] = e.RequestID != ""
		forbidden[e.Node] = true
		forbidden[e.Reason] = e.Reason != ""
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		for _, mt := range mf.Metric {
			for _, l := range mt.Label {
				if forbidden[l.GetValue()] {
					t.Errorf("%s has label %s=%q from an event", mf.GetName(), l.GetName(), l.GetValue())
				}
				if mf.GetName() == "onebitd_fallbacks_total" && l.GetName() == "reason_class" && !slices.Contains(Classes, l.GetValue()) {
					t.Errorf("reason_class %q is not a class", l.GetValue())
				}
			}
		}
	}
	for _, n := range []string{"onebitd_requests_total", "onebitd_handoff_phase_seconds", "onebitd_fallbacks_total",
		"onebitd_inflight_requests", "onebitd_slots_busy", "onebitd_queue_depth", "onebitd_events_published_total",
		"onebitd_events_dropped_total", "onebitd_eventlog_lost_total", "onebitd_decoder_restarts_total",
		"onebitd_provider_restarts_total", "onebitd_build_info", "go_goroutines", "process_open_fds"} {
		if !names[n] {
			t.Errorf("%s is not exposed", n)
		}
	}
}

func TestHandlerServesText(t *testing.T) {
	m := New(Config{SlotsBusy: func() float64 { return 2 }, EventsDropped: func() float64 { return 7 }})
	feedFile(t, m, "testdata/events.jsonl")
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`onebitd_requests_total{outcome="done",route="fallback"} 2`,
		`onebitd_slots_busy 2`,
		`onebitd_events_dropped_total 7`,
		`onebitd_fallbacks_total{reason_class="decoder_refused",step="adopt"} 1`,
		`onebitd_handoff_phase_seconds_bucket{phase="handoff",route="shared",le="5e-05"} 0`,
		`onebitd_handoff_phase_seconds_bucket{phase="handoff",route="shared",le="0.005"} 2`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		e    event.Event
		want string
	}{
		{event.Event{Step: "share", HTTPStatus: 501, Reason: "the decoder has no shareable region (501)"}, ClassDecoderUnsupported},
		{event.Event{Step: "share", Reason: "decoder: the decoder has no shared route (?action=share is not an action it knows)"}, ClassDecoderUnsupported},
		{event.Event{Step: "adopt", HTTPStatus: 409, Reason: "share id 2 is not the slot's last share"}, ClassDecoderRefused},
		{event.Event{Step: "restore", HTTPStatus: 500, Reason: "failed to restore"}, ClassDecoderError},
		{event.Event{Step: "adopt", Reason: "dial unix: connection refused"}, ClassDecoderError},
		{event.Event{Step: "provider", ProviderExit: ptr(3), Reason: "provider exited with status 3: model file not found"}, ClassProviderFailed},
		{event.Event{Step: "provider", Reason: "provider: timed out"}, ClassTimeout},
		{event.Event{Step: "receive", Reason: "fdpass: the decoder did not send the share message in time"}, ClassTimeout},
		{event.Event{Step: "receive", Reason: "fdpass: the decoder sent more region fds than this process accepts (kernel set MSG_CTRUNC)"}, ClassBadShareMessage},
		{event.Event{Step: "peer", Reason: "the process that connected to the share socket is not the decoder"}, ClassPeerRefused},
		{event.Event{Step: "tokens", Reason: "open x.tokens: no space left on device"}, ClassLocalIO},
		{event.Event{Step: "listen", Reason: "fdpass: another process is already listening on the share socket"}, ClassLocalIO},
		{event.Event{Step: "provider", Reason: "provider: cancelled"}, ClassCancelled},
		{event.Event{Step: "provider", Reason: machine.ReasonClientGone + " while the provider was prefilling"}, ClassCancelled},
		{event.Event{Step: "tokenize", HTTPStatus: 503, Reason: "loading model"}, ClassDecoderError},
		{event.Event{Step: "", Reason: "something new"}, ClassOther},
		{event.Event{Step: "weird\nstep", Reason: ""}, ClassOther},
	}
	for _, tt := range tests {
		if got := Classify(&tt.e); got != tt.want {
			t.Errorf("Classify(step=%q status=%d reason=%q) = %s, want %s", tt.e.Step, tt.e.HTTPStatus, tt.e.Reason, got, tt.want)
		}
	}
	if got := stepLabel("weird\nstep"); got != "other" {
		t.Errorf("stepLabel(unknown) = %q", got)
	}
}

// BenchmarkEmit is one transition through the sink (the daemon pays it per
// event).
func BenchmarkEmit(b *testing.B) {
	m := New(Config{})
	e := event.Event{Node: "n", Boot: "b", RequestID: "r1", Route: "shared", Event: "share", From: "listening", To: "shared", ElapsedUS: 1500}
	first := event.Event{Node: "n", Boot: "b", RequestID: "r1", Route: "shared", Event: "listen", From: "received", To: "listening"}
	m.Emit(&first)
	b.ReportAllocs()
	for b.Loop() {
		m.Emit(&e)
	}
}
