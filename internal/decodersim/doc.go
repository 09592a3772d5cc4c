// Package decodersim is a simulated llama-server: the decoder that onebitd
// drives, with the fork's share/adopt slot actions. It answers like upstream
// llama-server on every endpoint it implements (status codes, the error
// shape {"error":{"code":N,"message":"…","type":"…"}}, field names) and runs
// the deterministic model of package simkv over real shared memory, so a
// handoff of wrong or stale KV changes the generated text.
//
// # Endpoints
//
// GET /health, /props, /slots, /v1/models (and /models); POST /tokenize,
// /detokenize, /apply-template (ChatML), /completion, /v1/completions,
// /v1/chat/completions (stream or not), /slots/{id}?action=save|restore|
// erase|share|adopt. Unknown routes answer 404 "File Not Found"; while
// loading (--loading-delay) everything but the model list answers 503
// "Loading model".
//
// # KV memory
//
// The KV cache is one buffer per (layer, kind ∈ {k, v}) of n_ctx cells of
// stride = cell_size / (2 n_layer) bytes, packed greedily (page aligned)
// into memfd chunks of at most --chunk-size bytes, sized with ftruncate and
// mapped MAP_SHARED once at start (so -c 20480 gives 56 buffers of 40 MiB in
// 3 chunks, 2240 MiB, none of it populated). Slot K owns cells [K m, (K+1) m)
// of every buffer, m = n_ctx/N (see below).
//
// Evaluating token t at position i computes simkv.Cell(model, digest read
// from cell i-1's K record in memory, t, i) and writes cell i of every buffer
// (simkv.Fill: the record, salted per layer, repeated over the stride); the
// next token is simkv.Next over simkv.Fold of every live cell's layer 0
// records read from memory. With --compact only layer 0's records are
// written and the rest of the KV stays sparse.
//
// # Save and restore
//
// save writes a full state (simkv.WriteFullState: header, tokens, then every
// buffer's n cells, n_cells x cell size bytes, CRC-32C) through a temp file
// renamed into place, as llama-server writes every layer's K and V; with
// --compact, layer 0's records (simkv.WriteState). restore reads either
// version: a full state must match the decoder's --n-layer and stride and is
// read whole, checked, then copied into the cells (llama.cpp's
// llama_state_seq_load_file reads the file, then sets the data); any failure
// leaves the slot empty. With 2 KiB cells restore_ms is 0.35 / 2.5-3.1 /
// 11-13 ms at 250 / 3 200 / 12 700 tokens here (BenchmarkSaveRestore),
// llama-server's 0.8 / 3.3 / 12 ms.
//
// --prompt-ms-per-token T makes prompt evaluation take at least T ms per
// evaluated token (timings.prompt_ms reports the whole time).
//
// # Prompt cache
//
// Each slot keeps the token list its cells hold. A completion reuses the
// longest common prefix with its prompt, but always evaluates the last prompt
// token again (a fully handed-over prompt of n tokens reports prompt_n 1,
// cache_n n-1); generated tokens are evaluated too except the last
// (tokens_cached = prompt + generated - 1). Generation is greedy; sampling
// parameters are accepted and ignored.
//
// # Share and adopt
//
// share sends one fdpass message to the given socket: a header whose regions
// describe the slot's cells in every buffer and the chunk fds holding them
// (fd_index = chunk index). The slot's cache is cleared (its memory may now
// be written by others) and the slot remembers the new share_id, a
// per-server counter from 1. adopt accepts that share_id once; a share that
// is not the slot's last, already adopted, or voided by a later write into the
// slot (a completion or restore) is refused with 400 — one message for every
// reason, "share_id N is not the pending share of slot K", so that a refusal
// helps nobody guess a valid id (the reason goes to the simulator's log) —,
// and so is an adopt whose optional "layout_hash" differs from the decoder's. --lax-share-id turns
// the checks off (a test switch proving that the conformance probe catches a
// lax decoder). --recurrent makes share and adopt answer 501 "no shareable
// region".
//
// # Per-request faults
//
// --fault-from-prompt (a TEST SWITCH, for the soak test) injects the fault
// that a prompt names with a "FAULT:<name>" marker (package simfault): a
// completion's prompt gen-500 (500 before generating) or gen-slow (100 ms
// per token); an adopt's tokens adopt-refused (the share_id refusal); and
// the share or restore after the /tokenize of a prompt naming dec-500,
// dec-501, share-slow (wait --fault-delay, default 2s, then connect),
// share-no-connect, share-extra-fds (fdpass.MaxFDs fds) or share-garbage (a
// header that is not JSON). Every /tokenize re-arms (or disarms) that
// fault; a share or restore takes it once. Exact per-request attribution of
// those needs one request at a time per simulator.
//
// # Access control and request bodies
//
// As llama-server: --api-key KEY[,KEY…] and --api-key-file FILE (one key a
// line, empty lines skipped) make every path except /, /health, /v1/health,
// /models, /v1/models and /api/tags answer 401 {"error":{"code":401,
// "message":"Invalid API Key","type":"authentication_error"}} unless the
// request's Authorization header (a "Bearer " prefix removed) or, when that
// is empty, its X-Api-Key header holds a key. The check comes after the 503
// of loading and before the 404 of unknown routes. --host PATH.sock listens
// on a unix socket created with the process umask (the directory is what
// protects it); the ready line then names unix://PATH.
//
// JSON bodies are read with nlohmann::json's key rules (internal/jsonexact):
// keys match exactly, without case or Unicode folding, and the last of
// duplicate keys wins. A value of the wrong type answers 500
// "[json.exception.type_error.302] …".
//
// # Deliberate differences from upstream
//
// An id_slot or slot action id outside [0, total_slots) is a 400 (upstream
// defers the task forever or wraps the id). A list of several prompts is a
// 400 (upstream runs one task per prompt). A slot holds n_ctx/n_parallel
// cells rounded down to whole pages of a buffer (an even count by default),
// so that every shared region is page aligned.
package decodersim
