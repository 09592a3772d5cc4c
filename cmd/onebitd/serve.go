package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/handlers"
	"github.com/onebitd/onebitd/handoff"
	"github.com/onebitd/onebitd/launcher"
	"github.com/onebitd/onebitd/machine"
	"github.com/onebitd/onebitd/provider"
	"github.com/onebitd/onebitd/slots"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, " ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// serveConfig is everything `onebitd serve` is told.
type serveConfig struct {
	Listen          string
	DecoderURL      string
	DecoderBin      string
	DecoderArgs     []string
	Model           string
	Slots           int
	Queue           int
	SlotDir         string
	Provider        string
	ProviderArgs    stringList
	KVShare         bool
	ProviderTimeout time.Duration
	AcceptTimeout   time.Duration
	ShareTimeout    time.Duration
	ApplyTimeout    time.Duration
	DecoderWait     time.Duration
	StateDir        string
	EventLog        string
	EventLogSync    string
	NATSURL         string
	NATSListen      string
	JetStream       bool
	Node            string
	LogFormat       string
	LogLevel        string
	MaxBody         int64
}

func serveFlags(fs *flag.FlagSet, c *serveConfig) {
	host, _ := os.Hostname()
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:8080", "HTTP listen address")
	fs.StringVar(&c.DecoderURL, "decoder-url", "", "URL of a running llama-server (the decoder)")
	fs.StringVar(&c.DecoderBin, "decoder-bin", "", "llama-server binary to launch and supervise (args after --)")
	fs.StringVar(&c.Model, "model", "", "model GGUF path (passed to the provider and a launched decoder)")
	fs.IntVar(&c.Slots, "slots", 0, "decoder slots (llama-server -np); 0 = ask the decoder's /props")
	fs.IntVar(&c.Queue, "queue", 256, "requests that may wait for a slot before 503")
	fs.StringVar(&c.SlotDir, "slot-dir", "", "directory shared with the decoder's --slot-save-path (default <state-dir>/slots)")
	fs.StringVar(&c.Provider, "provider", "", "prefill provider executable (none: plain route)")
	fs.Var(&c.ProviderArgs, "provider-arg", "extra argument for the provider (repeatable)")
	fs.BoolVar(&c.KVShare, "kv-share", os.Getenv("ONEBIT_KV_SHARE") == "1", "shared route: KV regions as fds over a unix socket (env ONEBIT_KV_SHARE=1)")
	fs.DurationVar(&c.ProviderTimeout, "provider-timeout", 60*time.Second, "provider run time limit (the process group is killed)")
	fs.DurationVar(&c.AcceptTimeout, "accept-timeout", 5*time.Second, "time for the decoder to connect and send the share message")
	fs.DurationVar(&c.ShareTimeout, "share-timeout", 10*time.Second, "time for ?action=share to answer")
	fs.DurationVar(&c.ApplyTimeout, "adopt-timeout", 60*time.Second, "time for ?action=adopt or ?action=restore to answer")
	fs.DurationVar(&c.DecoderWait, "decoder-wait", 120*time.Second, "how long to wait for the decoder at startup")
	fs.StringVar(&c.StateDir, "state-dir", "./onebitd-state", "state directory (slots, event log, JetStream store)")
	fs.StringVar(&c.EventLog, "event-log", "", "event log path, or off (default <state-dir>/events.jsonl)")
	fs.StringVar(&c.EventLogSync, "event-log-sync", "batch", "event log fsync policy: always|batch|off")
	fs.StringVar(&c.NATSURL, "nats-url", "", "external NATS server(s) instead of the embedded one")
	fs.StringVar(&c.NATSListen, "nats-listen", "127.0.0.1:4222", "embedded NATS listen address, or off (in-process only)")
	fs.BoolVar(&c.JetStream, "jetstream", false, "persist events in JetStream stream ONEBIT")
	fs.StringVar(&c.Node, "node", host, "node name in events and NATS subjects")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text|json")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug|info|warn|error")
	fs.Int64Var(&c.MaxBody, "max-body", handlers.DefaultMaxBody, "largest completion request body in bytes (413 above)")
}

