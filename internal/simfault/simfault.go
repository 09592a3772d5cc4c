// Package simfault is the per-request fault marker of the test doubles
// (onebit-decoder-sim and onebit-provider-sim with --fault-from-prompt).
//
// A prompt that contains the text "FAULT:<name>" (for example
// "… FAULT:prov-hang …") asks the simulators for fault <name> on that
// request, and only on it: the sim provider reads the marker from the job's
// tokens, the decoder simulator from the prompt of a completion, the tokens
// of an adopt, or — for the steps whose body names no prompt (share,
// restore) — from the last /tokenize, which onebitd sends for every request
// before its handoff. The marker is plain prompt text (byte tokens in the
// simulator's tokenizer), so onebitd passes it along like any other prompt:
// the product is not told anything. Without --fault-from-prompt the
// simulators ignore markers.
//
// The soak test (cmd/onebit-soak) draws one fault per request this way.
package simfault

import (
	"strings"

	"github.com/onebitd/onebitd/internal/simkv"
)

// Fault is the name of one injectable fault ("" is none).
type Fault string

// The faults. Prov* are the sim provider's, the rest the decoder
// simulator's.
const (
	None Fault = ""

	ProvFail          Fault = "prov-fail"            // the provider fails before doing anything (exit 1 / ok false)
	ProvHang          Fault = "prov-hang"            // the provider blocks until killed
	ProvSlow          Fault = "prov-slow"            // the provider sleeps its --fault-delay first, then succeeds
	ProvWriteThenFail Fault = "prov-write-then-fail" // the provider writes everything, then fails
	ProvKeepWriting   Fault = "prov-keep-writing"    // the provider writes, then keeps writing until killed

	Dec500         Fault = "dec-500"          // the next share or restore answers 500 server_error
	Dec501         Fault = "dec-501"          // the next share or restore answers 501 not_supported_error
	AdoptRefused   Fault = "adopt-refused"    // the adopt of these tokens is refused (400, the share_id message)
	ShareSlow      Fault = "share-slow"       // the next share waits the decoder's --fault-delay before it connects
	ShareNoConnect Fault = "share-no-connect" // the next share answers a share_id but never connects
	ShareExtraFDs  Fault = "share-extra-fds"  // the next share sends fdpass.MaxFDs fds (more than onebitd accepts)
	ShareGarbage   Fault = "share-garbage"    // the next share sends a header that is not JSON
	GenSlow        Fault = "gen-slow"         // the completion generates one token per GenSlowTokenDelay
	Gen500         Fault = "gen-500"          // the completion answers 500 server_error before generating
)

// All is every fault, in the order of the constants.
var All = []Fault{ProvFail, ProvHang, ProvSlow, ProvWriteThenFail, ProvKeepWriting,
	Dec500, Dec501, AdoptRefused, ShareSlow, ShareNoConnect, ShareExtraFDs, ShareGarbage, GenSlow, Gen500}

// Prefix starts a marker.
const Prefix = "FAULT:"

// Marker is the prompt text that asks for f.
func Marker(f Fault) string { return Prefix + string(f) }

// Provider reports whether f is one of the sim provider's faults.
func (f Fault) Provider() bool { return strings.HasPrefix(string(f), "prov-") }

// SlotAction reports whether f is armed by /tokenize and fires at the next
// share or restore of the decoder simulator.
func (f Fault) SlotAction() bool {
	switch f {
	case Dec500, Dec501, ShareSlow, ShareNoConnect, ShareExtraFDs, ShareGarbage:
		return true
	}
	return false
}

// Find returns the first known fault named by a marker in text, or None.
// A marker is Prefix followed by the name and a byte that cannot continue a
// name (or the end of text); an unknown name is skipped.
func Find(text string) Fault {
	for i := 0; ; {
		j := strings.Index(text[i:], Prefix)
		if j < 0 {
			return None
		}
		start := i + j + len(Prefix)
		end := start
		for end < len(text) && nameByte(text[end]) {
			end++
		}
		for _, f := range All {
			if text[start:end] == string(f) {
				return f
			}
		}
		i = start
	}
}

// FromTokens is Find over the simulator tokenizer's text of tokens.
func FromTokens(tokens []int) Fault { return Find(simkv.Detokenize(tokens)) }

func nameByte(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' }
