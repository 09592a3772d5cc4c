package decodersim

import (
	"bytes"
	"net/http"
)

// readAdopt reads an adopt body. The usual shape — {"tokens":[ids…],
// "share_id":N} with an optional "layout_hash", plain keys and integers — is
// parsed in one pass over the bytes (fastAdopt): encoding/json scanned a
// 12 722-token body five times (decoder, RawMessage, key matching, the array,
// each id) and made the adopt round trip milliseconds long for microseconds
// of work. Anything else takes the general path (decodeBody + parseAdopt),
// which gives the same answer for what the fast path accepts (FuzzAdoptBody).
func readAdopt(r *http.Request, lax bool) (toks []int, shareID int64, layoutHash *string, e *apiError) {
	raw, e := readRaw(r)
	if e != nil {
		return nil, 0, nil, e
	}
	return parseAdoptBody(raw, lax)
}

func parseAdoptBody(raw []byte, lax bool) (toks []int, shareID int64, layoutHash *string, e *apiError) {
	if fa, ok := fastAdopt(raw); ok {
		toks, shareID, e = checkAdopt(fa.tokens, fa.shareID, lax)
		return toks, shareID, fa.layoutHash, e
	}
	var body adoptBody
	if e := decodeBody(raw, &body); e != nil {
		return nil, 0, nil, e
	}
	toks, shareID, e = parseAdopt(body, lax)
	return toks, shareID, body.LayoutHash, e
}

// fastBody is what fastAdopt found.
type fastBody struct {
	tokens     []int
	shareID    []byte // the raw integer, or nil when absent or null
	layoutHash *string
}

// fastAdopt parses the usual adopt body. ok is false for anything it does
// not fully understand (escapes in strings, other keys, fractions or
// exponents, ids of more than 9 digits, a missing "tokens"): the caller then
// takes the general path. Keys match exactly; a repeated key keeps its last
// value, as in nlohmann::json.
func fastAdopt(b []byte) (fb fastBody, ok bool) {
	p := fastJSON{b: b}
	if !p.consume('{') {
		return fb, false
	}
	haveTokens := false
	for first := true; ; first = false {
		if p.consume('}') {
			if first || !haveTokens { // "{}" and no tokens: the general path says why
				return fb, false
			}
			break
		}
		if !first && !p.consume(',') {
			return fb, false
		}
		key, ok := p.plainString()
		if !ok || !p.consume(':') {
			return fb, false
		}
		switch string(key) {
		case "tokens":
			if fb.tokens == nil { // one allocation: ids are separated by commas
				fb.tokens = make([]int, 0, bytes.Count(b, []byte{','})+1)
			}
			if fb.tokens, ok = p.intArray(fb.tokens[:0]); !ok {
				return fb, false
			}
			haveTokens = true
		case "share_id":
			if p.literal("null") {
				fb.shareID = nil
				continue
			}
			if fb.shareID, ok = p.integer(); !ok {
				return fb, false
			}
		case "layout_hash":
			if p.literal("null") {
				fb.layoutHash = nil
				continue
			}
			s, ok := p.plainString()
			if !ok {
				return fb, false
			}
			h := string(s)
			fb.layoutHash = &h
		default:
			return fb, false
		}
	}
	p.space()
	return fb, p.i == len(p.b)
}

// fastJSON is a cursor over JSON bytes for fastAdopt.
type fastJSON struct {
	b []byte
	i int
}

func (p *fastJSON) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// consume skips whitespace and then c, if c is next.
func (p *fastJSON) consume(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// literal consumes a keyword (null) followed by a delimiter.
func (p *fastJSON) literal(w string) bool {
	p.space()
	if len(p.b)-p.i >= len(w) && string(p.b[p.i:p.i+len(w)]) == w {
		if j := p.i + len(w); j == len(p.b) || isDelim(p.b[j]) {
			p.i = j
			return true
		}
	}
	return false
}

func isDelim(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// plainString reads a string without escapes or control characters
// (anything else: not ok). Non-ASCII bytes must be valid UTF-8 for the
// general path to agree; they are refused here.
func (p *fastJSON) plainString() ([]byte, bool) {
	if !p.consume('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			return s, true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, false
		}
		p.i++
	}
	return nil, false
}

// integer reads a JSON integer of 1 to 9 digits (optionally negative, no
// leading zero, no fraction or exponent) and returns its bytes.
func (p *fastJSON) integer() ([]byte, bool) {
	p.space()
	start := p.i
	if p.i < len(p.b) && p.b[p.i] == '-' {
		p.i++
	}
	d := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	n := p.i - d
	if n == 0 || n > 9 || n > 1 && p.b[d] == '0' || p.i < len(p.b) && !isDelim(p.b[p.i]) {
		return nil, false
	}
	return p.b[start:p.i], true
}

// intArray reads an array of integers (see integer) into dst.
func (p *fastJSON) intArray(dst []int) ([]int, bool) {
	if !p.consume('[') {
		return nil, false
	}
	if p.consume(']') {
		return dst, true
	}
	for {
		raw, ok := p.integer()
		if !ok {
			return nil, false
		}
		v, neg := 0, raw[0] == '-'
		if neg {
			raw = raw[1:]
		}
		for _, c := range raw {
			v = v*10 + int(c-'0')
		}
		if neg {
			v = -v
		}
		dst = append(dst, v)
		if p.consume(']') {
			return dst, true
		}
		if !p.consume(',') {
			return nil, false
		}
	}
}
