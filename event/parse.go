package event

import (
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds the nesting of unknown values Parse skips over.
const maxDepth = 64

// Parse decodes one event: a JSON object, optionally surrounded by
// whitespace (a log line with its '\n'). It reads the fields of Event, skips
// fields it does not know (a later minor revision may add some), treats null
// as "absent" like encoding/json, and requires "v" to be Version. Keys match
// exactly (encoding/json would also accept "V" for "v"; no writer of this
// format produces that). Parse does not keep a reference to line.
func Parse(line []byte) (Event, error) {
	d := Decoder{oneShot: true}
	return d.Parse(line)
}

// Decoder parses events like Parse and reuses the strings of the last boot
// and node it saw, which repeat on nearly every line of a log. The zero
// Decoder is ready; a Decoder is not safe for concurrent use.
type Decoder struct {
	boot, node string
	scratch    []byte
	ids        [256]string // request ids seen recently, by hash

	// Slabs for the pointer fields: one allocation per slabSize events
	// instead of one per field.
	int64s   []int64
	ints     []int
	cleanups []Cleanup
	oneShot  bool // Parse's own Decoder: no slabs
}

const slabSize = 64

func (d *Decoder) slab() int {
	if d.oneShot {
		return 1
	}
	return slabSize
}

func (d *Decoder) newInt64(v int64) *int64 {
	if len(d.int64s) == 0 {
		d.int64s = make([]int64, d.slab())
	}
	p := &d.int64s[0]
	d.int64s = d.int64s[1:]
	*p = v
	return p
}

func (d *Decoder) newInt(v int) *int {
	if len(d.ints) == 0 {
		d.ints = make([]int, d.slab())
	}
	p := &d.ints[0]
	d.ints = d.ints[1:]
	*p = v
	return p
}

func (d *Decoder) newCleanup() *Cleanup {
	if len(d.cleanups) == 0 {
		d.cleanups = make([]Cleanup, d.slab())
	}
	p := &d.cleanups[0]
	d.cleanups = d.cleanups[1:]
	return p
}

// requestID returns s as a string, reusing the string of a recent equal id:
// a request's events are close together in a log.
func (d *Decoder) requestID(s []byte) string {
	h := uint32(2166136261)
	for _, c := range s {
		h = (h ^ uint32(c)) * 16777619
	}
	slot := &d.ids[h%uint32(len(d.ids))]
	if *slot != string(s) {
		*slot = string(s)
	}
	return *slot
}

// Parse is Parse with d's string reuse.
func (d *Decoder) Parse(line []byte) (Event, error) {
	var e Event
	p := parser{b: line, d: d}
	p.ws()
	if err := p.object(&e); err != nil {
		return Event{}, err
	}
	p.ws()
	if p.i != len(p.b) {
		return Event{}, fmt.Errorf("%w: data after the object at offset %d", ErrSyntax, p.i)
	}
	if e.V != Version {
		return Event{}, fmt.Errorf("%w: v=%d, this build reads v=%d", ErrVersion, e.V, Version)
	}
	return e, nil
}

type parser struct {
	b []byte
	i int
	d *Decoder
}

func (p *parser) ws() {
	b, i := p.b, p.i
	for i < len(b) && b[i] <= ' ' && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	p.i = i
}

func (p *parser) syntax(what string) error {
	if p.i >= len(p.b) {
		return fmt.Errorf("%w: %s, found end of input", ErrSyntax, what)
	}
	return fmt.Errorf("%w: %s at offset %d, found %q", ErrSyntax, what, p.i, p.b[p.i])
}

func (p *parser) expect(c byte) error {
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return nil
	}
	return p.syntax("expected " + strconv.QuoteRune(rune(c)))
}

// null consumes a null literal if one is next.
func (p *parser) null() bool {
	p.ws()
	if len(p.b)-p.i >= 4 && string(p.b[p.i:p.i+4]) == "null" {
		p.i += 4
		return true
	}
	return false
}

// keyOrder is the order AppendJSON writes keys in, each as `"key":`.
// object predicts the next key from it and skips the key's generic parse
// when the prediction holds, as it does for every line this package writes.
var keyOrder = func() [][]byte {
	out := make([][]byte, len(keyNames))
	for i, k := range keyNames {
		out[i] = []byte(`"` + k + `":`)
	}
	return out
}()

