// Package planner decides, per request, whether a handoff pays (issue 13):
// a cost model learned online (Model) and the per-slot memory of the
// tokens the decoder holds (Memory).
//
// # Cost model
//
// Model keeps exponentially decayed sums (decay Decay per sample, so memory
// is O(1) and old samples fade) of:
//
//   - the decoder's prefill time per token: Σ prompt_ms / Σ prompt_n of the
//     replies onebitd forwards (plain, skipped, fallback and handed-over
//     requests alike);
//   - the provider's time as fixed + per token: a decayed least-squares
//     line through (tokens prefilled, provider run ms);
//   - the handoff's own cost per route (share, adopt or restore, the fds
//     and files): the handoff's wall time minus the provider's run.
//
// Decide compares the decoder's predicted prefill of the tokens it does not
// hold with the predicted provider + handoff time of the same tokens. In
// mode auto the handoff is taken when handoff·(1+Margin) < decoder. Before
// the model has MinSamples of both sides, the static floor decides (hand
// over when at least MinTokens tokens are to prefill). Near the break-even
// (the two predictions within a factor ExploreBand) one decision in
// ExploreEvery takes the other side, so both estimates stay fresh; the
// decision then says basis "explore".
//
// # Prefix memory
//
// Memory holds, per slot, the prompt tokens whose KV the decoder holds in
// cells 0..len-1. A slot's tokens are trusted only once confirmed: the
// decoder's reply to the request that last used the slot reported a prompt
// of exactly those tokens (timings.prompt_n + timings.cache_n == N, and
// cache_n == N-1 after a handoff) and nothing else touched the slot since.
// Taking a slot (Take) makes its memory unconfirmed until Confirm; Forget,
// ForgetAll (a decoder restart, an erase, any proxied request that may
// evaluate tokens) and any error drop it. A Confirm that races a ForgetAll
// is ignored (epochs). The decoder's identity (Observe: a launched
// decoder's pid) lives with the memory, so a restart forgets every slot
// before any Take can use it, and Valid tells whether a ticket's prefix
// survived until after the handoff. A forgotten prefix means a full handoff: the one
// failure that must never happen is stale KV.
package planner
