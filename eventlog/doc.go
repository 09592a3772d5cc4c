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
// # Marker lines
//
// Two lines are not transitions; both have empty request_id, route, from
// and to, slot 0 and elapsed_us 0:
//
//   - The shutdown line, event "eventlog.shutdown", the last event of a boot
//     that stopped cleanly (event.Recorder.Shutdown). It is an event like
//     the others (it takes the next seq and is published on NATS) and adds
//     "in_flight": the requests the daemon still had in flight when it
//     stopped (0 after a full drain):
//
//     {"v":1,"boot":"3f0c9b6d2a1e8f47","seq":6002,"time":"…","node":"n1","request_id":"","slot":0,
//     "route":"","event":"eventlog.shutdown","from":"","to":"","elapsed_us":0,"in_flight":0}
//
//   - The loss marker, event "eventlog.lost", written by the Writer itself
//     (seq 0: it is not a transition; boot and node are those of the lost
//     events) before the first line it manages to write after losing events,
//     or by Close from the reserve (below). "reason" is the error; "lost"
//     says how many events of that boot never reached the file and their
//     seq range (events may be fewer than last_seq-first_seq+1 when some in
//     between were written):
//
//     {"v":1,"boot":"3f0c9b6d2a1e8f47","seq":0,"time":"…","node":"n1","request_id":"","slot":0,
//     "route":"","event":"eventlog.lost","from":"","to":"","elapsed_us":0,
//     "reason":"eventlog: reserve … no space left on device",
//     "lost":{"events":4979,"first_seq":1023,"last_seq":6001}}
//
// schemas/event.json describes both.
//
// # Ordering
//
// Lines are in seq order within a boot: event.Recorder stamps seq and hands
// the line to the writer under one lock, and the writer appends in that
// order (a loss marker is inserted before the lines that follow the loss).
// A process start draws a new boot id and restarts seq at 1, so one file may
// hold several boots one after another; seq + 1 == next seq within a boot,
// and a gap means events were lost: named by a loss marker when the writer
// knew (a failed write, a full disk), silent otherwise (a crash before a
// batch was written, a file edited by hand).
//
// # Writer and sync policies
//
// Open creates the file (mode 0600, directory 0700), takes an exclusive
// flock (a second writer gets ErrLocked) and appends. The Recorder encodes
// each event once (event.Event.AppendJSON) and hands the same line to every
// sink; the Writer copies it under a mutex into the last of a list of
// 256 KiB pending chunks (reused: no allocation and no copying in steady
// state). No lock that an emitter takes is held across a write or an fsync:
// one flusher at a time writes everything pending while others append.
// Depending on the SyncPolicy (--event-log-sync):
//
//   - always: an emitter returns once its line is written and fsynced
//     (event.Committer). Emitters that arrive while a flush runs append and
//     wait; the first of them then writes and fsyncs all their lines at
//     once (group commit), so concurrent requests share one fsync instead of
//     queueing for one each. An event whose transition the daemon acted on
//     survives a crash and a power loss. The NATS bus, a sink after the log,
//     gets an event only once it is durable (persist before publish), in
//     seq order.
//   - batch (default): group commit in the background. A flusher writes
//     everything pending in one write and fsyncs, at most every
//     FlushInterval (10 ms), sooner when BatchBytes (256 KiB) are pending.
//     Emit never waits for the disk. A process crash (kill -9) loses at most
//     the events of the last ~10 ms still in memory; a power loss at most
//     those plus the batch being fsynced.
//   - off: like batch, but never fsyncs except on Sync and Close. A process
//     crash loses at most ~10 ms of events; a power loss or kernel crash loses
//     whatever the kernel had not written back.
//
// Sync writes and fsyncs what is pending under any policy; Close does the
// same, writes the shutdown line last, then closes the file.
//
// # Lost events
//
// Failures never reach the request and never block it (beyond the fsync
// that always promises): a write that fails (EIO, ENOSPC) loses its events,
// and an event that arrives while MaxPendingBytes (64 MiB) are pending on a
// stalled disk, or after Close, is lost too. Every lost event is counted
// (Stats.Lost, Writer.Lost), logged at Error at most once per
// LossLogInterval (1 s) with the running count (lost_total), passed to the
// OnLoss callback (SetOnLoss; the daemon publishes it on
// onebit.<node>.eventlog.lost), and named in the file by a loss marker
// once a write succeeds again. A partial write is truncated back to the
// last whole line, so the file stays a sequence of lines.
//
// A full disk must not silence the log, so the Writer keeps ReserveBytes
// (16 KiB) allocated past the end of the file (fallocate with
// FALLOC_FL_KEEP_SIZE, a MiB at a time, invisible in the file's size). When
// the events of a write do not fit outside the reserve, they are lost and
// nothing is written; Close then writes the loss marker and the shutdown
// line into the reserve. A file system without fallocate gets no reserve:
// the marker then waits for free space, and a disk that stays full until
// the end leaves an unnamed gap (which the audit reports as seq-gap, and
// the missing shutdown line as a crash).
//
// # Torn tail
//
// A crash can leave the last line incomplete (no final '\n', or bytes that
// are not an event, e.g. zeros after a power loss). Open checks the last
// line: if it is torn, Open copies its bytes to <path>.torn-<unix seconds>
// (or -1, -2… if that exists), fsyncs the copy, truncates the log to the end
// of the last good line, logs a warning and returns the TornTail; appends go
// on from there. If the copy cannot be made (a full disk), the torn bytes are
// truncated in place and gone: Open logs that at Error, TornTail.SaveError
// says why, and the daemon starts. Only the last line is considered: a bad
// line in the middle is corruption, not a crash artefact, and is left for
// the reader to report.
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
//   - seq-gap: within a node's boot, each seq is the previous plus one,
//     unless a loss marker of that boot named the missing seqs. An unnamed
//     gap is a violation, not a warning: the log lost events without saying
//     so, so the audit of that boot is incomplete. The first seq of a boot
//     in the input may be anything (a log may start mid-boot).
//   - events-lost: a loss marker, reported as "N events lost between seq A
//     and B (node, boot)" with its reason (Report.Lost lists them); after a
//     loss in its boot, a request whose next event does not start where the
//     last one left it (its events in between were lost, reported here
//     instead of as illegal-transition); and a boot whose shutdown line says
//     fewer requests were in flight than the log leaves unfinished (their
//     last events were lost).
//   - skip-and-handoff (issue 13): a request never both skips the handoff
//     and hands over. The decision travels on the event that leaves
//     received and only there; "skip" leaves by the plain route's forward
//     and no handoff step (listen, share, prefill, adopt, restore) follows;
//     "handoff" does not leave by forward. Reported once per request.
//
// # End of a boot
//
// A request that has not reached done or failed at the end of its boot is
// not a violation by itself. What it is depends on how the boot ended:
//
//   - in flight (Report.InFlight): the boot has no shutdown line and is the
//     last boot of its node in the input (the daemon may still be running),
//     or the shutdown line counted it in flight;
//   - interrupted (Report.Interrupted): the boot has no shutdown line and a
//     later boot of the same node follows: it crashed (or was killed, or
//     its disk stayed full without a reserve), and the request was cut short;
//   - incomplete (Report.Incomplete): the boot stopped cleanly but its
//     shutdown line counted fewer requests in flight than are unfinished:
//     their last events were lost (an events-lost violation).
package eventlog
