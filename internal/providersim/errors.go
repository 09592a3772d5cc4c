package providersim

import "errors"

// Sentinel errors. Every error returned by this package wraps one of them;
// the wrapped text adds the facts (file, index, sizes). Reason turns any of
// them into the one stderr line the provider prints on failure.
var (
	// ErrUsage: a missing, unknown or malformed command-line flag.
	ErrUsage = errors.New("providersim: bad command line")
	// ErrTokens: the tokens file is unreadable, not a JSON array of ints,
	// empty, too long, or holds an id outside the vocabulary.
	ErrTokens = errors.New("providersim: invalid tokens file")
	// ErrHeader: the layout header is unreadable, not JSON, or not a valid
	// share header for the passed fds.
	ErrHeader = errors.New("providersim: invalid layout header")
	// ErrLayoutMismatch: the header's layout hash is not the one this
	// provider computes from its own model and the header's geometry.
	ErrLayoutMismatch = errors.New("providersim: layout hash mismatch")
	// ErrRegion: layer 0's K or V region is missing, duplicated, too small
	// for the prompt, or lies beyond the end of its fd.
	ErrRegion = errors.New("providersim: the shared regions cannot hold the prompt")
	// ErrModel: the model file cannot be read.
	ErrModel = errors.New("providersim: cannot read the model")
	// ErrWrite: writing the state file or the shared regions failed.
	ErrWrite = errors.New("providersim: cannot write the KV")
	// ErrStart: --start P is outside 0..N, or cell P-1 of the region holds
	// no KV for position P-1 (the prefix the provider continues from).
	ErrStart = errors.New("providersim: cannot continue from the cells in the region")
	// ErrServe: --serve cannot listen on or accept from its socket.
	ErrServe = errors.New("providersim: cannot serve jobs")
	// ErrSimulated: a failure requested by a fault switch.
	ErrSimulated = errors.New("providersim: simulated failure")
)
