// Package provjob is the wire format between onebitd and a warm provider
// (DESIGN §2c, `--provider-mode serve`): one job on one connection of a unix
// stream socket, one reply back. Both sides import it: onebitd sends jobs
// (Call: connect, SendJob, ReadReply, close); a provider started as
// `PROVIDER --serve --socket PATH` reads jobs (ReadJob) and answers
// (WriteReply). The job's region fds travel with it (SCM_RIGHTS).
//
// # Framing
//
// Each message is
//
//	+----------------------+----------------------------+
//	| length: uint32 LE    | body: length bytes of JSON |
//	+----------------------+----------------------------+
//
// A job's fds (shared route) go in one SCM_RIGHTS control message with the
// first byte of the frame (one sendmsg; bytes the socket did not take follow
// without fds). A reply carries no fds. The receiver reads exactly 4+length
// bytes; fds that arrive with a later segment are closed and the message
// fails (ErrStrayFDs); more fds than it accepts fail with ErrCtrunc (the
// kernel closes the ones it dropped; the receiver closes the rest). Limits:
// a job body is 1..MaxJobLen bytes, a reply 1..MaxReplyLen, at most MaxFDs
// fds. Received fds are close-on-exec (MSG_CMSG_CLOEXEC).
//
// # Job
//
//	{"version": 1, "route": "shared", "tokens": [1, 2, 3], "model": "/m.gguf",
//	 "start": 0, "layout": {…the share header of DESIGN §3, verbatim…}}
//	{"version": 1, "route": "file", "tokens": [1, 2, 3], "model": "/m.gguf",
//	 "state": "/slots/x.bin"}
//
// Fields:
//
//   - version: Version (1); any other value is ErrVersion.
//   - route: "shared" (fds and layout, no state) or "file" (state, no fds,
//     no layout, start 0).
//   - tokens: the prompt, 1..MaxTokens ids, each in [0, 2^31).
//   - model: the model path, non-empty.
//   - start: shared route only, 0..len(tokens): cells 0..start-1 of the
//     slot already hold the prompt's first tokens (DESIGN §2b); the provider
//     prefills start..len(tokens)-1. Absent means 0.
//   - layout: shared route, the share header JSON object exactly as the
//     decoder sent it (fd_index i is the job's i-th fd). provjob checks only
//     that it is an object of at most MaxLayoutLen bytes; the provider
//     validates it against the fds it received.
//   - state: file route, the absolute path of the state file to write.
//
// Keys match exactly (no case folding); unknown keys are refused
// (ErrBadJob: a new field needs a new version); a repeated key keeps its
// last value.
//
// # Reply
//
//	{"ok": true, "n_tokens": 12722, "prefill_ms": 31.5}
//	{"ok": false, "reason": "layout hash mismatch: decoder …, provider model …"}
//
// n_tokens is the number of cells the provider prefilled (len(tokens) −
// start), prefill_ms the provider's own wall time for the job, from the
// job's arrival to the reply. reason is one sentence for the fallback log,
// at most MaxReasonLen bytes. A reply with ok false and no reason, or ok
// true with a reason, is ErrBadReply.
//
// # Who closes what
//
// The provider closes and unmaps every fd of a job before it writes the
// reply, on every path: after a reply nothing of the provider writes into
// the decoder's KV for that job. onebitd closes the connection after the
// reply; a closed connection or a deadline without reply means the job
// failed (onebitd then kills the provider's process group, DESIGN §2c).
package provjob
