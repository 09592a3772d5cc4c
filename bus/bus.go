package bus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onebitd/onebitd/event"
)

// Errors.
var (
	// ErrBadListen: --nats-listen is neither "off" nor host:port.
	ErrBadListen = errors.New("bus: bad --nats-listen address")
	// ErrNoStoreDir: JetStream on the embedded server needs a store directory.
	ErrNoStoreDir = errors.New("bus: jetstream on the embedded server needs a store directory")
	// ErrServerNotReady: the embedded server did not accept connections in time.
	ErrServerNotReady = errors.New("bus: embedded nats server not ready for connections")
	// ErrClosed: the bus was closed.
	ErrClosed = errors.New("bus: closed")
	// ErrNotAnEvent: a stream message's payload is not an event (StreamEvents
	// yields it and goes on). A reader can cause one: docs/security.md.
	ErrNotAnEvent = errors.New("bus: stream message is not an event")
	// ErrAckedFile: the acknowledgement record (AckedFile) cannot be read.
	ErrAckedFile = errors.New("bus: bad jetstream acknowledgement record")
	// ErrCreds: a credentials file (--nats-creds, --nats-nkey, or the
	// embedded server's seed files) cannot be read, written or parsed.
	ErrCreds = errors.New("bus: cannot use NATS credentials")
	// ErrCredsMode: a seed file of the embedded server can be read or
	// written by other users.
	ErrCredsMode = errors.New("bus: NATS credentials file is open to other users")
	// ErrClientFlagsEmbedded: --nats-creds, --nats-nkey or --nats-tls-ca
	// given without --nats-url (the embedded server makes its own).
	ErrClientFlagsEmbedded = errors.New("bus: --nats-creds, --nats-nkey and --nats-tls-ca are for an external server (--nats-url)")
)

// Defaults.
const (
	DefaultQueueSize = 8192
	// DefaultReconnectBufSize is what nats.go keeps while reconnecting to an
	// external server; publishes beyond it are dropped and counted.
	DefaultReconnectBufSize = 4 << 20
	// StreamName and StreamSubjects describe the JetStream stream (--jetstream).
	StreamName     = "ONEBIT"
	StreamSubjects = SubjectPrefix + ".>"

	closeDrainTimeout = 2 * time.Second
	setupTimeout      = 10 * time.Second
	jsMaxPending      = 4096
	jsAckTimeout      = 30 * time.Second
	jsStallWait       = 100 * time.Millisecond
	dropLogInterval   = time.Second
	encodeBufSize     = 384 // a typical event fits: one allocation
	reconnectMin      = 50 * time.Millisecond
	reconnectMax      = 5 * time.Second
)

// Attr keys of the bus's log lines.
const (
	logKeyComponent = "component"
	logKeyServerLog = "nats_log"
	logKeyURL       = "url"
	logKeyError     = "error"
	logKeyDropped   = "dropped_total"
	logKeyStream    = "stream"
	logKeyDelay     = "delay"
)

