package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/daemon"
	"github.com/onebitd/onebitd/planner"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, " ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// serveFlags registers `onebitd serve`'s flags (DESIGN §8) into o, with
// daemon's defaults.
func serveFlags(fs *flag.FlagSet, o *daemon.Options, logFormat, logLevel *string) {
	host, _ := os.Hostname()
	fs.StringVar(&o.Listen, "listen", daemon.DefaultListen, "HTTP listen address")
	fs.StringVar(&o.DecoderURL, "decoder-url", "", "URL of a running llama-server (the decoder)")
	fs.StringVar(&o.DecoderBin, "decoder-bin", "", "llama-server binary to launch and supervise (args after --)")
	fs.StringVar(&o.DecoderAPIKeyFile, "decoder-api-key-file", "", "API key of a decoder attached by --decoder-url (its --api-key-file); a launched decoder gets a per-boot key")
	fs.StringVar(&o.Model, "model", "", "model GGUF path (passed to the provider and a launched decoder)")
	fs.IntVar(&o.Slots, "slots", 0, "decoder slots (llama-server -np); 0 = ask the decoder's /props (1 with --decoder-bin)")
	fs.IntVar(&o.Queue, "queue", daemon.DefaultQueue, "requests that may wait for a slot before 503")
	fs.StringVar(&o.SlotDir, "slot-dir", "", "directory shared with the decoder's --slot-save-path (default <state-dir>/slots)")
	fs.StringVar(&o.Provider, "provider", "", "prefill provider executable (none: plain route)")
	fs.Var((*stringList)(&o.ProviderArgs), "provider-arg", "extra argument for the provider (repeatable)")
	fs.StringVar(&o.Handoff, "handoff", string(planner.ModeAuto), "auto: hand over only when the cost model (learned online) says it pays; always: every request; never: none (plain route, with a decision)")
	fs.IntVar(&o.HandoffMinTokens, "handoff-min-tokens", planner.DefaultMinTokens, "auto: the static floor (tokens to prefill) used before the cost model has data")
	fs.StringVar(&o.ProviderMode, "provider-mode", daemon.DefaultProviderMode, "exec: a provider process per request; serve: one warm provider fed over a unix socket (PROVIDER --serve --socket …)")
	fs.BoolVar(&o.KVShare, "kv-share", os.Getenv("ONEBIT_KV_SHARE") == "1", "shared route: KV regions as fds over a unix socket (env ONEBIT_KV_SHARE=1)")
	fs.DurationVar(&o.ProviderTimeout, "provider-timeout", daemon.DefaultProviderTimeout, "provider run time limit (the process group is killed)")
	fs.DurationVar(&o.AcceptTimeout, "accept-timeout", daemon.DefaultAcceptTimeout, "time for the decoder to connect and send the share message")
	fs.DurationVar(&o.ShareTimeout, "share-timeout", daemon.DefaultShareTimeout, "time for ?action=share to answer")
	fs.DurationVar(&o.ApplyTimeout, "adopt-timeout", daemon.DefaultApplyTimeout, "time for ?action=adopt or ?action=restore to answer")
	fs.DurationVar(&o.DecoderWait, "decoder-wait", daemon.DefaultDecoderWait, "how long to wait for the decoder at startup")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", daemon.DefaultDrainTimeout, "SIGTERM drain limit; in-flight handoffs fall back 5s before it so every client is answered")
	fs.StringVar(&o.StateDir, "state-dir", daemon.DefaultStateDir, "state directory (slots, event log, NATS credentials, JetStream store)")
	fs.StringVar(&o.EventLog, "event-log", "", "event log path, or off (default <state-dir>/events.jsonl)")
	fs.StringVar(&o.EventLogSync, "event-log-sync", daemon.DefaultEventLogSync, "event log fsync policy: always|batch|off")
	fs.StringVar(&o.NATSURL, "nats-url", "", "external NATS server(s) instead of the embedded one")
	fs.StringVar(&o.NATSListen, "nats-listen", daemon.DefaultNATSListen, "embedded NATS listen address, or off (in-process only)")
	fs.BoolVar(&o.JetStream, "jetstream", false, "persist events in JetStream stream ONEBIT")
	fs.StringVar(&o.Node, "node", host, "node name in events and NATS subjects")
	fs.Int64Var(&o.MaxBody, "max-body", daemon.DefaultMaxBody, "largest completion request body in bytes (413 above)")
	fs.DurationVar(&o.BodyTimeout, "body-timeout", daemon.DefaultBodyTimeout, "time a client has to send its request body once its headers arrived (408 after)")
	fs.StringVar(&o.APIKeyFile, "api-key-file", "", "client API keys, one a line (Authorization: Bearer KEY; 401 without; /health stays open)")
	fs.StringVar(&o.MetricsListen, "metrics-listen", "", "serve /metrics on this address of its own (default: on --listen, behind the API keys)")
	fs.BoolVar(&o.ExposeSlotsAPI, "expose-slots-api", false, "let clients reach the decoder's /slots API (save, restore, erase, share, adopt: every slot's KV); an operator's tool, off by default (403)")
	fs.StringVar(&o.NATSCreds, "nats-creds", "", "with --nats-url: this daemon's NATS credentials (a .creds file or an nkey seed file)")
	fs.StringVar(&o.NATSNKey, "nats-nkey", "", "with --nats-url: this daemon's nkey seed file")
	fs.StringVar(&o.NATSTLSCA, "nats-tls-ca", "", "with --nats-url: CA of the servers' TLS certificates")
	fs.IntVar(&o.StreamReplicas, "stream-replicas", 0, "with --jetstream: replicas of stream ONEBIT (3 on a cluster)")
	fs.DurationVar(&o.StreamMaxAge, "stream-max-age", 0, "with --jetstream: oldest event stream ONEBIT keeps (0: no limit)")
	fs.Int64Var(&o.StreamMaxBytes, "stream-max-bytes", 0, "with --jetstream: bytes stream ONEBIT keeps (0: no limit)")
	fs.StringVar(&o.NATSCluster, "nats-cluster", "", "embedded NATS: join the embedded servers of several nodes into cluster NAME (with --nats-routes, --nats-cluster-secret)")
	fs.StringVar(&o.NATSRoutes, "nats-routes", "", "with --nats-cluster: the nodes' route addresses, comma-separated nats-route://host:port")
	fs.StringVar(&o.NATSClusterListen, "nats-cluster-listen", "", "with --nats-cluster: where this node listens for routes (default "+bus.DefaultClusterListen+")")
	fs.StringVar(&o.NATSClusterSecret, "nats-cluster-secret", "", "with --nats-cluster: file (0600) holding the route secret, the same on every node")
	fs.IntVar(&o.NATSReconnectBuf, "nats-reconnect-buf", 0, "with --nats-url: bytes of events kept while reconnecting (0: 4 MiB, -1: none); catch-up resends the rest")
	fs.StringVar(&o.PrefillBin, "prefill-bin", "", "launch this llama-server as the prefill server too (file route through onebit-prefill; same args as the decoder unless --prefill-arg)")
	fs.Var((*stringList)(&o.PrefillArgs), "prefill-arg", "argument for the prefill server (repeatable; default: the decoder's args)")
	fs.StringVar(&o.PrefillProvider, "prefill-provider", "", "onebit-prefill binary (default: beside onebitd, else in PATH)")
	fs.StringVar(logFormat, "log-format", "text", "log format: text|json")
	fs.StringVar(logLevel, "log-level", "info", "log level: debug|info|warn|error")
}

func serveMain(args []string) int {
	fs := flag.NewFlagSet("onebitd serve", flag.ContinueOnError)
	var o daemon.Options
	var logFormat, logLevel string
	serveFlags(fs, &o, &logFormat, &logLevel)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	o.DecoderArgs = fs.Args()
	log, err := newLogger(logFormat, logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "onebitd:", err)
		return 2
	}
	d, err := daemon.New(o, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "onebitd:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// A second signal during the drain exits at once; the deferred
		// Close in Run is skipped, but every child dies with us
		// (Pdeathsig) and the next start cleans the slot dir.
		<-ctx.Done()
		stop()
		again := make(chan os.Signal, 1)
		signal.Notify(again, os.Interrupt, syscall.SIGTERM)
		<-again
		log.Warn("second signal: exiting without draining")
		d.Close()
		os.Exit(1)
	}()
	if err := d.Run(ctx); err != nil {
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
