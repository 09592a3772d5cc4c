package metrics

import (
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/machine"
)

// Namespace prefixes every onebitd series.
const Namespace = "onebitd"

// Reason classes: the reason_class label of onebitd_fallbacks_total. Classify
// maps a fallback to exactly one.
const (
	// ClassCancelled: the client went away or the daemon shut down.
	ClassCancelled = "cancelled"
	// ClassTimeout: a step ran out of time (provider, share socket, decoder).
	ClassTimeout = "timeout"
	// ClassDecoderUnsupported: the decoder cannot share (501, unknown action,
	// recurrent or hybrid cache).
	ClassDecoderUnsupported = "decoder_unsupported"
	// ClassDecoderRefused: the decoder answered 4xx (a stale share id, a
	// layout mismatch).
	ClassDecoderRefused = "decoder_refused"
	// ClassDecoderError: the decoder answered 5xx or could not be reached
	// during share, adopt, restore or tokenize.
	ClassDecoderError = "decoder_error"
	// ClassProviderFailed: the provider could not start or exited non-zero.
	ClassProviderFailed = "provider_failed"
	// ClassPeerRefused: the process on the share socket is not the decoder.
	ClassPeerRefused = "peer_refused"
	// ClassBadShareMessage: the share message was truncated, malformed or
	// did not match its fds.
	ClassBadShareMessage = "bad_share_message"
	// ClassLocalIO: onebitd could not listen or write its own files.
	ClassLocalIO = "local_io"
	// ClassOther: none of the above.
	ClassOther = "other"
)

// Classes lists every reason class.
var Classes = []string{ClassCancelled, ClassTimeout, ClassDecoderUnsupported, ClassDecoderRefused,
	ClassDecoderError, ClassProviderFailed, ClassPeerRefused, ClassBadShareMessage, ClassLocalIO, ClassOther}

// Steps lists the step label values: machine's steps and "other".
var Steps = []string{machine.StepListen, machine.StepShare, machine.StepReceive, machine.StepPeer,
	machine.StepTokens, machine.StepProvider, machine.StepAdopt, machine.StepRestore, machine.StepTokenize, labelOther}

// PhaseHandoff is the phase label of the whole handoff (receipt to adopted,
// restored or fallback).
const PhaseHandoff = "handoff"

const labelOther = "other"

// Buckets of onebitd_handoff_phase_seconds: 50µs to 60s, about three per
// decade.
var Buckets = []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
	100e-3, 250e-3, 500e-3, 1, 2.5, 5, 10, 30, 60}

// maxOpen bounds the requests tracked between their first and last event; a
// request beyond it is not counted in flight and its phases are not timed.
const maxOpen = 1 << 16

// Config is what the daemon passes: functions read at scrape time (nil
// reads 0) and the build's version.
type Config struct {
	Version         string         // onebitd_build_info{version}; "" ⇒ the module version, else "devel"
	SlotsBusy       func() float64 // slots holding a request now
	QueueDepth      func() float64 // requests waiting for a slot now
	EventsPublished func() float64 // bus.Stats: events handed to NATS, ever
	EventsDropped   func() float64 // bus.Stats: events the bus dropped, ever
	EventlogLost    func() float64 // events the event log could not keep, ever
}

// Metrics holds the registry and the series derived from events. It is an
// event.Sink, safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	requests  *prometheus.CounterVec
	phases    *prometheus.HistogramVec
	fallbacks *prometheus.CounterVec
	inflight  prometheus.Gauge
	decoderRs prometheus.Counter
	provRs    prometheus.Counter

	mu       sync.Mutex
	open     map[reqKey]int64 // request → elapsed_us of its last event
	starts   map[string]int   // "<node>/<boot>/decoder|provider" → starting events seen
	handlers http.Handler
}

type reqKey struct{ node, boot, id string }

var _ event.Sink = (*Metrics)(nil)

// New registers every series on a fresh registry.
func New(cfg Config) *Metrics {
	m := &Metrics{
		reg:    prometheus.NewRegistry(),
		open:   make(map[reqKey]int64),
		starts: make(map[string]int),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "requests_total",
			Help: "Completion requests that ended, by final route (plain, file, shared, fallback) and outcome (done, failed).",
		}, []string{"route", "outcome"}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "handoff_phase_seconds",
			Help:    "Duration of each request transition since the previous one (phase = event name), and of the whole handoff (phase=handoff).",
			Buckets: Buckets,
		}, []string{"route", "phase"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "fallbacks_total",
			Help: "Handoffs that fell back, by failing step and reason class.",
		}, []string{"step", "reason_class"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "inflight_requests",
			Help: "Requests received and not yet done or failed.",
		}),
		decoderRs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "decoder_restarts_total",
			Help: "Times the launched decoder was started again after its first start.",
		}),
		provRs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "provider_restarts_total",
			Help: "Times the warm provider was started again after its first start.",
		}),
	}
	read := func(f func() float64) func() float64 {
		if f == nil {
			return func() float64 { return 0 }
		}
		return f
	}
	version, revision := buildVersion(cfg.Version)
	m.reg.MustRegister(
		m.requests, m.phases, m.fallbacks, m.inflight, m.decoderRs, m.provRs,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "slots_busy",
			Help: "Decoder slots holding a request."}, read(cfg.SlotsBusy)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "queue_depth",
			Help: "Requests waiting for a free slot."}, read(cfg.QueueDepth)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: Namespace, Name: "events_published_total",
			Help: "Events the bus handed to NATS."}, read(cfg.EventsPublished)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: Namespace, Name: "events_dropped_total",
			Help: "Events the bus dropped (queue full or NATS down beyond its buffer); the event log still has them."}, read(cfg.EventsDropped)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: Namespace, Name: "eventlog_lost_total",
			Help: "Events the event log could not keep."}, read(cfg.EventlogLost)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "build_info",
			Help:        "Always 1; the labels name the build.",
			ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": runtime.Version()},
		}, func() float64 { return 1 }),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m.handlers = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, ErrorHandling: promhttp.ContinueOnError})
	return m
}