// Field indexes, in AppendJSON order.
const (
	kV = iota
	kBoot
	kSeq
	kTime
	kNode
	kRequestID
	kSlot
	kRoute
	kEvent
	kFrom
	kTo
	kElapsedUS
	kShareID
	kNTokens
	kNFDs
	kBytesMapped
	kReason
	kStep
	kHTTPStatus
	kProviderExit
	kCleanup
	kDecision
	kDecisionBasis
	kPredictedDecoder
	kPredictedHandoff
	kTokensHeld
	kTokensPrefill
	kInFlight
	kLost
	kUnknown
)

var keyNames = [...]string{"v", "boot", "seq", "time", "node", "request_id", "slot", "route", "event",
	"from", "to", "elapsed_us", "share_id", "n_tokens", "n_fds", "bytes_mapped", "reason", "step",
	"http_status", "provider_exit", "cleanup", "decision", "decision_basis", "predicted_decoder_us",
	"predicted_handoff_us", "tokens_held", "tokens_prefill", "in_flight", "lost"}

// keyIndex maps a key to its field index, kUnknown if none.
func keyIndex(key []byte) int {
	for i, k := range keyNames {
		if string(key) == k {
			return i
		}
	}
	return kUnknown
}

// predict reports whether the input at p.i is one of the keys from
// keyOrder[*k:] written as AppendJSON writes it; if so it consumes the key
// and the colon and advances *k past it.
func (p *parser) predict(k *int) (int, bool) {
	rest := p.b[p.i:]
	for j := *k; j < len(keyOrder); j++ {
		lit := keyOrder[j]
		if len(rest) >= len(lit) && string(rest[:len(lit)]) == string(lit) {
			p.i += len(lit)
			*k = j + 1
			return j, true
		}
		if j >= kShareID { // optional keys may be absent: keep looking
			continue
		}
		break
	}
	return kUnknown, false
}

// object parses the top-level event object into e.
func (p *parser) object(e *Event) error {
	if err := p.expect('{'); err != nil {
		return err
	}
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return nil
	}
	k := 0
	for {
		p.ws()
		idx, ok := p.predict(&k)
		if !ok {
			key, err := p.str()
			if err != nil {
				return err
			}
			idx = keyIndex(key)
			if err := p.expect(':'); err != nil {
				return err
			}
		}
		if err := p.field(e, idx); err != nil {
			return err
		}
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == ',' {
			p.i++
			continue
		}
		return p.expect('}')
	}
}

// field parses the value of field idx into e.
func (p *parser) field(e *Event, idx int) error {
	var err error
	switch idx {
	case kV:
		e.V, err = p.intField("v")
	case kBoot:
		e.Boot, err = p.strField("boot", &p.d.boot)
	case kSeq:
		e.Seq, err = p.uintField("seq")
	case kTime:
		e.Time, err = p.timeField()
	case kNode:
		e.Node, err = p.strField("node", &p.d.node)
	case kRequestID:
		e.RequestID, err = p.requestID()
	case kSlot:
		e.Slot, err = p.intField("slot")
	case kRoute:
		e.Route, err = p.strField("route", nil)
	case kEvent:
		e.Event, err = p.strField("event", nil)
	case kFrom:
		e.From, err = p.strField("from", nil)
	case kTo:
		e.To, err = p.strField("to", nil)
	case kElapsedUS:
		e.ElapsedUS, err = p.int64Field("elapsed_us")
	case kShareID:
		if p.null() {
			e.ShareID = nil
			return nil
		}
		var v int64
		v, err = p.int64Field("share_id")
		e.ShareID = p.d.newInt64(v)
	case kNTokens:
		e.NTokens, err = p.intField("n_tokens")
	case kNFDs:
		e.NFDs, err = p.intField("n_fds")
	case kBytesMapped:
		e.BytesMapped, err = p.int64Field("bytes_mapped")
	case kReason:
		e.Reason, err = p.strField("reason", nil)
	case kStep:
		e.Step, err = p.strField("step", nil)
	case kHTTPStatus:
		e.HTTPStatus, err = p.intField("http_status")
	case kProviderExit:
		if p.null() {
			e.ProviderExit = nil
			return nil
		}
		var v int
		v, err = p.intField("provider_exit")
		e.ProviderExit = p.d.newInt(v)
	case kCleanup:
		if p.null() {
			e.Cleanup = nil
			return nil
		}
		c := p.d.newCleanup()
		err = p.cleanup(c)
		e.Cleanup = c
	case kDecision:
		e.Decision, err = p.strField("decision", nil)
	case kDecisionBasis:
		e.DecisionBasis, err = p.strField("decision_basis", nil)
	case kPredictedDecoder:
		e.PredictedDecoder, err = p.int64Field("predicted_decoder_us")
	case kPredictedHandoff:
		e.PredictedHandoff, err = p.int64Field("predicted_handoff_us")
	case kTokensHeld:
		e.TokensHeld, err = p.intField("tokens_held")
	case kTokensPrefill:
		e.TokensPrefill, err = p.intField("tokens_prefill")
	case kInFlight:
		if p.null() {
			e.InFlight = nil
			return nil
		}
		var v int
		v, err = p.intField("in_flight")
		e.InFlight = &v
	case kLost:
		if p.null() {
			e.Lost = nil
			return nil
		}
		l := new(Lost)
		err = p.lost(l)
		e.Lost = l
	default:
		err = p.skip(0)
	}
	return err
}