func serveMain(args []string) int {
	fs := flag.NewFlagSet("onebitd serve", flag.ContinueOnError)
	var c serveConfig
	serveFlags(fs, &c)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	c.DecoderArgs = fs.Args()
	log, err := newLogger(c.LogFormat, c.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "onebitd:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, c, log); err != nil {
		log.Error("onebitd stopped", "error", err)
		return 1
	}
	return 0
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad --log-level %q", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("bad --log-format %q (text|json)", format)
}

// stemLen is the longest file stem a request uses (handoff.NewRequestID).
const stemLen = handoff.RequestIDLen

func (c *serveConfig) check() error {
	if (c.DecoderURL == "") == (c.DecoderBin == "") {
		return errors.New("give exactly one of --decoder-url and --decoder-bin")
	}
	if c.Provider != "" && c.Model == "" {
		return errors.New("--provider needs --model (the provider loads the same model)")
	}
	if c.SlotDir == "" {
		c.SlotDir = filepath.Join(c.StateDir, "slots")
	}
	abs, err := filepath.Abs(c.SlotDir)
	if err != nil {
		return err
	}
	c.SlotDir = abs
	if c.KVShare {
		if n := len(abs) + 1 + stemLen + len(".sock"); n > fdpass.MaxPathLen() {
			return fmt.Errorf("--slot-dir %s is too long for a unix socket path (%d bytes of %d usable): choose a shorter directory", abs, n, fdpass.MaxPathLen())
		}
	}
	if c.EventLog == "" {
		c.EventLog = filepath.Join(c.StateDir, "events.jsonl")
	}
	return nil
}

func serve(ctx context.Context, c serveConfig, log *slog.Logger) error {
	if err := c.check(); err != nil {
		return err
	}
	// fds inherited without close-on-exec (from a shell or a supervisor)
	// would otherwise reach every provider beside the region fds.
	provider.CloseOnExecInherited()
	if err := os.MkdirAll(c.SlotDir, 0o700); err != nil {
		return fmt.Errorf("slot dir: %w", err)
	}
	if n, err := handoff.CleanStale(c.SlotDir); err != nil {
		return fmt.Errorf("slot dir: %w", err)
	} else if n > 0 {
		log.Warn("removed handoff files left by an earlier run that did not stop cleanly", "slot_dir", c.SlotDir, "files", n)
	}
	events, closeEvents, err := openEvents(ctx, &c, log)
	if err != nil {
		return err
	}
	defer closeEvents()

	decoderURL := c.DecoderURL
	var launched *launcher.Decoder
	if c.DecoderBin != "" {
		if c.Slots == 0 {
			c.Slots = 1
		}
		log.Info("launching the decoder", "bin", c.DecoderBin, "args", strings.Join(c.DecoderArgs, " "))
		launched, err = launcher.Start(ctx, launcher.Config{
			Bin: c.DecoderBin, Args: c.DecoderArgs, Model: c.Model, SlotDir: c.SlotDir, Slots: c.Slots,
			Sink: events, Logger: log,
		})
		if err != nil {
			return fmt.Errorf("decoder: %w", err)
		}
		defer func() {
			if err := launched.Stop(); err != nil {
				log.Warn("decoder stop", "error", err)
			}
		}()
		decoderURL = launched.URL()
	}
	dec, err := decoder.New(decoderURL, nil)
	if err != nil {
		return err
	}
	if launched == nil { // a launched decoder is ready when Start returns
		if err := waitDecoder(ctx, dec, c.DecoderWait, log); err != nil {
			return err
		}
	}
	props, err := dec.Props(ctx)
	if err != nil {
		return fmt.Errorf("decoder /props: %w", err)
	}
	if c.Slots == 0 {
		c.Slots = max(props.TotalSlots, 1)
	}
	if props.TotalSlots > 0 && c.Slots > props.TotalSlots {
		return fmt.Errorf("--slots %d but the decoder has %d slots (llama-server wraps slot ids: refusing)", c.Slots, props.TotalSlots)
	}

	hcfg := handlers.Config{
		Decoder: dec,
		Pool:    slots.New(c.Slots, c.Queue),
		Sink:    events,
		Logger:  log,
		MaxBody: c.MaxBody,
	}
	if launched != nil {
		hcfg.Ready = launched.Ready
	}
	route := machine.RoutePlain
	if c.Provider != "" {
		prov := &provider.Runner{Path: c.Provider, Args: c.ProviderArgs, Timeout: c.ProviderTimeout, Logger: log}
		hcfg.Handoff = handoff.NewHandoff(handoff.Config{
			SlotDir:        c.SlotDir,
			Model:          c.Model,
			Share:          c.KVShare,
			AcceptTimeout:  c.AcceptTimeout,
			ShareTimeout:   c.ShareTimeout,
			ApplyTimeout:   c.ApplyTimeout,
			CheckPeerCreds: true,
			PeerUID:        os.Getuid(),
			PeerPID:        peerPID(launched),
		}, dec, prov, log)
		route = hcfg.Handoff.Route()
	}
	front, err := handlers.New(hcfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           front,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("onebitd serving", "listen", "http://"+ln.Addr().String(), "decoder", dec.BaseURL(),
		"route", route, "slots", c.Slots, "slot_dir", c.SlotDir, "provider", c.Provider)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("onebitd draining in-flight requests")
	sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	log.Info("onebitd stopped cleanly")
	return nil
}

// peerPID is the pid a share socket's peer must have: the launched
// decoder's; nil when attached by URL (then the peer must run as our uid).
func peerPID(d *launcher.Decoder) func() int {
	if d == nil {
		return nil
	}
	return d.PID
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
			log.Info("waiting for the decoder", "decoder", dec.BaseURL(), "error", err)
			logged = true
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("decoder not ready after %s: %w", limit, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Second)
	}
}

