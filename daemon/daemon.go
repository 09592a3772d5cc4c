// Package daemon wires one Options struct into a running onebitd: the event
// pipeline (recorder → event log → NATS), the decoder (launched or
// attached), the handoff runner, the HTTP front and its drain. cmd/onebitd
// only parses flags into Options; tests run the whole daemon in-process.
//
// Lifecycle: New checks the options and opens nothing; Start opens the
// event pipeline, reaches the decoder and listens; Serve serves until its
// context ends, then drains; Close releases what Start opened (the decoder
// it launched, NATS, the event log), and is safe to call at any point.
// Run is Start + Serve + Close.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/dashboard"
	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
	"github.com/onebitd/onebitd/handlers"
	"github.com/onebitd/onebitd/handoff"
	"github.com/onebitd/onebitd/launcher"
	"github.com/onebitd/onebitd/machine"
	"github.com/onebitd/onebitd/metrics"
	"github.com/onebitd/onebitd/planner"
	"github.com/onebitd/onebitd/provider"
	"github.com/onebitd/onebitd/slots"
)

// Errors of the daemon.
var (
	ErrStarted      = errors.New("daemon: already started")
	ErrNotStarted   = errors.New("daemon: not started")
	ErrTooManySlots = errors.New("daemon: more slots than the decoder has")
)

// Log attribute keys.
const (
	attrError = "error"
)

// Daemon is one running onebitd.
type Daemon struct {
	opts Options
	log  *slog.Logger

	mu      sync.Mutex
	started bool
	closers []func() // run in reverse by Close

	events   event.Sink
	rec      *event.Recorder
	inflight inflight
	bus      *bus.Bus
	elog     *eventlog.Writer
	launched *launcher.Decoder
	prefill  *launcher.Decoder // the prefill server (--prefill-bin)
	warm     *provider.Warm    // --provider-mode serve
	metrics  *metrics.Metrics
	hub      *dashboard.Hub
	nVocab   int
	keys     []string // client API keys
	dec      *decoder.Client
	pool     *slots.Pool
	handoff  *handoff.Handoff
	front    *handlers.Server
	ln       net.Listener
	srv      *http.Server
	route    machine.Route
}

// New checks opts and fills their defaults. It opens nothing.
func New(opts Options, log *slog.Logger) (*Daemon, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Daemon{opts: o, log: log}, nil
}

// Options are the options in force (defaults filled in).
func (d *Daemon) Options() Options { return d.opts }

// Run starts the daemon, serves until ctx ends, drains and closes.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.Close()
	if err := d.Start(ctx); err != nil {
		return err
	}
	return d.Serve(ctx)
}

// Start opens the event pipeline, launches or reaches the decoder, builds
// the handoff and the HTTP front, and listens. Requests are served once
// Serve runs (the listener queues them meanwhile). On error, what was
// opened is closed by Close.
func (d *Daemon) Start(ctx context.Context) error {
	d.mu.Lock()
	if d.started {
		d.mu.Unlock()
		return ErrStarted
	}
	d.started = true
	d.mu.Unlock()
	o := &d.opts

	// fds inherited without close-on-exec (from a shell or a supervisor)
	// would otherwise reach every provider beside the region fds.
	provider.CloseOnExecInherited()
	if err := os.MkdirAll(o.SlotDir, 0o700); err != nil {
		return fmt.Errorf("slot dir: %w", err)
	}
	if n, err := handoff.CleanStale(o.SlotDir); err != nil {
		return fmt.Errorf("slot dir: %w", err)
	} else if n > 0 {
		d.log.Warn("removed handoff files left by an earlier run that did not stop cleanly", "slot_dir", o.SlotDir, "files", n)
	}
	if o.APIKeyFile != "" {
		keys, err := handlers.LoadAPIKeys(o.APIKeyFile)
		if err != nil {
			return err
		}
		d.keys = keys
	}
	if err := d.openEvents(ctx); err != nil {
		return err
	}
	if err := d.openDecoder(ctx); err != nil {
		return err
	}
	if err := d.buildFront(ctx); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return err
	}
	d.ln = ln
	d.srv = &http.Server{
		Handler:           d.mux(),
		ReadHeaderTimeout: DefaultReadHeader,
		IdleTimeout:       DefaultIdle,
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	}
	d.closers = append(d.closers, func() { d.srv.Close() })
	if o.MetricsListen != "" {
		mln, err := net.Listen("tcp", o.MetricsListen)
		if err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		msrv := &http.Server{Handler: handlers.RequireKey(d.keys, d.metrics.Handler()), ReadHeaderTimeout: DefaultReadHeader}
		go msrv.Serve(mln)
		d.closers = append(d.closers, func() { msrv.Close() })
		d.log.Info("metrics", "listen", "http://"+mln.Addr().String()+"/metrics")
	}
	sim := ""
	if d.launched != nil && strings.Contains(filepath.Base(o.DecoderBin), "decoder-sim") {
		sim = " (the bundled decoder simulator, not a real llama-server)"
	}
	d.log.Info("onebitd serving", "listen", "http://"+ln.Addr().String(), "decoder", d.dec.Addr()+sim,
		"route", d.route, "slots", d.pool.Size(), "slot_dir", o.SlotDir, "provider", o.Provider)
	return nil
}