func (p *parser) cleanup(c *Cleanup) error {
	if err := p.expect('{'); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return nil
	}
	for {
		p.ws()
		key, err := p.str()
		if err != nil {
			return err
		}
		if err := p.expect(':'); err != nil {
			return err
		}
		switch string(key) {
		case "fds_closed":
			c.FDsClosed, err = p.intField("cleanup.fds_closed")
		case "files_removed":
			c.FilesRemoved, err = p.intField("cleanup.files_removed")
		default:
			err = p.skip(1)
		}
		if err != nil {
			return err
		}
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == ',' {
			p.i++
			continue
		}
		return p.expect('}')
	}
}

// lost parses the object of a LostEvent marker.
func (p *parser) lost(l *Lost) error {
	if err := p.expect('{'); err != nil {
		return fmt.Errorf("lost: %w", err)
	}
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return nil
	}
	for {
		p.ws()
		key, err := p.str()
		if err != nil {
			return err
		}
		if err := p.expect(':'); err != nil {
			return err
		}
		switch string(key) {
		case "events":
			l.Events, err = p.uintField("lost.events")
		case "first_seq":
			l.FirstSeq, err = p.uintField("lost.first_seq")
		case "last_seq":
			l.LastSeq, err = p.uintField("lost.last_seq")
		default:
			err = p.skip(1)
		}
		if err != nil {
			return err
		}
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == ',' {
			p.i++
			continue
		}
		return p.expect('}')
	}
}

// strField parses a string value (null leaves ""); last, when set, is a
// one-entry cache that saves the allocation for repeated values.
func (p *parser) strField(name string, last *string) (string, error) {
	if p.null() {
		return "", nil
	}
	p.ws()
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return "", fmt.Errorf("%w: %s: not a string at offset %d", ErrField, name, p.i)
	}
	s, err := p.str()
	if err != nil {
		return "", err
	}
	if last != nil {
		if *last != string(s) {
			*last = string(s)
		}
		return *last, nil
	}
	return intern(s), nil
}

func (p *parser) requestID() (string, error) {
	if p.null() {
		return "", nil
	}
	p.ws()
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return "", fmt.Errorf("%w: request_id: not a string at offset %d", ErrField, p.i)
	}
	s, err := p.str()
	if err != nil {
		return "", err
	}
	return p.d.requestID(s), nil
}

// intern returns the constant for the enum values that appear on every line
// (routes, events, states) and a fresh string otherwise.
func intern(s []byte) string {
	switch string(s) {
	case "":
		return ""
	case "plain":
		return "plain"
	case "file":
		return "file"
	case "shared":
		return "shared"
	case "fallback":
		return "fallback"
	case "received":
		return "received"
	case "listening":
		return "listening"
	case "prefilled":
		return "prefilled"
	case "adopted":
		return "adopted"
	case "restored":
		return "restored"
	case "forwarding":
		return "forwarding"
	case "done":
		return "done"
	case "failed":
		return "failed"
	case "listen":
		return "listen"
	case "share":
		return "share"
	case "prefill":
		return "prefill"
	case "adopt":
		return "adopt"
	case "restore":
		return "restore"
	case "forward":
		return "forward"
	case "finish":
		return "finish"
	case "fail":
		return "fail"
	}
	return string(s)
}

