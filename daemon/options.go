package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/handlers"
	"github.com/onebitd/onebitd/handoff"
)

// Defaults of Options: the one place they live. cmd/onebitd registers its
// flags with these values and New fills a zero field with them.
const (
	DefaultListen          = "127.0.0.1:8080"
	DefaultQueue           = 256
	DefaultStateDir        = "./onebitd-state"
	DefaultEventLogSync    = "batch"
	DefaultProviderTimeout = 60 * time.Second
	DefaultAcceptTimeout   = handoff.DefaultAcceptTimeout
	DefaultShareTimeout    = handoff.DefaultShareTimeout
	DefaultApplyTimeout    = handoff.DefaultApplyTimeout
	DefaultDecoderWait     = 120 * time.Second
	DefaultDrainTimeout    = 90 * time.Second
	DefaultBodyTimeout     = handlers.DefaultBodyTimeout
	DefaultProviderMode    = ProviderModeExec
	DefaultMaxBody         = handlers.DefaultMaxBody
	DefaultReadHeader      = 10 * time.Second
	DefaultIdle            = 120 * time.Second
	// EventLogOff and NATSOff turn the event log and the embedded NATS
	// server's listener off.
	EventLogOff = "off"
	NATSOff     = bus.ListenOff
)

// Provider modes (--provider-mode): a process per request, or one warm
// provider fed over a unix socket (DESIGN §2c).
const (
	ProviderModeExec  = "exec"
	ProviderModeServe = "serve"
)

// DefaultNATSListen is where the embedded NATS server listens.
const DefaultNATSListen = bus.DefaultListen

// Options is everything `onebitd serve` is told (DESIGN §8). The zero value
// of a field means its default.
type Options struct {
	Listen      string   // HTTP listen address
	DecoderURL  string   // a running llama-server; or
	DecoderBin  string   // a llama-server binary to launch and supervise
	DecoderArgs []string // its arguments
	// DecoderAPIKeyFile holds the key of a decoder attached by URL (its
	// --api-key-file); a launched decoder gets a per-boot key of its own.
	DecoderAPIKeyFile string
	Model             string // model GGUF (provider and launched decoder)
	Slots             int    // decoder slots; 0: the decoder's /props (1 when launched)
	Queue             int    // requests waiting for a slot before 503
	SlotDir           string // default <StateDir>/slots

	Provider     string   // prefill provider executable; "" = plain route
	ProviderArgs []string // extra provider arguments
	ProviderMode string   // ProviderModeExec or ProviderModeServe
	KVShare      bool     // shared route instead of the file route
	// Handoff (--handoff auto|always|never) decides per request whether
	// the handoff pays (package planner). "" keeps the behaviour before
	// issue 13 (always); the flag defaults to auto.
	Handoff          string
	HandoffMinTokens int // --handoff-min-tokens: auto's floor before the cost model has data; 0: planner.DefaultMinTokens
	ProviderTimeout  time.Duration
	AcceptTimeout    time.Duration
	ShareTimeout     time.Duration
	ApplyTimeout     time.Duration
	DecoderWait      time.Duration // waiting for an attached decoder at startup
	DrainTimeout     time.Duration // SIGTERM drain limit

	StateDir     string
	EventLog     string // path, or EventLogOff; default <StateDir>/events.jsonl
	EventLogSync string // always|batch|off

	NATSURL    string // external NATS servers instead of the embedded one
	NATSListen string // embedded server address, or NATSOff
	JetStream  bool
	Node       string // default: the host name

	MaxBody int64

	// Clients (DESIGN §2d): API keys (--api-key-file), the body deadline,
	// and the operator's opt-in to the decoder's /slots API.
	APIKeyFile     string
	BodyTimeout    time.Duration
	ExposeSlotsAPI bool

	// MetricsListen gives /metrics a listener of its own (else it is on
	// Listen, behind the API keys like the rest).
	MetricsListen string

	// NATS beyond the defaults: an external server's identity and CA, and
	// the JetStream stream's shape.
	NATSCreds      string
	NATSNKey       string
	NATSTLSCA      string
	StreamReplicas int
	StreamMaxAge   time.Duration
	StreamMaxBytes int64
	// Embedded NATS cluster (bus.Config.Cluster*) and the reconnect buffer
	// of an external server (bus.Config.ReconnectBufSize).
	NATSCluster       string
	NATSRoutes        string
	NATSClusterListen string
	NATSClusterSecret string
	NATSReconnectBuf  int

	// PrefillBin launches a second llama-server as the prefill server
	// (issue 15): onebit-prefill is the provider, on the file route.
	PrefillBin      string
	PrefillArgs     []string // its args; default the decoder's
	PrefillProvider string   // onebit-prefill's path; default beside onebitd, else PATH
}