// openEvents builds the event pipeline: recorder → event log → NATS
// (persist before publish).
func openEvents(ctx context.Context, c *serveConfig, log *slog.Logger) (event.Sink, func(), error) {
	var sinks []event.Sink
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	if log.Enabled(ctx, slog.LevelDebug) {
		sinks = append(sinks, event.SinkFunc(func(e *event.Event) {
			log.Debug("transition", "request_id", e.RequestID, "slot", e.Slot, "route", e.Route, "event", e.Event,
				"from", e.From, "to", e.To, "reason", e.Reason, "step", e.Step, "seq", e.Seq)
		}))
	}
	if c.EventLog != "off" {
		policy, err := eventlog.ParseSyncPolicy(c.EventLogSync)
		if err != nil {
			return nil, nil, err
		}
		w, torn, err := eventlog.Open(c.EventLog, policy, log)
		if err != nil {
			return nil, nil, fmt.Errorf("event log: %w", err)
		}
		if !torn.IsZero() {
			log.Warn("event log had a torn last line (a crash mid-write); kept aside and truncated",
				"path", c.EventLog, "offset", torn.Offset, "bytes", torn.Bytes, "saved_to", torn.SavedTo, "reason", torn.Reason)
		}
		sinks = append(sinks, w)
		closers = append(closers, func() {
			if err := w.Close(); err != nil {
				log.Error("event log close", "error", err)
			}
		})
	}
	b, err := bus.Open(ctx, bus.Config{
		URLs: c.NATSURL, Listen: c.NATSListen, JetStream: c.JetStream,
		StoreDir: filepath.Join(c.StateDir, "jetstream"), Node: c.Node, Logger: log,
	})
	if err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("nats: %w", err)
	}
	sinks = append(sinks, b)
	closers = append(closers, func() {
		if err := b.Close(); err != nil {
			log.Warn("nats close", "error", err)
		}
		st := b.Stats() // after Close: the drain's publishes and drops count
		log.Info("nats bus closed", "published", st.Published, "dropped", st.Dropped)
	})
	if u := b.ClientURL(); u != "" {
		log.Info("events on nats", "url", u, "subjects", "onebit.>", "watch", "onebitd watch --nats-url "+u)
	}
	return event.NewRecorder(c.Node, sinks...), closeAll, nil
}