// Config says where events go. The zero value (plus a Node) runs an embedded
// server listening on DefaultListen, without JetStream, that admits only
// its two identities (keys in memory when StateDir is empty).
type Config struct {
	URLs      string // --nats-url: comma-separated; empty ⇒ embedded server
	Listen    string // --nats-listen for the embedded server: host:port, "off", port 0/-1 = random
	JetStream bool   // --jetstream: create or bind stream ONEBIT on "onebit.>"
	StoreDir  string // JetStream store of the embedded server (under the state dir)
	// Embedded cluster (cluster.go): the embedded servers of several nodes
	// route to each other and share JetStream. Routes present RouteUser and
	// the secret in ClusterSecretFile; none is accepted without it.
	ClusterName       string // --nats-cluster: the cluster's name, the same on every node
	ClusterListen     string // --nats-cluster-listen: route listener, host:port (DefaultClusterListen)
	ClusterRoutes     string // --nats-routes: comma-separated nats-route://host:port of the other nodes
	ClusterSecretFile string // --nats-cluster-secret: file (0600) with the route password shared by all nodes
	// Stream ONEBIT as onebitd creates it, or updates it when it binds one
	// whose value differs (zero: the server's default, or leave as is).
	StreamReplicas int           // --stream-replicas (a cluster: 3)
	StreamMaxAge   time.Duration // --stream-max-age
	StreamMaxBytes int64         // --stream-max-bytes
	// EventLog is the daemon's event log (--event-log). With JetStream and
	// a StateDir, the bus records what the stream acknowledged (AckedFile)
	// and republishes the rest of the log after an outage or a restart
	// (catch-up). Empty: no catch-up.
	EventLog string
	// StateDir (--state-dir) holds the embedded server's identities,
	// DaemonCredsFile and ReaderCredsFile (0600, created on first start).
	// Empty: the keys live in memory and only this process can connect.
	StateDir string
	// External server (--nats-url) only: the daemon's identity and the CA
	// of the server's TLS certificate. See Client for the file formats.
	CredsFile string // --nats-creds
	NKeyFile  string // --nats-nkey
	TLSCA     string // --nats-tls-ca
	Node      string // this daemon's node name (subject token and Nats-Msg-Id prefix)
	QueueSize int    // async publish queue; 0 ⇒ DefaultQueueSize
	// ReconnectBufSize is nats.go's buffer while reconnecting (bytes);
	// 0 ⇒ DefaultReconnectBufSize, -1 ⇒ no buffering (drop while down).
	ReconnectBufSize int
	Logger           *slog.Logger // nil ⇒ discard

	noPublisher bool // tests: leave the queue unconsumed
	noCatchUp   bool // tests: no catch-up goroutine (the test calls catchUpPass)
}

// Stats are the bus's counters since Open.
type Stats struct {
	Published  uint64 // handed to the server (JetStream: acknowledged)
	Dropped    uint64 // lost: queue full, reconnect buffer full, publish or ack error
	Duplicates uint64 // JetStream acks that reported a duplicate Nats-Msg-Id
	Queued     int    // waiting in the queue now
	Buffered   int    // bytes nats.go holds while reconnecting (-1 if closed)
	Reconnects uint64 // successful reconnects to an external server
	// Catch-up (JetStream with an EventLog): events of the log republished
	// and newly stored by the stream, and passes completed. Deferred: live
	// events left to the catch-up while it was behind (in order, not lost).
	Republished uint64
	CatchUps    uint64
	Deferred    uint64
}

// item is one queued message. The Nats-Msg-Id is built by the publisher,
// off the request path.
type item struct {
	subject string
	data    []byte
	node    string // for Nats-Msg-Id; empty ⇒ no id (Publish)
	boot    string
	seq     uint64
}

// Bus publishes events on NATS without ever blocking its callers.
type Bus struct {
	cfg   Config
	log   *slog.Logger
	srv   *server.Server // nil when connected to an external server
	creds *credentials   // the embedded server's identities
	nc    *nats.Conn
	js    jetstream.JetStream // nil without --jetstream

	streamReady atomic.Bool
	streamCheck chan struct{} // external JetStream: a reconnect asks keepStream to check the stream
	q           chan item
	done        chan struct{} // closed by Close: publisher drains and exits
	dropSignal  chan struct{} // wakes the reporter
	wg          sync.WaitGroup
	closed      atomic.Bool
	entered     atomic.Int64 // Emit/Publish calls past the closed check (see enter)
	closeOnce   sync.Once

	subjects sync.Map // to-state ⇒ subject, for cfg.Node

	published, dropped, duplicates, reconnects atomic.Uint64
	republished, catchUpRuns                   atomic.Uint64
	dropReported                               atomic.Uint64

	// Catch-up (nil acks: off).
	acks        *acks
	ackedPath   string
	catchUpKick chan struct{}
	liveBoot    atomic.Value  // string: boot of the last event handed to nats.go
	liveSeq     atomic.Uint64 // its seq
	// Behind (catch-up only): an event of this node missed the stream (a
	// drop, a refused publish, the stream not ready), so later live events
	// would land before it. Until the catch-up has republished the log up
	// to the last event kept back (skipBoot/skipSeq), live events are kept
	// back too: the stream gets every boot's events in seq order.
	behind   atomic.Bool
	behindMu sync.Mutex
	skipBoot string
	skipSeq  uint64
	deferred atomic.Uint64
	curBoot  atomic.Pointer[string] // boot of this process's events (the last one emitted)
	resumeAt int64                  // log offset where the next catch-up pass starts (catch-up goroutine only)

	boMu sync.Mutex
	bo   *backoff.ExponentialBackOff
}