// withDefaults returns o with every zero field set to its default and the
// derived paths made absolute.
func (o Options) withDefaults() (Options, error) {
	if o.Listen == "" {
		o.Listen = DefaultListen
	}
	if o.Queue == 0 {
		o.Queue = DefaultQueue
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if o.EventLogSync == "" {
		o.EventLogSync = DefaultEventLogSync
	}
	if o.ProviderTimeout == 0 {
		o.ProviderTimeout = DefaultProviderTimeout
	}
	if o.AcceptTimeout == 0 {
		o.AcceptTimeout = DefaultAcceptTimeout
	}
	if o.ShareTimeout == 0 {
		o.ShareTimeout = DefaultShareTimeout
	}
	if o.ApplyTimeout == 0 {
		o.ApplyTimeout = DefaultApplyTimeout
	}
	if o.DecoderWait == 0 {
		o.DecoderWait = DefaultDecoderWait
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.MaxBody == 0 {
		o.MaxBody = DefaultMaxBody
	}
	if o.BodyTimeout == 0 {
		o.BodyTimeout = DefaultBodyTimeout
	}
	if o.ProviderMode == "" {
		o.ProviderMode = DefaultProviderMode
	}
	if o.NATSListen == "" {
		o.NATSListen = DefaultNATSListen
	}
	if o.Node == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "onebitd"
		}
		o.Node = host
	}
	// Absolute: the paths built from it name unix sockets and key files
	// that other processes open (a launched decoder's unix:// address, the
	// share sockets), from another working directory.
	st, err := filepath.Abs(o.StateDir)
	if err != nil {
		return o, err
	}
	o.StateDir = st
	if o.SlotDir == "" {
		o.SlotDir = filepath.Join(o.StateDir, "slots")
	}
	if o.EventLog == "" {
		o.EventLog = filepath.Join(o.StateDir, "events.jsonl")
	}
	if o.APIKeyFile != "" {
		if o.APIKeyFile, err = filepath.Abs(o.APIKeyFile); err != nil {
			return o, err
		}
	}
	abs, err := filepath.Abs(o.SlotDir)
	if err != nil {
		return o, err
	}
	o.SlotDir = abs
	return o, o.check()
}

// Errors of Options.
var (
	ErrDecoderChoice = errors.New("daemon: give exactly one of --decoder-url and --decoder-bin")
	ErrNoModel       = errors.New("daemon: --provider needs --model (the provider loads the same model)")
	ErrSlotDirLong   = errors.New("daemon: --slot-dir is too long for a unix socket path")
	ErrDrainTooShort = errors.New("daemon: the drain limit must exceed the handoff's limits")
	ErrProviderMode  = errors.New("daemon: bad --provider-mode")
)

func (o *Options) check() error {
	if (o.DecoderURL == "") == (o.DecoderBin == "") {
		return ErrDecoderChoice
	}
	if err := o.checkPrefill(); err != nil {
		return err
	}
	if o.Provider != "" && o.Model == "" {
		return ErrNoModel
	}
	if o.ProviderMode != ProviderModeExec && o.ProviderMode != ProviderModeServe {
		return fmt.Errorf("%w: %q (exec|serve)", ErrProviderMode, o.ProviderMode)
	}
	if o.KVShare {
		if n := len(o.SlotDir) + 1 + handoff.RequestIDLen + len(".sock"); n > fdpass.MaxPathLen() {
			return fmt.Errorf("%w: %s needs %d bytes of %d usable; choose a shorter directory", ErrSlotDirLong, o.SlotDir, n, fdpass.MaxPathLen())
		}
	}
	if o.DrainTimeout <= drainMargin {
		return fmt.Errorf("%w: --drain-timeout %s (at least %s)", ErrDrainTooShort, o.DrainTimeout, 2*drainMargin)
	}
	return nil
}

// drainMargin is what the drain keeps for forwarding after it cut the
// in-flight handoffs short (they fall back and are forwarded as they came).
const drainMargin = 5 * time.Second
