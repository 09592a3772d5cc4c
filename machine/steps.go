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
)