var _ event.LineSink = (*Bus)(nil)

// Open starts the embedded server (cfg.URLs empty) or connects to an
// external one, sets up JetStream if asked, and starts the publisher. An
// external server that is down does not fail Open: the connection keeps
// retrying and events are buffered, then dropped and counted.
func Open(ctx context.Context, cfg Config) (*Bus, error) {
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.ReconnectBufSize == 0 {
		cfg.ReconnectBufSize = DefaultReconnectBufSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	b := &Bus{
		cfg:        cfg,
		log:        cfg.Logger.With(logKeyComponent, "bus"),
		q:          make(chan item, cfg.QueueSize),
		done:       make(chan struct{}),
		dropSignal: make(chan struct{}, 1),
	}
	if cfg.JetStream && (cfg.URLs != "" || cfg.ClusterName != "") {
		b.streamCheck = make(chan struct{}, 1)
	}
	if cfg.URLs != "" && (cfg.ClusterName != "" || cfg.ClusterRoutes != "") {
		return nil, fmt.Errorf("%w: --nats-cluster and --nats-routes are for the embedded server, not with --nats-url", ErrCluster)
	}
	if cfg.JetStream && cfg.EventLog != "" && cfg.StateDir != "" {
		b.ackedPath = filepath.Join(cfg.StateDir, AckedFile)
		a, err := loadAcks(b.ackedPath, cfg.Node)
		if err != nil {
			return nil, err
		}
		b.acks = a
		b.catchUpKick = make(chan struct{}, 1)
		// Live events wait for the first pass: the log may hold this
		// boot's first events (emitted before the bus) and the last boot's
		// tail, which belong before them in the stream.
		b.behind.Store(true)
	}
	var err error
	if cfg.URLs == "" {
		if set := cfg.credsFlagsSet(); len(set) > 0 {
			return nil, fmt.Errorf("%w (given: %s)", ErrClientFlagsEmbedded, strings.Join(set, ", "))
		}
		if b.creds, err = loadOrCreateCredentials(cfg.StateDir); err != nil {
			return nil, err
		}
		if b.srv, err = startServer(&b.cfg, b.creds); err != nil {
			return nil, err
		}
		b.nc, err = nats.Connect("", append(b.natsOptions(), nats.InProcessServer(b.srv), b.creds.daemon.option())...)
		if err != nil {
			b.shutdownServer()
			return nil, fmt.Errorf("bus: connect in-process to the embedded server: %w", err)
		}
		b.log.Info("nats embedded server ready", logKeyURL, b.ClientURL())
	} else {
		auth, err := authOptions(cfg.CredsFile, cfg.NKeyFile, cfg.TLSCA)
		if err != nil {
			return nil, err
		}
		b.bo = backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(reconnectMin),
			backoff.WithMaxInterval(reconnectMax),
			backoff.WithRandomizationFactor(0.5),
			backoff.WithMaxElapsedTime(0))
		opts := append(append(b.natsOptions(), auth...),
			nats.MaxReconnects(-1),
			nats.RetryOnFailedConnect(true),
			nats.CustomReconnectDelay(b.reconnectDelay),
			nats.ReconnectBufSize(cfg.ReconnectBufSize),
			nats.ConnectHandler(func(nc *nats.Conn) {
				b.log.Info("nats connected", logKeyURL, nc.ConnectedUrlRedacted())
			}),
		)
		b.nc, err = nats.Connect(cfg.URLs, opts...)
		if err != nil {
			return nil, fmt.Errorf("bus: connect to %s: %w", redactURLs(cfg.URLs), err)
		}
		if !b.nc.IsConnected() {
			b.log.Warn("nats server unreachable, retrying in the background", logKeyURL, redactURLs(cfg.URLs))
		}
	}
	if cfg.JetStream {
		if err := b.setupJetStream(ctx); err != nil {
			_ = b.Close()
			return nil, err
		}
	}
	b.wg.Add(1)
	go b.reporter()
	if b.acks != nil && !cfg.noCatchUp {
		b.wg.Add(1)
		go b.catchUp()
		b.kickCatchUp() // a restart: the last boot's tail
	}
	if !cfg.noPublisher {
		b.wg.Add(1)
		go b.publisher()
	}
	return b, nil
}

