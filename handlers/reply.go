package handlers

import (
	"bytes"
	"encoding/json"
	"slices"
)

// maxTapped bounds what replyTap keeps of a reply: a non-streamed answer
// up to this size, a streamed one's current event.
const maxTapped = 1 << 20

// replyTap watches the decoder's answer as it is copied to the client and
// keeps what the planner needs: the whole body of a non-streamed answer,
// or the last event of a stream that carries "timings". Past maxTapped it
// gives up (the reply is then "not reported", which forgets the slot).
type replyTap struct {
	stream   bool
	buf      []byte // non-stream: the body; stream: the current line
	last     []byte // stream: the last data line with timings
	overflow bool
}

func (t *replyTap) Write(p []byte) (int, error) {
	if t.overflow {
		return len(p), nil
	}
	if !t.stream {
		if len(t.buf)+len(p) > maxTapped {
			t.overflow, t.buf = true, nil
			return len(p), nil
		}
		t.buf = append(t.buf, p...)
		return len(p), nil
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(t.buf)+len(p) > maxTapped {
				t.overflow, t.buf = true, nil
				return len(p), nil
			}
			t.buf = append(t.buf, p...)
			break
		}
		t.buf = append(t.buf, p[:i]...)
		t.line()
		p = p[i+1:]
	}
	return len(p), nil
}

func (t *replyTap) line() {
	l := bytes.TrimSpace(t.buf)
	if d, ok := bytes.CutPrefix(l, []byte("data:")); ok && bytes.Contains(d, []byte(`"timings"`)) {
		t.last = append(t.last[:0], bytes.TrimSpace(d)...)
	}
	t.buf = t.buf[:0]
}

// replyStats is what a decoder's answer says about the slot's prompt.
type replyStats struct {
	ok           bool // the answer reported timings
	promptN      int
	cacheN       int
	predictedN   int
	promptMs     float64
	tokensCached int   // -1: not reported (the OpenAI shapes)
	generated    []int // the native answer's "tokens", when reported
}

// stats parses what the tap kept.
func (t *replyTap) stats() replyStats {
	if t.overflow {
		return replyStats{}
	}
	raw := t.buf
	if t.stream {
		if len(t.buf) > 0 { // a last line without its newline
			t.line()
		}
		raw = t.last
	}
	var v struct {
		Tokens       []int `json:"tokens"`
		TokensCached *int  `json:"tokens_cached"`
		Timings      *struct {
			PromptN    *int     `json:"prompt_n"`
			CacheN     *int     `json:"cache_n"`
			PromptMs   *float64 `json:"prompt_ms"`
			PredictedN int      `json:"predicted_n"`
		} `json:"timings"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil || v.Timings == nil ||
		v.Timings.PromptN == nil || v.Timings.CacheN == nil || v.Timings.PromptMs == nil {
		return replyStats{}
	}
	st := replyStats{ok: true, promptN: *v.Timings.PromptN, cacheN: *v.Timings.CacheN,
		promptMs: *v.Timings.PromptMs, predictedN: v.Timings.PredictedN, tokensCached: -1}
	if v.TokensCached != nil {
		st.tokensCached = *v.TokensCached
		if !t.stream { // a stream's last event has its own tokens, not all of them
			st.generated = v.Tokens
		}
	}
	return st
}

// holds reports whether the answer confirms that the slot now holds the n
// prompt tokens onebitd sent: prompt_n + cache_n == n, at least minCache of
// them reused from the cache (n-1 after a handoff, the trusted prefix when
// skipped), and tokens_cached, where reported, prompt + generated - 1.
func (st replyStats) holds(n, minCache int) bool {
	if !st.ok || st.promptN+st.cacheN != n || st.cacheN < minCache || st.promptN < 1 {
		return false
	}
	switch {
	case st.tokensCached < 0:
	case st.predictedN > 0 && st.tokensCached != n+st.predictedN-1:
		return false
	case st.predictedN == 0 && st.tokensCached != n-1 && st.tokensCached != n:
		return false
	}
	return true
}

// held is the tokens a confirmed answer leaves in the slot's cells 0..:
// the prompt once a token was generated (the last prompt token was
// evaluated to produce it), else all but its last (not every build
// evaluates it); then, when the native answer lists its generated tokens
// and tokens_cached counts them, all of those but the last (never
// evaluated). The result is a new slice.
func (st replyStats) held(tokens []int) []int {
	if st.predictedN == 0 {
		return slices.Clone(tokens[:max(len(tokens)-1, 0)])
	}
	g := len(st.generated)
	if g == 0 || g != st.predictedN || st.tokensCached != len(tokens)+g-1 {
		return slices.Clone(tokens)
	}
	return append(slices.Clone(tokens), st.generated[:g-1]...)
}
