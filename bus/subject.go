package bus

import "strings"

// SubjectPrefix is the first token of every subject onebitd publishes;
// dashboards subscribe to "onebit.>".
const SubjectPrefix = "onebit"

// Subject returns the subject of a handoff event that takes a request to
// state to on node: "onebit.<node>.handoff.<to>". Both tokens are sanitised
// (see Token) so that a node name such as "gpu-box.local" cannot add a
// subject level or a wildcard.
func Subject(node, to string) string {
	return SubjectPrefix + "." + Token(node) + ".handoff." + Token(to)
}

// Token turns s into one valid NATS subject token: every byte outside
// [A-Za-z0-9_-] becomes '_', and the empty string becomes "_". The mapping
// is not injective ("a.b" and "a_b" collide); node names are chosen by the
// operator, and the payload carries the exact name.
func Token(s string) string {
	if s == "" {
		return "_"
	}
	clean := true
	for i := 0; i < len(s); i++ {
		if !tokenByte(s[i]) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !tokenByte(c) {
			c = '_'
		}
		b.WriteByte(c)
	}
	return b.String()
}

func tokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// lifecycleKinds are the event name prefixes with a subject of their own
// (DESIGN §5): the decoder's, the warm provider's and the prefill server's
// lifecycle, and the event log's own lines.
var lifecycleKinds = []string{"decoder", "provider", "prefill", "eventlog"}

// eventSubject is the subject of an event that does not enter a request
// state (To is empty): "decoder.<what>" goes to "onebit.<node>.decoder.<what>",
// likewise "provider.<what>" and "eventlog.<what>", anything else to
// "onebit.<node>.event.<name>".
func eventSubject(node, name string) string {
	for _, k := range lifecycleKinds {
		if rest, ok := strings.CutPrefix(name, k+"."); ok {
			return SubjectPrefix + "." + Token(node) + "." + k + "." + Token(rest)
		}
	}
	return SubjectPrefix + "." + Token(node) + ".event." + Token(name)
}