func (b *Bus) natsOptions() []nats.Option {
	return []nats.Option{
		nats.Name("onebitd " + b.cfg.Node),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if b.closed.Load() {
				return
			}
			b.log.Warn("nats disconnected", logKeyError, err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			b.reconnects.Add(1)
			b.boMu.Lock()
			if b.bo != nil {
				b.bo.Reset()
			}
			b.boMu.Unlock()
			if b.streamCheck != nil {
				select {
				case b.streamCheck <- struct{}{}:
				default:
				}
			}
			b.kickCatchUp() // an outage: what it dropped
			b.log.Info("nats reconnected", logKeyURL, nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			b.log.Warn("nats async error", logKeyError, err)
		}),
	}
}

// reconnectDelay is nats.go's CustomReconnectDelay: exponential with jitter,
// capped at reconnectMax, reset on every successful reconnect.
func (b *Bus) reconnectDelay(attempts int) time.Duration {
	b.boMu.Lock()
	defer b.boMu.Unlock()
	d := b.bo.NextBackOff()
	if d == backoff.Stop || d <= 0 {
		d = reconnectMax
	}
	b.log.Debug("nats reconnect wait", logKeyDelay, d, "attempts", attempts)
	return d
}

// Subject returns the subject e is published on: Subject(node, e.To) for a
// request transition, else the decoder/event subject of e.Event.
func (b *Bus) subjectOf(e *event.Event) string {
	node := e.Node
	if node == "" {
		node = b.cfg.Node
	}
	if e.To == "" {
		return eventSubject(node, e.Event)
	}
	if node != b.cfg.Node {
		return Subject(node, e.To)
	}
	if s, ok := b.subjects.Load(e.To); ok {
		return s.(string)
	}
	s := Subject(node, e.To)
	b.subjects.Store(e.To, s)
	return s
}

// Emit queues e for publishing. It never blocks: when the queue is full the
// event is dropped and counted (and logged at most once per second, with the
// running total, by another goroutine). It implements event.Sink.
func (b *Bus) Emit(e *event.Event) {
	if !b.enter() {
		return
	}
	defer b.entered.Add(-1)
	b.enqueueEvent(e, e.AppendJSON(make([]byte, 0, encodeBufSize)))
}

// EmitLine is Emit with e already encoded by the Recorder (one line of the
// event log, '\n' included, shared and immutable): the payload is line
// without its newline, and nothing is encoded again. It implements
// event.LineSink.
func (b *Bus) EmitLine(e *event.Event, line []byte) {
	if !b.enter() {
		return
	}
	defer b.entered.Add(-1)
	b.enqueueEvent(e, bytes.TrimSuffix(line, []byte{'\n'}))
}

func (b *Bus) enqueueEvent(e *event.Event, data []byte) {
	node := e.Node
	if node == "" {
		node = b.cfg.Node
	}
	if b.acks != nil && node == b.cfg.Node && e.Boot != "" {
		// This process's boot, known before the catch-up can carry its
		// events (the log is written before Emit): an atomic load per
		// event, a store once per boot.
		if cur := b.curBoot.Load(); cur == nil || *cur != e.Boot {
			boot := e.Boot
			b.curBoot.Store(&boot)
		}
	}
	b.enqueue(item{subject: b.subjectOf(e), data: data, node: node, boot: e.Boot, seq: e.Seq})
}

// Publish queues data for subject (an event that is not a handoff
// transition); same non-blocking contract as Emit. The bus keeps data.
func (b *Bus) Publish(subject string, data []byte) {
	if !b.enter() {
		return
	}
	defer b.entered.Add(-1)
	b.enqueue(item{subject: subject, data: data})
}