// str parses a JSON string at p.i and returns its decoded bytes, which alias
// either the input or the decoder's scratch buffer. Invalid UTF-8 decodes to
// U+FFFD and unpaired surrogate escapes to U+FFFD, as in encoding/json.
func (p *parser) str() ([]byte, error) {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return nil, p.syntax("expected a string")
	}
	start := p.i + 1
	// Fast path: printable ASCII up to the closing quote.
	b, i := p.b, start
	for i < len(b) {
		c := b[i]
		if c == '"' {
			p.i = i + 1
			return b[start:i], nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		i++
	}
	p.i = i
	buf := append(p.d.scratch[:0], p.b[start:p.i]...)
	for {
		if p.i >= len(p.b) {
			return nil, p.syntax("unterminated string")
		}
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			p.d.scratch = buf
			return buf, nil
		case c < 0x20:
			return nil, p.syntax("control character in string")
		case c == '\\':
			p.i++
			if p.i >= len(p.b) {
				return nil, p.syntax("unterminated escape")
			}
			esc := p.b[p.i]
			p.i++
			switch esc {
			case '"', '\\', '/':
				buf = append(buf, esc)
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return nil, p.syntax("bad \\u escape")
				}
				if utf16.IsSurrogate(r) {
					r2 := rune(-1)
					if len(p.b)-p.i >= 6 && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
						save := p.i
						p.i += 2
						if v, ok := p.hex4(); ok {
							r2 = v
						}
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							r = dec
						} else {
							p.i = save
							r = utf8.RuneError
						}
					} else {
						r = utf8.RuneError
					}
				}
				buf = utf8.AppendRune(buf, r)
			default:
				p.i -= 2
				return nil, p.syntax("bad escape")
			}
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			p.i++
		default:
			r, size := utf8.DecodeRune(p.b[p.i:])
			if r == utf8.RuneError && size == 1 {
				buf = append(buf, "\uFFFD"...)
			} else {
				buf = append(buf, p.b[p.i:p.i+size]...)
			}
			p.i += size
		}
	}
}

func (p *parser) hex4() (rune, bool) {
	if len(p.b)-p.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	p.i += 4
	return r, true
}

// number scans a JSON number and returns its text and whether it is an
// integer (no fraction, no exponent).
func (p *parser) number() ([]byte, bool, error) {
	p.ws()
	start := p.i
	// Fast path: a short run of digits ending the number.
	if b, i := p.b, p.i; i < len(b) && '1' <= b[i] && b[i] <= '9' {
		for i++; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
		}
		if i < len(b) && b[i] != '.' && b[i] != 'e' && b[i] != 'E' {
			p.i = i
			return b[start:i], true, nil
		}
	}
	if p.i < len(p.b) && p.b[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.b) && p.b[p.i] == '0':
		p.i++
	case p.i < len(p.b) && '1' <= p.b[p.i] && p.b[p.i] <= '9':
		for p.i < len(p.b) && '0' <= p.b[p.i] && p.b[p.i] <= '9' {
			p.i++
		}
	default:
		return nil, false, p.syntax("expected a number")
	}
	integer := true
	if p.i < len(p.b) && p.b[p.i] == '.' {
		integer = false
		p.i++
		if p.i >= len(p.b) || p.b[p.i] < '0' || p.b[p.i] > '9' {
			return nil, false, p.syntax("expected a digit")
		}
		for p.i < len(p.b) && '0' <= p.b[p.i] && p.b[p.i] <= '9' {
			p.i++
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		integer = false
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if p.i >= len(p.b) || p.b[p.i] < '0' || p.b[p.i] > '9' {
			return nil, false, p.syntax("expected a digit")
		}
		for p.i < len(p.b) && '0' <= p.b[p.i] && p.b[p.i] <= '9' {
			p.i++
		}
	}
	return p.b[start:p.i], integer, nil
}

// int64Field parses an integer value (null leaves 0).
func (p *parser) int64Field(name string) (int64, error) {
	if p.null() {
		return 0, nil
	}
	p.ws()
	if p.i < len(p.b) && p.b[p.i] != '-' && (p.b[p.i] < '0' || p.b[p.i] > '9') {
		return 0, fmt.Errorf("%w: %s: not a number at offset %d", ErrField, name, p.i)
	}
	text, integer, err := p.number()
	if err != nil {
		return 0, err
	}
	if !integer {
		return 0, fmt.Errorf("%w: %s: %s is not an integer", ErrField, name, text)
	}
	// Hand-rolled for the common short case; strconv for the rest.
	if len(text) <= 18 {
		neg := text[0] == '-'
		digits := text
		if neg {
			digits = text[1:]
		}
		var v int64
		for _, c := range digits {
			v = v*10 + int64(c-'0')
		}
		if neg {
			v = -v
		}
		return v, nil
	}
	v, err := strconv.ParseInt(string(text), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %s out of range", ErrField, name, text)
	}
	return v, nil
}

