// Package soak is onebitd's soak test (make soak, cmd/onebit-soak; issue 10):
// real processes, a fault drawn per request, and checks that nothing leaks.
//
// # Stacks
//
// Four onebitd processes, each launching its own decoder simulator with
// --decoder-bin (so that onebitd restarts a killed decoder), on loopback:
// "plain" (no provider: the reference answers), "file" (the sim provider
// exec'd per request, file route), "shared" (exec'd, shared route) and
// "shared-warm" (--provider-mode serve, shared route). The three handoff
// stacks run with --handoff always (when onebitd has the flag), short step
// deadlines (provider 2 s, accept 1 s, share 3 s, adopt 5 s), and the
// simulators' --fault-from-prompt switch.
//
// # Faults
//
// One worker per handoff stack sends one request at a time (3 in flight on
// the machine at most, plus the plain stack's), each through a random entry
// point (/completion, /v1/completions, /v1/chat/completions), streamed or
// not, with a fault drawn from a shuffled deck of the faults that apply to
// the stack (Faults) plus fault-free requests. A fault reaches the
// simulators as a marker in the prompt text ("FAULT:prov-hang", package
// simfault): the sim provider reads it from the job's tokens, the decoder
// simulator from the completion's prompt, the adopt's tokens, or — for a
// share or restore, whose body names no prompt — from the request's
// /tokenize, which onebitd sends first. onebitd is told nothing: the marker
// is prompt text. Two faults are the harness's own: the client hangs up
// after the first stream event, or the harness SIGKILLs the decoder after
// it (the prompt also asks the decoder for 100 ms per token, so the stream
// is still running).
//
// # Checks
//
// Per request: the answer is identical to the plain stack's answer to the
// same prompt and entry point (streamed text joined), or, where the decoder
// itself failed (500 on the completion, killed mid-stream), a clean
// llama-server-shaped error — a status with {"error":{code,message,type}}
// or a stream that ends with such an event and no [DONE] — within 60 s,
// never a hang; a fault meant to fail the handoff fell back at that fault's
// step (X-Onebit-Route fallback, and the event log's fallback step), and a
// request meant to hand over did not fall back; the request is terminal
// (done or failed) in the event log; then, within 10 s, the slot dir holds
// nothing but kvshare-*.sock, onebitd holds no memfd and no more non-socket
// fds than at the baseline, and onebitd's children are the decoder (and the
// warm provider). At the end: onebitd's fds, sockets included, back to the
// baseline taken after the warm-up; no process of the run whose parent is
// not a stack's onebitd; no request open in the log; each onebitd exits 0
// on SIGTERM and nothing of its stack keeps running; `onebitd replay`
// passes on each log.
package soak