// enter admits one Emit or Publish: false (and the event counted as
// dropped) once Close has begun. An admitted call must b.entered.Add(-1)
// when its item is queued or dropped; Close waits for every admitted call
// before it stops the publisher, so that no item lands in the queue after
// the last drain (issue 9: such an item was neither published nor counted).
func (b *Bus) enter() bool {
	b.entered.Add(1)
	if b.closed.Load() {
		b.entered.Add(-1)
		b.drop()
		return false
	}
	return true
}

func (b *Bus) enqueue(it item) {
	select {
	case b.q <- it:
	default:
		b.drop()
		b.markBehind(it.boot, it.seq, it.node)
	}
}

func (b *Bus) drop() {
	b.dropped.Add(1)
	b.kickCatchUp()
	select {
	case b.dropSignal <- struct{}{}:
	default:
	}
}

// reporter logs drops, at most once per dropLogInterval, off the request path.
func (b *Bus) reporter() {
	defer b.wg.Done()
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	for {
		select {
		case <-b.dropSignal:
		case <-b.done:
			return // Close logs the final total
		}
		b.reportDrops()
		t.Reset(dropLogInterval)
		select {
		case <-t.C:
		case <-b.done:
			return
		}
	}
}

func (b *Bus) reportDrops() {
	n := b.dropped.Load()
	if old := b.dropReported.Swap(n); n != old {
		b.log.Warn("nats events dropped", logKeyDropped, n)
	}
}

// publisher takes items from the queue and hands them to nats.go until
// Close, then drains what is left for at most closeDrainTimeout.
func (b *Bus) publisher() {
	defer b.wg.Done()
	for {
		select {
		case it := <-b.q:
			b.publish(it)
		case <-b.done:
			deadline := time.NewTimer(closeDrainTimeout)
			defer deadline.Stop()
			for {
				select {
				case it := <-b.q:
					b.publish(it)
				case <-deadline.C:
					b.dropped.Add(uint64(len(b.q)))
					return
				default:
					return
				}
			}
		}
	}
}

func (b *Bus) publish(it item) {
	if b.js != nil && b.keepBack(it) {
		return
	}
	if b.js != nil && b.streamReady.Load() {
		m := &nats.Msg{Subject: it.subject, Data: it.data}
		var opts []jetstream.PublishOpt
		if it.node != "" {
			opts = append(opts, jetstream.WithMsgID(msgID(it)), jetstream.WithStallWait(jsStallWait))
		} else {
			opts = append(opts, jetstream.WithStallWait(jsStallWait))
		}
		if _, err := b.js.PublishMsgAsync(m, opts...); err != nil {
			b.drop()
			b.markBehind(it.boot, it.seq, it.node)
			b.log.Debug("jetstream publish failed", logKeyError, err)
			return
		}
		b.noteLive(it)
		return
	}
	var err error
	if b.js != nil && it.node != "" {
		// The stream is not set up (yet): live subscribers get it now; if
		// a stream does capture it, the id makes a later catch-up a
		// duplicate rather than a second copy.
		m := &nats.Msg{Subject: it.subject, Data: it.data, Header: nats.Header{nats.MsgIdHdr: []string{msgID(it)}}}
		err = b.nc.PublishMsg(m)
	} else {
		err = b.nc.Publish(it.subject, it.data)
	}
	if err != nil {
		b.drop()
		b.log.Debug("nats publish failed", logKeyError, err)
		return
	}
	b.published.Add(1)
}

// noteLive remembers the last event handed to nats.go for the stream: a
// catch-up pass leaves later events of that boot to the publisher.
func (b *Bus) noteLive(it item) {
	if it.node == "" || b.acks == nil {
		return
	}
	if cur, _ := b.liveBoot.Load().(string); cur != it.boot {
		b.liveBoot.Store(it.boot)
	}
	b.liveSeq.Store(it.seq)
}

// msgID is the Nats-Msg-Id of an event: "<node>/<boot>/<seq>", unique
// because seq grows by one per event within a boot (issue 14).
func msgID(it item) string {
	var sb strings.Builder
	sb.Grow(len(it.node) + len(it.boot) + 22)
	sb.WriteString(it.node)
	sb.WriteByte('/')
	sb.WriteString(it.boot)
	sb.WriteByte('/')
	sb.WriteString(strconv.FormatUint(it.seq, 10))
	return sb.String()
}