func (p *parser) intField(name string) (int, error) {
	v, err := p.int64Field(name)
	if err != nil {
		return 0, err
	}
	if v < math.MinInt || v > math.MaxInt {
		return 0, fmt.Errorf("%w: %s: %d out of range", ErrField, name, v)
	}
	return int(v), nil
}

func (p *parser) uintField(name string) (uint64, error) {
	if p.null() {
		return 0, nil
	}
	p.ws()
	if p.i < len(p.b) && (p.b[p.i] < '0' || p.b[p.i] > '9') {
		return 0, fmt.Errorf("%w: %s: not an unsigned number at offset %d", ErrField, name, p.i)
	}
	text, integer, err := p.number()
	if err != nil {
		return 0, err
	}
	if !integer {
		return 0, fmt.Errorf("%w: %s: %s is not an integer", ErrField, name, text)
	}
	if len(text) <= 19 {
		var v uint64
		for _, c := range text {
			v = v*10 + uint64(c-'0')
		}
		return v, nil
	}
	v, err := strconv.ParseUint(string(text), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %s out of range", ErrField, name, text)
	}
	return v, nil
}

// timeField parses an RFC 3339 time string (null leaves the zero time).
func (p *parser) timeField() (time.Time, error) {
	if p.null() {
		return time.Time{}, nil
	}
	p.ws()
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return time.Time{}, fmt.Errorf("%w: time: not a string at offset %d", ErrField, p.i)
	}
	s, err := p.str()
	if err != nil {
		return time.Time{}, err
	}
	if t, ok := parseUTC(s); ok {
		return t, nil
	}
	t, err := time.Parse(time.RFC3339, string(s))
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: time: %w", ErrField, err)
	}
	return t, nil
}

// parseUTC is the fast path for the form AppendJSON writes,
// "2006-01-02T15:04:05[.fraction]Z". It reports false for anything else,
// including out-of-range values, which then go through time.Parse.
func parseUTC(s []byte) (time.Time, bool) {
	if len(s) < 20 || s[len(s)-1] != 'Z' || s[4] != '-' || s[7] != '-' || s[10] != 'T' ||
		s[13] != ':' || s[16] != ':' {
		return time.Time{}, false
	}
	num := func(b []byte) (int, bool) {
		v := 0
		for _, c := range b {
			if c < '0' || c > '9' {
				return 0, false
			}
			v = v*10 + int(c-'0')
		}
		return v, true
	}
	year, ok1 := num(s[0:4])
	month, ok2 := num(s[5:7])
	day, ok3 := num(s[8:10])
	hour, ok4 := num(s[11:13])
	minute, ok5 := num(s[14:16])
	sec, ok6 := num(s[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || month < 1 || month > 12 || day < 1 ||
		day > daysIn(month, year) || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	ns := 0
	if frac := s[19 : len(s)-1]; len(frac) > 0 {
		if frac[0] != '.' || len(frac) < 2 || len(frac) > 10 {
			return time.Time{}, false
		}
		v, ok := num(frac[1:])
		if !ok {
			return time.Time{}, false
		}
		for range 10 - len(frac) {
			v *= 10
		}
		ns = v
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, ns, time.UTC), true
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// skip consumes one JSON value of any type, checking its syntax.
func (p *parser) skip(depth int) error {
	if depth > maxDepth {
		return p.syntax("nesting too deep")
	}
	p.ws()
	if p.i >= len(p.b) {
		return p.syntax("expected a value")
	}
	switch c := p.b[p.i]; {
	case c == '"':
		_, err := p.str()
		return err
	case c == '{':
		p.i++
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == '}' {
			p.i++
			return nil
		}
		for {
			p.ws()
			if _, err := p.str(); err != nil {
				return err
			}
			if err := p.expect(':'); err != nil {
				return err
			}
			if err := p.skip(depth + 1); err != nil {
				return err
			}
			p.ws()
			if p.i < len(p.b) && p.b[p.i] == ',' {
				p.i++
				continue
			}
			return p.expect('}')
		}
	case c == '[':
		p.i++
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == ']' {
			p.i++
			return nil
		}
		for {
			if err := p.skip(depth + 1); err != nil {
				return err
			}
			p.ws()
			if p.i < len(p.b) && p.b[p.i] == ',' {
				p.i++
				continue
			}
			return p.expect(']')
		}
	case c == '-' || ('0' <= c && c <= '9'):
		_, _, err := p.number()
		return err
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(p.b)-p.i >= len(lit) && string(p.b[p.i:p.i+len(lit)]) == lit {
			p.i += len(lit)
			return nil
		}
	}
	return p.syntax("expected a value")
}
