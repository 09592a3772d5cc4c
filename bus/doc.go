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
package bus
