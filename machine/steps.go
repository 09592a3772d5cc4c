package machine

// Steps name where a handoff failed (event.Step of a fallback). They are
// part of the event vocabulary, like the states: replay and the metrics
// classify fallbacks by them.
const (
	StepListen   = "listen"
	StepShare    = "share"
	StepReceive  = "receive"
	StepPeer     = "peer"
	StepTokens   = "tokens"
	StepProvider = "provider"
	StepAdopt    = "adopt"
	StepRestore  = "restore"
	StepTokenize = "tokenize"
	StepQueue    = "queue" // waiting for a slot (a log attribute: no machine yet)
)

// ReasonClientGone begins every reason given for a request whose client
// left before its answer was written, wherever it left: the handoff's steps
// complete it ("… while the provider was prefilling"), the front's too
// ("… before the decoder answered", "… mid-response").
const ReasonClientGone = "the client went away"
