// Package bus publishes handoff events on NATS (DESIGN §5).
//
// By default the daemon embeds a nats-server (its log through log/slog)
// listening on 127.0.0.1:4222 (DefaultListen; clients look at DefaultURL),
// so that `onebitd watch` works out of the box; the bus itself talks to it
// in-process. With --nats-url it connects to an external server or cluster
// instead, retrying forever with exponential backoff (jitter, capped at 5s);
// the daemon starts even when that server is down.
//
// # Identities
//
// The embedded server admits two nkey users and nobody else, not even an
// in-process connection:
//
//	daemon  <state-dir>/nats-daemon.nk  publish onebit.> and $JS.API.>, subscribe _INBOX.>
//	reader  <state-dir>/nats-reader.nk  subscribe onebit.> and _INBOX.>; publish only the
//	                                    read-only JetStream API calls an ordered consumer of
//	                                    ONEBIT needs (stream info, consumer create/info/delete,
//	                                    next message, message get); onebit.> is denied
//
// Each file holds one user seed (nkeys, decorated, mode 0600), is created on
// the first start in a state dir and kept, so a reader stays valid across
// restarts; deleting both and restarting rotates them. A file that others
// can read is refused (ErrCredsMode). Without a state dir the keys live in
// memory only. Clients load the reader with `--nats-creds FILE` (onebitd
// watch/replay) or `nats --nkey FILE`. Client describes an external
// server's identity (--nats-creds: a JWT .creds file or an nkey seed file,
// told apart by content; --nats-nkey: a seed file) and TLS (--nats-tls-ca).
//
// # Subjects
//
//	onebit.<node>.handoff.<to-state>   a request transition (Emit)
//	onebit.<node>.decoder.<what>       decoder lifecycle events ("decoder.ready")
//
// Node and state are sanitised into single subject tokens (Token).
// Dashboards subscribe to "onebit.>", or "onebit.*.handoff.fallback" for
// failures only.
//
// # Payload
//
// One JSON object per message, the event.Event: the same bytes as one line of
// the event log, without the newline.
//
// # Never blocking
//
// Emit and Publish encode the event and put it in a bounded queue
// (Config.QueueSize); a publisher goroutine takes it from there. A full queue
// drops the event; while an external server is down nats.go buffers up to
// Config.ReconnectBufSize bytes, beyond which events are dropped too. Every
// drop is counted (Stats.Dropped) and logged at most once per second with
// the running total. The event log, written before the bus, stays complete.
// An event emitted while Close runs is either published (Close waits for
// every Emit already past its closed check, then drains the queue) or
// counted as dropped: after Close, Published + Dropped = events emitted.
//
// # JetStream
//
// With --jetstream the bus binds the stream ONEBIT, or creates it on
// "onebit.>" with file storage (in the state dir for the embedded server)
// and the limits of Config.Stream* (which it also applies to a stream it
// binds), and publishes asynchronously with a bounded window of
// unacknowledged messages: acknowledgements are handled by nats.go's
// goroutine, never on the request path. Every event carries the header
// Nats-Msg-Id "<node>/<boot>/<seq>", so the server drops a duplicate resent
// within its duplicate window. StreamEvents reads the stream back for
// `onebitd replay --stream`.
//
// # Catch-up
//
// With JetStream, Config.EventLog and a state dir, the bus makes the stream
// end equal to the log however long an outage lasts. Every acknowledgement
// (or duplicate) is recorded per boot: all seqs up to "through", plus the
// acknowledged seqs above it. The record is AckedFile in the state dir,
// JSON {"v":1,"node":N,"boots":{"<boot>":{"through":S,"above":[…]}}},
// rewritten atomically (temporary file, fsync, rename) at most every 250 ms
// and on Close. A catch-up pass runs at start (the last boot's tail after a
// crash), after a reconnect, after drops and after unacknowledged publishes
// (1 s after the kick, so a burst coalesces): it reads the log with
// eventlog's Reader, from the first line the last pass found not held (the
// whole log at start), and republishes, in log order, every event of this node
// the record does not hold, except the live boot's events the publisher has
// not handed to nats.go yet. Its unacknowledged publishes are bounded to a
// quarter of the async window, so live events keep flowing. A seq the log
// itself lacks (lost before it was written) is marked held: nothing can bring
// it back. Log-local lines (seq 0: loss markers) are not republished; neither
// is anything once it is older than the server's duplicate window when the
// record was lost (it would be stored twice).
//
// # Order
//
// Once an event of this node missed the stream (dropped, refused, the
// stream not ready, and at every start until the first pass has read the
// log), the bus is behind: live events are kept back (Stats.Deferred) and
// the catch-up pass, reading on as the log grows, carries them until it has
// republished the last one kept back; then live publishing resumes. So a
// boot's events reach the stream in seq order, except when a server dies
// with acknowledgements pending (publishes after the lost ones were stored
// first); StreamEvents yields each boot in seq order anyway (inSeqOrder).
//
// # Embedded cluster
//
// With Config.ClusterName (--nats-cluster) the embedded server listens for
// routes on ClusterListen (--nats-cluster-listen, default
// DefaultClusterListen, loopback) and routes to ClusterRoutes
// (--nats-routes); every route presents user RouteUser and the secret of
// ClusterSecretFile (--nats-cluster-secret, 0600, the same on every node),
// and the route port admits nothing else. The servers run JetStream as one
// cluster (server name = node); the stream is set up in the background,
// once a JetStream leader exists. Each server still admits only its own
// node's two identities.
package bus
