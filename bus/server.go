package bus

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultListen is where the embedded server listens unless told otherwise
// (--nats-listen), and DefaultURL where clients (watch, replay --stream)
// look for it unless told otherwise (--nats-url). The one place this
// address is written.
const (
	DefaultListen = "127.0.0.1:4222"
	DefaultURL    = "nats://" + DefaultListen
)

// ListenOff is the --nats-listen value for an in-process-only server.
const ListenOff = "off"

// readyTimeout bounds the wait for the embedded server to accept clients.
const (
	readyTimeout = 10 * time.Second
	readyPoll    = 50 * time.Millisecond
)

// parseListen turns --nats-listen into host and port for server.Options.
// "" means DefaultListen; "off" means no listener (dontListen). Port 0 or -1
// asks for a random port.
func parseListen(s string) (host string, port int, dontListen bool, err error) {
	switch strings.TrimSpace(s) {
	case "":
		s = DefaultListen
	case ListenOff:
		return "", 0, true, nil
	}
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, false, fmt.Errorf("%w %q: %w", ErrBadListen, s, err)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < -1 || port > 65535 {
		return "", 0, false, fmt.Errorf("%w %q: port must be a number in 0..65535 (0 or -1: random)", ErrBadListen, s)
	}
	if port == 0 {
		port = server.RANDOM_PORT // 0 would mean nats-server's default 4222
	}
	if h == "" {
		h = "127.0.0.1"
	}
	return h, port, false, nil
}

// startServer starts the embedded nats-server described by cfg, admitting
// only the identities of creds, and waits until it accepts connections.
func startServer(cfg *Config, creds *credentials) (*server.Server, error) {
	host, port, dontListen, err := parseListen(cfg.Listen)
	if err != nil {
		return nil, err
	}
	opts := &server.Options{
		ServerName: Token(cfg.Node),
		Host:       host,
		Port:       port,
		DontListen: dontListen,
		NoSigs:     true,
		Nkeys:      creds.serverUsers(),
	}
	if err := clusterOptions(cfg, opts); err != nil {
		return nil, err
	}
	if cfg.JetStream {
		if cfg.StoreDir == "" {
			return nil, ErrNoStoreDir
		}
		opts.JetStream = true
		opts.StoreDir = cfg.StoreDir
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("bus: embedded nats server (listen %q): %w", cfg.Listen, err)
	}
	lg := cfg.Logger.With(logKeyComponent, "nats-server")
	adapter := slogAdapter{l: lg, fatal: new(atomic.Pointer[string])}
	srv.SetLoggerV2(adapter, lg.Enabled(context.Background(), slog.LevelDebug), false, false)
	srv.Start()
	// Poll readiness in short steps so that a fatal start error (port in
	// use) fails now, not after readyTimeout.
	for deadline := time.Now().Add(readyTimeout); ; {
		if srv.ReadyForConnections(readyPoll) {
			return srv, nil
		}
		msg := adapter.fatal.Load()
		if msg != nil || time.Now().After(deadline) {
			srv.Shutdown()
			srv.WaitForShutdown()
			if msg != nil {
				return nil, fmt.Errorf("%w (listen %q): %s (another onebitd or nats-server there? use --nats-listen with another address, or off)", ErrServerNotReady, cfg.Listen, *msg)
			}
			return nil, fmt.Errorf("%w after %v (listen %q)", ErrServerNotReady, readyTimeout, cfg.Listen)
		}
	}
}

// slogAdapter sends nats-server's log through log/slog. It remembers the
// first fatal message so that startServer can report it.
type slogAdapter struct {
	l     *slog.Logger
	fatal *atomic.Pointer[string]
}

var _ server.Logger = slogAdapter{}

func (a slogAdapter) Noticef(format string, v ...any) { a.log(slog.LevelInfo, format, v) }
func (a slogAdapter) Warnf(format string, v ...any)   { a.log(slog.LevelWarn, format, v) }
func (a slogAdapter) Errorf(format string, v ...any)  { a.log(slog.LevelError, format, v) }

// Fatalf logs at error level: the server calls it for errors it cannot
// recover from, but exiting is the daemon's decision, not the bus's.
func (a slogAdapter) Fatalf(format string, v ...any) {
	if a.fatal != nil {
		msg := fmt.Sprintf(format, v...)
		a.fatal.CompareAndSwap(nil, &msg)
	}
	a.log(slog.LevelError, format, v)
}
func (a slogAdapter) Debugf(format string, v ...any) { a.log(slog.LevelDebug, format, v) }
func (a slogAdapter) Tracef(format string, v ...any) { a.log(slog.LevelDebug, format, v) }

func (a slogAdapter) log(level slog.Level, format string, v []any) {
	ctx := context.Background()
	if !a.l.Enabled(ctx, level) {
		return
	}
	a.l.Log(ctx, level, "nats server", logKeyServerLog, fmt.Sprintf(format, v...))
}