// Addr is the HTTP listen address once started.
func (d *Daemon) Addr() string {
	if d.ln == nil {
		return ""
	}
	return d.ln.Addr().String()
}

// URL is the daemon's base URL once started.
func (d *Daemon) URL() string { return "http://" + d.Addr() }

// Route is the route completions take when nothing falls back.
func (d *Daemon) Route() machine.Route { return d.route }

// Bus is the NATS bus (nil before Start).
func (d *Daemon) Bus() *bus.Bus { return d.bus }

// Serve serves HTTP until ctx ends, then drains: in-flight handoffs are cut
// short (they fall back and are forwarded as they came) so that every
// client gets its answer within the drain limit.
func (d *Daemon) Serve(ctx context.Context) error {
	if d.srv == nil {
		return ErrNotStarted
	}
	errc := make(chan error, 1)
	go func() { errc <- d.srv.Serve(d.ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	return d.drain(errc)
}

// drain stops accepting, gives in-flight requests the drain limit, and cuts
// handoffs short early enough that their forward still fits in it.
func (d *Daemon) drain(errc <-chan error) error {
	limit := d.opts.DrainTimeout
	d.log.Info("onebitd draining in-flight requests", "limit", limit)
	sctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	if d.handoff != nil {
		// Handoffs still running when the margin starts fall back now.
		t := time.AfterFunc(limit-drainMargin, func() {
			d.handoff.Drain()
		})
		defer t.Stop()
	}
	err := d.srv.Shutdown(sctx)
	<-errc // Serve returned http.ErrServerClosed
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	d.log.Info("onebitd stopped cleanly")
	return nil
}

// Close releases everything Start opened, in reverse order. It is
// idempotent.
func (d *Daemon) Close() error {
	d.mu.Lock()
	cl := d.closers
	d.closers = nil
	d.mu.Unlock()
	for i := len(cl) - 1; i >= 0; i-- {
		cl[i]()
	}
	return nil
}

func (d *Daemon) openDecoder(ctx context.Context) error {
	o := &d.opts
	url := o.DecoderURL
	slotsWanted := o.Slots
	if o.DecoderBin != "" {
		if slotsWanted == 0 {
			slotsWanted = 1
		}
		d.log.Info("launching the decoder", "bin", o.DecoderBin, "args", strings.Join(o.DecoderArgs, " "))
		l, err := launcher.Start(ctx, launcher.Config{
			Bin: o.DecoderBin, Args: o.DecoderArgs, Model: o.Model, SlotDir: o.SlotDir, Slots: slotsWanted,
			APIKey: true, UnixSocket: true, RunDir: filepath.Join(o.StateDir, "run", "decoder"),
			Sink: d.events, Logger: d.log,
		})
		if err != nil {
			return fmt.Errorf("decoder: %w", err)
		}
		d.launched = l
		d.closers = append(d.closers, func() {
			if err := l.Stop(); err != nil {
				d.log.Warn("decoder stop", attrError, err)
			}
		})
		url = l.URL()
	}
	var dec *decoder.Client
	if d.launched != nil {
		dec = d.launched.Client() // over its unix socket, with its per-boot key
	} else {
		var opts []decoder.Option
		if o.DecoderAPIKeyFile != "" {
			opts = append(opts, decoder.WithAPIKeyFile(o.DecoderAPIKeyFile))
		}
		c, err := decoder.New(url, nil, opts...)
		if err != nil {
			return err
		}
		dec = c
	}
	d.dec = dec
	d.closers = append(d.closers, dec.HTTP().CloseIdleConnections)
	if d.launched == nil { // a launched decoder is ready when Start returns
		if err := waitDecoder(ctx, dec, o.DecoderWait, d.log); err != nil {
			return err
		}
	}
	pctx, cancel := context.WithTimeout(ctx, o.DecoderWait)
	props, err := dec.Props(pctx)
	cancel()
	if err != nil {
		return fmt.Errorf("decoder /props: %w", err)
	}
	if slotsWanted == 0 {
		slotsWanted = max(props.TotalSlots, 1)
	}
	if props.TotalSlots > 0 && slotsWanted > props.TotalSlots {
		return fmt.Errorf("%w: --slots %d but the decoder has %d (llama-server wraps slot ids: refusing)", ErrTooManySlots, slotsWanted, props.TotalSlots)
	}
	d.pool = slots.New(slotsWanted, o.Queue)
	vctx, cancel := context.WithTimeout(ctx, o.DecoderWait)
	n, err := handlers.DecoderVocab(vctx, dec)
	cancel()
	if err == nil {
		d.nVocab = n
	} else {
		d.log.Warn("the decoder does not say its vocabulary size: token ids are not checked before a handoff", attrError, err)
	}
	return d.startPrefill(ctx, slotsWanted)
}

// provider is the handoff's provider: a process per request, or one warm
// provider launched now and supervised (DESIGN §2c).
func (d *Daemon) provider(ctx context.Context) (handoff.Provider, error) {
	o := &d.opts
	if o.ProviderMode == ProviderModeExec {
		return handoff.Exec{Runner: &provider.Runner{Path: o.Provider, Args: o.ProviderArgs, Timeout: o.ProviderTimeout, Logger: d.log}}, nil
	}
	runDir := filepath.Join(o.StateDir, "run")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return nil, fmt.Errorf("warm provider: %w", err)
	}
	w, err := provider.StartWarm(ctx, provider.WarmConfig{
		Path: o.Provider, Args: o.ProviderArgs, Socket: filepath.Join(runDir, "provider.sock"),
		Timeout: o.ProviderTimeout, Sink: d.events, Logger: d.log.With("provider", "warm"),
	})
	if err != nil {
		return nil, fmt.Errorf("warm provider: %w", err)
	}
	d.warm = w
	d.closers = append(d.closers, func() {
		if err := w.Stop(); err != nil {
			d.log.Warn("warm provider stop", attrError, err)
		}
	})
	return handoff.Warm{W: w}, nil
}

func (d *Daemon) buildFront(ctx context.Context) error {
	o := &d.opts
	hcfg := handlers.Config{
		Decoder:        d.dec,
		Pool:           d.pool,
		Sink:           d.events,
		Logger:         d.log,
		MaxBody:        o.MaxBody,
		BodyTimeout:    o.BodyTimeout,
		ExposeSlotsAPI: o.ExposeSlotsAPI,
		NVocab:         d.nVocab,

		HandoffMode:      planner.Mode(o.Handoff),
		HandoffMinTokens: o.HandoffMinTokens,
	}
	hcfg.APIKeys = d.keys
	if d.launched != nil {
		hcfg.Ready = d.launched.Ready
		hcfg.DecoderIdentity = d.launched.PID // a restart forgets every slot's prefix
	}
	d.route = machine.RoutePlain
	if o.Provider != "" {
		prov, err := d.provider(ctx)
		if err != nil {
			return err
		}
		var peerPID func() int
		if d.launched != nil {
			peerPID = d.launched.PID
		}
		d.handoff = handoff.NewHandoff(handoff.Config{
			SlotDir:        o.SlotDir,
			Model:          o.Model,
			Share:          o.KVShare,
			Slots:          d.pool.Size(),
			AcceptTimeout:  o.AcceptTimeout,
			ShareTimeout:   o.ShareTimeout,
			ApplyTimeout:   o.ApplyTimeout,
			CheckPeerCreds: true,
			PeerUID:        os.Getuid(),
			PeerPID:        peerPID,
		}, d.dec, prov, d.log)
		if err := d.handoff.Listen(); err != nil { // the per-slot share sockets
			return fmt.Errorf("share sockets: %w", err)
		}
		d.closers = append(d.closers, func() { d.handoff.Close() })
		hcfg.Handoff = d.handoff
		d.route = d.handoff.Route()
	}
	front, err := handlers.New(hcfg)
	if err != nil {
		return err
	}
	d.front = front
	return nil
}

// waitDecoder polls /health until the decoder answers 200.
func waitDecoder(ctx context.Context, dec *decoder.Client, limit time.Duration, log *slog.Logger) error {
	deadline := time.Now().Add(limit)
	delay := 50 * time.Millisecond
	for logged := false; ; {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := dec.Health(hctx)
		cancel()
		if err == nil {
			return nil
		}
		if !logged {
			log.Info("waiting for the decoder", "decoder", dec.Addr(), attrError, err)
			logged = true
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("decoder not ready after %s: %w", limit, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(delay*2, time.Second)
	}
}

// openEvents builds the event pipeline: recorder → event log → NATS
// (persist before publish).
func (d *Daemon) openEvents(ctx context.Context) error {
	o := &d.opts
	log := d.log
	var sinks []event.Sink
	if log.Enabled(ctx, slog.LevelDebug) {
		sinks = append(sinks, event.SinkFunc(func(e *event.Event) {
			log.Debug("transition", "request_id", e.RequestID, "slot", e.Slot, "route", e.Route, "event", e.Event,
				"from", e.From, "to", e.To, "reason", e.Reason, "step", e.Step, "seq", e.Seq)
		}))
	}
	if o.EventLog != EventLogOff {
		policy, err := eventlog.ParseSyncPolicy(o.EventLogSync)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(o.EventLog), 0o700); err != nil {
			return fmt.Errorf("event log: %w", err)
		}
		w, torn, err := eventlog.Open(o.EventLog, policy, log)
		if err != nil {
			return fmt.Errorf("event log: %w", err)
		}
		switch {
		case torn.IsZero():
		case torn.SaveError != "":
			log.Error("event log had a torn last line (a crash mid-write) that could not be kept aside: truncated in place, its bytes are gone",
				"path", o.EventLog, "offset", torn.Offset, "bytes", torn.Bytes, "save_error", torn.SaveError, "reason", torn.Reason)
		default:
			log.Warn("event log had a torn last line (a crash mid-write); kept aside and truncated",
				"path", o.EventLog, "offset", torn.Offset, "bytes", torn.Bytes, "saved_to", torn.SavedTo, "reason", torn.Reason)
		}
		d.elog = w
		sinks = append(sinks, w)
		d.closers = append(d.closers, func() {
			if err := w.Close(); err != nil {
				log.Error("event log close", attrError, err)
			}
		})
	}
	logPath := o.EventLog
	if logPath == EventLogOff {
		logPath = ""
	}
	b, err := bus.Open(ctx, bus.Config{
		URLs: o.NATSURL, Listen: o.NATSListen, JetStream: o.JetStream,
		StoreDir: filepath.Join(o.StateDir, "jetstream"), StateDir: o.StateDir,
		CredsFile: o.NATSCreds, NKeyFile: o.NATSNKey, TLSCA: o.NATSTLSCA,
		StreamReplicas: o.StreamReplicas, StreamMaxAge: o.StreamMaxAge, StreamMaxBytes: o.StreamMaxBytes,
		ClusterName: o.NATSCluster, ClusterRoutes: o.NATSRoutes, ClusterListen: o.NATSClusterListen,
		ClusterSecretFile: o.NATSClusterSecret, ReconnectBufSize: o.NATSReconnectBuf,
		EventLog: logPath, Node: o.Node, Logger: log,
	})
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	d.bus = b
	sinks = append(sinks, b)
	d.closers = append(d.closers, func() {
		if err := b.Close(); err != nil {
			log.Warn("nats close", attrError, err)
		}
		st := b.Stats() // after Close: the drain's publishes and drops count
		log.Info("nats bus closed", "published", st.Published, "dropped", st.Dropped, "republished", st.Republished, "deferred", st.Deferred)
	})
	if u := b.ClientURL(); u != "" {
		watch := "onebitd watch --nats-url " + u
		if c := b.ReaderCreds(); c != "" {
			watch += " --nats-creds " + c
		}
		log.Info("events on nats", "url", u, "subjects", "onebit.>", "watch", watch)
	}
	// Metrics and the dashboard read the same events, in process; both
	// are in-memory and cheap (sinks before the log run under the
	// recorder's lock).
	d.metrics = metrics.New(metrics.Config{
		SlotsBusy: func() float64 {
			if d.pool == nil {
				return 0
			}
			st := d.pool.Stats()
			return float64(st.Slots - st.Free)
		},
		QueueDepth: func() float64 {
			if d.pool == nil {
				return 0
			}
			return float64(d.pool.Stats().Waiting)
		},
		EventsPublished: func() float64 { return float64(b.Stats().Published) },
		EventsDropped:   func() float64 { return float64(b.Stats().Dropped) },
		EventlogLost: func() float64 {
			if d.elog == nil {
				return 0
			}
			return float64(d.elog.Stats().Lost)
		},
	})
	hcfg := dashboard.Config{Logger: log.With("component", "dashboard")}
	if len(d.keys) > 0 {
		hcfg.CheckKey = dashboard.KeyChecker(d.keys)
	}
	d.hub = dashboard.NewHub(hcfg)
	d.closers = append(d.closers, d.hub.Close)
	// The hub shows what the log holds: it goes after it, with the bus
	// (persist, then publish).
	sinks = append(sinks[:len(sinks)-1], d.hub, b)
	rec := event.NewRecorder(o.Node, append([]event.Sink{&d.inflight, d.metrics}, sinks...)...)
	d.rec, d.events = rec, rec
	if d.elog != nil {
		subject := bus.SubjectPrefix + "." + bus.Token(o.Node) + ".eventlog.lost"
		d.elog.SetOnLoss(func(l eventlog.Loss) {
			data, err := json.Marshal(l)
			if err == nil {
				b.Publish(subject, data)
			}
			d.hub.NoteEventlogLoss(o.Node, l.Total)
		})
	}
	// A clean stop's last event says how many requests were still in
	// flight, so that replay tells a crash from a stop (runs before the
	// bus and the log close: closers run in reverse).
	d.closers = append(d.closers, func() { rec.Shutdown(d.inflight.count()) })
	return nil
}

// inflight tracks the requests that have not ended (a sink before the
// others, so that the shutdown line counts what the log holds).
type inflight struct {
	mu sync.Mutex
	m  map[string]struct{}
}

func (f *inflight) Emit(e *event.Event) {
	if e.RequestID == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if machine.Terminal(machine.State(e.To)) {
		delete(f.m, e.RequestID)
		return
	}
	if f.m == nil {
		f.m = make(map[string]struct{})
	}
	f.m[e.RequestID] = struct{}{}
}

func (f *inflight) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.m)
}