// ClientURL is where `nats sub` and `onebitd watch` should connect: the
// embedded server's listen address ("" when it does not listen), or the
// configured URLs of an external server.
func (b *Bus) ClientURL() string {
	if b.srv == nil {
		return b.cfg.URLs
	}
	if b.srv.Addr() == nil {
		return ""
	}
	return b.srv.ClientURL()
}

// InProcessConn opens a new client connection to the bus's server: to the
// embedded server in-process, as its reader identity (subscribe, no
// publish on onebit.>); else to the configured URLs with the daemon's
// credentials. The caller closes it.
func (b *Bus) InProcessConn() (*nats.Conn, error) {
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if b.srv != nil {
		nc, err := nats.Connect("", nats.InProcessServer(b.srv), nats.Name("onebitd in-process"), b.creds.reader.option())
		if err != nil {
			return nil, fmt.Errorf("bus: in-process connection: %w", err)
		}
		return nc, nil
	}
	return Client{URLs: b.cfg.URLs, CredsFile: b.cfg.CredsFile, NKeyFile: b.cfg.NKeyFile, TLSCA: b.cfg.TLSCA,
		Name: "onebitd client"}.Connect()
}

// ReaderCreds is the reader's seed file of the embedded server (for
// `onebitd watch --nats-creds`), or "" (an external server, or no state
// dir).
func (b *Bus) ReaderCreds() string {
	if b.creds == nil {
		return ""
	}
	return b.creds.reader.path
}

// Stats returns the counters.
func (b *Bus) Stats() Stats {
	s := Stats{
		Published:  b.published.Load(),
		Dropped:    b.dropped.Load(),
		Duplicates: b.duplicates.Load(),
		Queued:     len(b.q),
		Reconnects: b.reconnects.Load(),

		Republished: b.republished.Load(),
		CatchUps:    b.catchUpRuns.Load(),
		Deferred:    b.deferred.Load(),
	}
	if n, err := b.nc.Buffered(); err == nil {
		s.Buffered = n
	} else {
		s.Buffered = -1
	}
	return s
}

// Close drains the queue (bounded by closeDrainTimeout), flushes, closes the
// connection and shuts the embedded server down. Events emitted after Close
// are dropped and counted. Close is idempotent.
func (b *Bus) Close() error {
	b.closeOnce.Do(func() {
		b.closed.Store(true)
		// An Emit admitted before the Store is encoding or enqueueing: it
		// never blocks, so this wait is short. Its item is then drained
		// below like any other.
		for b.entered.Load() != 0 {
			runtime.Gosched()
		}
		close(b.done)
		b.wg.Wait()
		deadline := time.Now().Add(closeDrainTimeout)
		if b.js != nil {
			select {
			case <-b.js.PublishAsyncComplete():
			case <-time.After(time.Until(deadline)):
				b.dropped.Add(uint64(b.js.PublishAsyncPending()))
			}
		}
		if b.nc.IsConnected() {
			if err := b.nc.FlushTimeout(max(time.Until(deadline), 10*time.Millisecond)); err != nil {
				b.log.Warn("nats flush on close", logKeyError, err)
			}
		}
		b.nc.Close()
		b.shutdownServer()
		if b.acks != nil {
			b.flushAcks()
		}
		if d := b.dropped.Load(); d > 0 {
			b.log.Warn("nats bus closed with drops", logKeyDropped, d)
		}
	})
	return nil
}

func (b *Bus) shutdownServer() {
	if b.srv == nil {
		return
	}
	b.srv.Shutdown()
	b.srv.WaitForShutdown()
}

// redactURLs hides the secrets of a comma-separated URL list for logs: the
// password, or a bare user (NATS reads it as a token).
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if u, err := url.Parse(p); err == nil && u.User != nil {
			if _, ok := u.User.Password(); !ok {
				u.User = url.User("xxxxx")
			}
			p = u.Redacted()
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}