// buildVersion is the version and VCS revision of this binary.
func buildVersion(version string) (string, string) {
	revision := "unknown"
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				revision = s.Value
			}
		}
	}
	if version == "" {
		version = "devel"
	}
	return version, revision
}

// Registry is the registry the series live on (tests gather it; the daemon
// may register more).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text format (/metrics).
func (m *Metrics) Handler() http.Handler { return m.handlers }

// Emit updates the series an event touches.
func (m *Metrics) Emit(e *event.Event) {
	if e.RequestID == "" {
		m.lifecycle(e)
		return
	}
	route := routeLabel(e.Route)
	k := reqKey{e.Node, e.Boot, e.RequestID}
	m.mu.Lock()
	prev, known := m.open[k]
	switch {
	case machine.Terminal(machine.State(e.To)):
		if known {
			delete(m.open, k)
		}
	case known || e.From == string(machine.Received):
		if known || len(m.open) < maxOpen {
			m.open[k] = e.ElapsedUS
			known = known || e.From == string(machine.Received)
		}
	}
	if e.From == string(machine.Received) {
		prev, known = 0, true
	}
	m.inflight.Set(float64(len(m.open)))
	m.mu.Unlock()

	if phase, ok := phaseLabel(e.Event); ok && known && e.ElapsedUS >= prev {
		m.phases.WithLabelValues(route, phase).Observe(float64(e.ElapsedUS-prev) / 1e6)
	}
	if machine.LeavesHandoff(machine.State(e.To)) {
		m.phases.WithLabelValues(route, PhaseHandoff).Observe(float64(e.ElapsedUS) / 1e6)
	}
	if e.To == string(machine.Fallback) {
		m.fallbacks.WithLabelValues(stepLabel(e.Step), Classify(e)).Inc()
	}
	if machine.Terminal(machine.State(e.To)) {
		m.requests.WithLabelValues(route, e.To).Inc()
	}
}

// lifecycle counts restarts: a "<what>.starting" event of a decoder or a
// provider after the first one of that node and boot.
func (m *Metrics) lifecycle(e *event.Event) {
	kind, what, ok := strings.Cut(e.Event, ".")
	if !ok || what != "starting" || (kind != "decoder" && kind != "provider") {
		return
	}
	k := e.Node + "/" + e.Boot + "/" + kind
	m.mu.Lock()
	m.starts[k]++
	n := m.starts[k]
	m.mu.Unlock()
	if n < 2 {
		return
	}
	if kind == "decoder" {
		m.decoderRs.Inc()
	} else {
		m.provRs.Inc()
	}
}

func routeLabel(r string) string {
	switch machine.Route(r) {
	case machine.RoutePlain, machine.RouteFile, machine.RouteShared, machine.RouteFallback:
		return r
	}
	return labelOther
}

func phaseLabel(ev string) (string, bool) {
	switch machine.Event(ev) {
	case machine.EvListen, machine.EvShare, machine.EvPrefill, machine.EvAdopt, machine.EvRestore,
		machine.EvFallback, machine.EvForward, machine.EvFinish, machine.EvFail:
		return ev, true
	}
	return "", false
}

func stepLabel(s string) string {
	for _, k := range Steps {
		if s == k {
			return s
		}
	}
	return labelOther
}

// Classify maps a fallback event to its reason class, from its step, HTTP
// status and the words of its reason. The result is always one of Classes.
func Classify(e *event.Event) string {
	r := strings.ToLower(e.Reason)
	has := func(words ...string) bool {
		for _, w := range words {
			if strings.Contains(r, w) {
				return true
			}
		}
		return false
	}
	switch {
	case strings.HasPrefix(e.Reason, machine.ReasonClientGone) || has("cancel", "shutting down"):
		return ClassCancelled
	case has("timed out", "timeout", "in time", "deadline"):
		return ClassTimeout
	case e.HTTPStatus == http.StatusNotImplemented || has("no shareable", "no shared route", "not an action"):
		return ClassDecoderUnsupported
	case e.HTTPStatus >= 400 && e.HTTPStatus < 500:
		return ClassDecoderRefused
	case e.HTTPStatus >= 500:
		return ClassDecoderError
	}
	switch e.Step {
	case machine.StepProvider:
		return ClassProviderFailed
	case machine.StepPeer:
		return ClassPeerRefused
	case machine.StepReceive:
		return ClassBadShareMessage
	case machine.StepListen, machine.StepTokens:
		return ClassLocalIO
	case machine.StepShare, machine.StepAdopt, machine.StepRestore, machine.StepTokenize:
		return ClassDecoderError
	}
	if e.ProviderExit != nil && *e.ProviderExit != 0 {
		return ClassProviderFailed
	}
	return ClassOther
}
