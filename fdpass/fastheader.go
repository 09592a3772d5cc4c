package fdpass

import "strconv"

// fastHeader parses the common shape of a header without reflection: one
// object with exactly the lowercase keys of Header (each at most once),
// regions as objects with exactly Region's keys, integers without fraction
// or exponent, strings of printable ASCII without escapes, no null, nothing
// but whitespace after the object. On anything else it returns ok false and
// decodeHeader takes encoding/json's strict path, which decides (and words
// the error). Whatever fastHeader accepts, the strict path accepts with an
// identical Header (FuzzFastHeader checks it).
//
// encoding/json spent ~130 µs on a 56-region header (5 KB) in the handoff
// profile; this parser spends a few µs.
func fastHeader(raw []byte) (h Header, ok bool) {
	p := fastParser{b: raw}
	if !p.object(func(key []byte) bool {
		switch string(key) {
		case "version":
			return p.intField(&h.Version)
		case "layout_hash":
			return p.str(&h.LayoutHash)
		case "n_ctx":
			return p.intField(&h.NCtx)
		case "n_layer":
			return p.intField(&h.NLayer)
		case "kv_type_k":
			return p.str(&h.KVTypeK)
		case "kv_type_v":
			return p.str(&h.KVTypeV)
		case "flash_attn":
			return p.boolean(&h.FlashAttn)
		case "n_batch":
			return p.intField(&h.NBatch)
		case "n_ubatch":
			return p.intField(&h.NUbatch)
		case "regions":
			return p.regions(&h.Regions)
		}
		return false
	}) {
		return Header{}, false
	}
	p.space()
	if p.i != len(p.b) {
		return Header{}, false
	}
	return h, true
}

type fastParser struct {
	b []byte
	i int
}

func (p *fastParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// consume skips whitespace and then c.
func (p *fastParser) consume(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// object parses {"key": value, ...}; field parses the value of key. A key
// seen twice is refused (encoding/json would keep the last).
func (p *fastParser) object(field func(key []byte) bool) bool {
	if !p.consume('{') {
		return false
	}
	if p.consume('}') {
		return true
	}
	var seen [16][]byte
	nseen := 0
	for {
		key, ok := p.rawString()
		if !ok || !p.consume(':') {
			return false
		}
		for _, k := range seen[:nseen] {
			if string(k) == string(key) {
				return false
			}
		}
		if nseen == len(seen) {
			return false
		}
		seen[nseen] = key
		nseen++
		if !field(key) {
			return false
		}
		if p.consume(',') {
			continue
		}
		return p.consume('}')
	}
}

// rawString returns the bytes of a string of printable ASCII without
// escapes (anything else: not ok).
func (p *fastParser) rawString() ([]byte, bool) {
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
		case c < 0x20 || c >= 0x7f || c == '\\':
			return nil, false
		}
		p.i++
	}
	return nil, false
}

func (p *fastParser) str(dst *string) bool {
	s, ok := p.rawString()
	if ok {
		*dst = string(s)
	}
	return ok
}

func (p *fastParser) boolean(dst *bool) bool {
	p.space()
	switch {
	case len(p.b)-p.i >= 4 && string(p.b[p.i:p.i+4]) == "true":
		*dst, p.i = true, p.i+4
	case len(p.b)-p.i >= 5 && string(p.b[p.i:p.i+5]) == "false":
		*dst, p.i = false, p.i+5
	default:
		return false
	}
	return true
}

// integer parses a JSON integer (-?(0|[1-9][0-9]*)) that fits a signed
// integer of bits bits.
func (p *fastParser) integer(bits int) (int64, bool) {
	p.space()
	neg := p.i < len(p.b) && p.b[p.i] == '-'
	if neg {
		p.i++
	}
	digits := p.i
	limit := uint64(1)<<(bits-1) - 1 // largest magnitude
	if neg {
		limit++
	}
	var u uint64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		d := uint64(p.b[p.i] - '0')
		if u > (limit-d)/10 {
			return 0, false
		}
		u = u*10 + d
		p.i++
	}
	switch {
	case p.i == digits, p.b[digits] == '0' && p.i-digits > 1:
		return 0, false
	case p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E'):
		return 0, false
	}
	if neg {
		return -int64(u), true // u = 1<<63 wraps to math.MinInt64, as wanted
	}
	return int64(u), true
}

func (p *fastParser) intField(dst *int) bool {
	v, ok := p.integer(strconv.IntSize)
	*dst = int(v)
	return ok
}

func (p *fastParser) int64Field(dst *int64) bool {
	v, ok := p.integer(64)
	*dst = v
	return ok
}

func (p *fastParser) regions(dst *[]Region) bool {
	if !p.consume('[') {
		return false
	}
	rs := make([]Region, 0, 64)
	if !p.consume(']') {
		for {
			var r Region
			if !p.object(func(key []byte) bool {
				switch string(key) {
				case "fd_index":
					return p.intField(&r.FDIndex)
				case "offset":
					return p.int64Field(&r.Offset)
				case "size":
					return p.int64Field(&r.Size)
				case "kind":
					return p.str(&r.Kind)
				case "layer":
					return p.intField(&r.Layer)
				case "cell_stride":
					return p.int64Field(&r.CellStride)
				}
				return false
			}) {
				return false
			}
			rs = append(rs, r)
			if p.consume(',') {
				continue
			}
			if !p.consume(']') {
				return false
			}
			break
		}
	}
	*dst = rs
	return true
}
