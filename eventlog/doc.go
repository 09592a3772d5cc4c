// Package eventlog is onebitd's event log: the durable, append-only record of
// every request transition (DESIGN §5), its writer, its reader, and the audit
// that `onebitd replay` runs over it.
//
// # Format
//
// The log is JSON Lines (UTF-8): one event per line, each line one JSON
// object followed by '\n', nothing else (no blank lines, no header, no
// comments). The object is exactly what event.Event.AppendJSON writes, the
// same bytes that are published on NATS:
//
//	{"v":1,"boot":"3f0c9b6d2a1e8f47","seq":12,"time":"2026-11-29T10:15:29.123456Z","node":"n1",
//	 "request_id":"r-5","slot":0,"route":"shared","event":"adopt","from":"prefilled","to":"adopted",
//	 "elapsed_us":1834,"share_id":7,"n_tokens":512,"cleanup":{"fds_closed":3,"files_removed":3}}
//
// (one line in the file). Fields, in this order: v, boot, seq, time, node,
// request_id, slot, route, event, from, to, elapsed_us (always present), then
// share_id, n_tokens, n_fds, bytes_mapped, reason, step, http_status,
// provider_exit, cleanup{fds_closed, files_removed} (omitted when zero or
// absent). Strings are escaped as Go's encoding/json escapes them; time is
// RFC 3339 in UTC with nanoseconds, trailing zeros trimmed. schemas/event.json
// is the schema of a line; "v" is 1, and a reader refuses any other version.
// Readers skip fields they do not know.
//
// Decoder lifecycle events (event "decoder.starting", "decoder.ready",
// "decoder.exited") are lines too, with empty request_id, route, from and to.
//
// # Ordering
//
// Lines are in seq order within a boot: event.Recorder stamps seq and calls
// the writer under one lock, and the writer appends in call order. A process
// start draws a new boot id and restarts seq at 1, so one file may hold
// several boots one after another; seq + 1 == next seq within a boot, and a
// gap means events were lost (a failed write: see below).
//
// # Writer and sync policies
//
// Open creates the file (mode 0600, directory 0700), takes an exclusive
// flock (a second writer gets ErrLocked) and appends. Emit encodes the event
// under a mutex into the last of a list of 256 KiB pending chunks (reused:
// no allocation and no copying in steady state) and, depending on the
// SyncPolicy (--event-log-sync):
//
//   - always: Emit writes and fsyncs before it returns. An event whose
//     transition the daemon acted on survives a crash and a power loss. The
//     request path pays one write and one fsync per transition.
//   - batch (default): group commit. A background flusher writes everything
//     pending in one write and fsyncs, at most every FlushInterval (10 ms),
//     sooner when BatchBytes (256 KiB) are pending. Emit never waits for the
//     disk. A process crash (kill -9) loses at most the events of the last
//     ~10 ms still in memory; a power loss at most those plus the batch being
//     fsynced.
//   - off: like batch, but never fsyncs except on Sync and Close. A process
//     crash loses at most ~10 ms of events; a power loss or kernel crash loses
//     whatever the kernel had not written back.
//
// Sync writes and fsyncs what is pending under any policy; Close does the
// same, then closes the file.
//
// Failures never reach the request: a failed write or fsync is counted
// (Stats.WriteErrors, Stats.Dropped) and logged once per failure episode at
// Error level (data lost), and "recovered" at Info once writes succeed again.
// A short write is truncated back to the last whole line so the file stays a
// sequence of lines; its events are lost and the next events' seq shows the
// gap. If the disk stalls, pending events are capped at MaxPendingBytes
// (64 MiB) and further events are dropped (counted) rather than blocking
// requests or growing memory. Under SyncAlways, Emit blocks for as long as
// the disk does: that is the policy's promise.
//
// # Torn tail
//
// A crash can leave the last line incomplete (no final '\n', or bytes that
// are not an event, e.g. zeros after a power loss). Open checks the last
// line: if it is torn, Open copies its bytes to <path>.torn-<unix seconds>
// (or -1, -2… if that exists), fsyncs the copy, truncates the log to the end
// of the last good line, logs a warning and returns the TornTail; appends go
// on from there. Only the last line is considered: a bad line in the middle
// is corruption, not a crash artefact, and is left for the reader to report.
//
// A Reader (and ReadFile, and Files) reports a torn last line as a TornTail
// warning, not an error: the events before it are all delivered. A bad line
// anywhere else is an ErrBadLine error naming the line; a line longer than
// MaxLineBytes (1 MiB) is ErrLineTooLong.
//
// # Audit
//
// An Auditor rebuilds every request's machine from its events (requests are
// keyed by node, boot and request_id) and checks these rules, each a named
// Violation:
//
//   - illegal-transition: (from, event, to) is a row of machine.Transitions,
//     from is the request's current state (received for its first event), and
//     no event follows done or failed; an event without request_id must be a
//     decoder lifecycle event.
//   - share-id-reused: an adopt's share_id was already adopted on the same
//     node in the same boot and the same decoder lifetime (decoder.starting
//     and decoder.exited start a new lifetime: a restarted decoder may count
//     share ids from scratch).
//   - share-id-mismatch: an adopt without share_id, or with another share_id
//     than its request's share event got.
//   - missing-cleanup: the event entering adopted, restored or fallback
//     carries cleanup; cleanup.fds_closed is at least the n_fds the request's
//     share event received (every region fd closed); entering adopted or
//     restored, cleanup.files_removed >= 1 (those routes always write the
//     tokens file). A fallback may remove no file: it can happen before any
//     was written.
//   - fallback-reasons: the fallback event has a non-empty reason (one event,
//     one reason: a second fallback is an illegal transition), and no event of
//     the request other than fallback and fail carries a reason.
//   - seq-gap: within a node's boot, each seq is the previous plus one. A gap
//     is a violation, not a warning: it means the log lost events (a failed
//     write), so the audit of that boot is incomplete. The first seq of a boot
//     in the input may be anything (a log may start mid-boot).
//
// A request that has not reached done or failed at the end of the input is
// reported in flight, not as a violation: it was cut short by the end of the
// log or by a crash (its boot then ends early; the next boot starts new
// requests).
package eventlog
