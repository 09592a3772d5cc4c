package event

import (
	"errors"
	"strconv"
	"time"
	"unicode/utf8"
)

// Errors returned by Parse. Each is wrapped with the offending field or byte
// offset.
var (
	// ErrSyntax: the line is not one well-formed JSON object.
	ErrSyntax = errors.New("event: malformed JSON")
	// ErrVersion: "v" is missing or not a version this build reads.
	ErrVersion = errors.New("event: unsupported event version")
	// ErrField: a known field holds a value of the wrong type or range.
	ErrField = errors.New("event: bad field value")
)

// AppendJSON appends e as one JSON object (no trailing newline) and returns
// the extended buffer. The bytes are exactly what encoding/json's Marshal
// produces for e once e.Time is in UTC: fields in struct order, optional
// fields omitted when zero or nil, strings escaped like encoding/json
// (including its HTML-safe escapes and U+2028/U+2029), invalid UTF-8 replaced
// by U+FFFD, time as RFC 3339 with nanoseconds in UTC. It does not allocate
// when b has room.
//
// A time outside years 0000-9999 cannot be written in RFC 3339; AppendJSON
// then writes time.Time's Format output, which Parse rejects (encoding/json
// refuses to marshal such an event at all).
func (e *Event) AppendJSON(b []byte) []byte {
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(e.V), 10)
	b = append(b, `,"boot":`...)
	b = appendString(b, e.Boot)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, `,"time":"`...)
	b = appendTime(b, e.Time)
	b = append(b, `","node":`...)
	b = appendString(b, e.Node)
	b = append(b, `,"request_id":`...)
	b = appendString(b, e.RequestID)
	b = append(b, `,"slot":`...)
	b = strconv.AppendInt(b, int64(e.Slot), 10)
	b = append(b, `,"route":`...)
	b = appendString(b, e.Route)
	b = append(b, `,"event":`...)
	b = appendString(b, e.Event)
	b = append(b, `,"from":`...)
	b = appendString(b, e.From)
	b = append(b, `,"to":`...)
	b = appendString(b, e.To)
	b = append(b, `,"elapsed_us":`...)
	b = strconv.AppendInt(b, e.ElapsedUS, 10)
	if e.ShareID != nil {
		b = append(b, `,"share_id":`...)
		b = strconv.AppendInt(b, *e.ShareID, 10)
	}
	if e.NTokens != 0 {
		b = append(b, `,"n_tokens":`...)
		b = strconv.AppendInt(b, int64(e.NTokens), 10)
	}
	if e.NFDs != 0 {
		b = append(b, `,"n_fds":`...)
		b = strconv.AppendInt(b, int64(e.NFDs), 10)
	}
	if e.BytesMapped != 0 {
		b = append(b, `,"bytes_mapped":`...)
		b = strconv.AppendInt(b, e.BytesMapped, 10)
	}
	if e.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendString(b, e.Reason)
	}
	if e.Step != "" {
		b = append(b, `,"step":`...)
		b = appendString(b, e.Step)
	}
	if e.HTTPStatus != 0 {
		b = append(b, `,"http_status":`...)
		b = strconv.AppendInt(b, int64(e.HTTPStatus), 10)
	}
	if e.ProviderExit != nil {
		b = append(b, `,"provider_exit":`...)
		b = strconv.AppendInt(b, int64(*e.ProviderExit), 10)
	}
	if e.Cleanup != nil {
		b = append(b, `,"cleanup":{"fds_closed":`...)
		b = strconv.AppendInt(b, int64(e.Cleanup.FDsClosed), 10)
		b = append(b, `,"files_removed":`...)
		b = strconv.AppendInt(b, int64(e.Cleanup.FilesRemoved), 10)
		b = append(b, '}')
	}
	if e.Decision != "" {
		b = append(b, `,"decision":`...)
		b = appendString(b, e.Decision)
	}
	if e.DecisionBasis != "" {
		b = append(b, `,"decision_basis":`...)
		b = appendString(b, e.DecisionBasis)
	}
	if e.PredictedDecoder != 0 {
		b = append(b, `,"predicted_decoder_us":`...)
		b = strconv.AppendInt(b, e.PredictedDecoder, 10)
	}
	if e.PredictedHandoff != 0 {
		b = append(b, `,"predicted_handoff_us":`...)
		b = strconv.AppendInt(b, e.PredictedHandoff, 10)
	}
	if e.TokensHeld != 0 {
		b = append(b, `,"tokens_held":`...)
		b = strconv.AppendInt(b, int64(e.TokensHeld), 10)
	}
	if e.TokensPrefill != 0 {
		b = append(b, `,"tokens_prefill":`...)
		b = strconv.AppendInt(b, int64(e.TokensPrefill), 10)
	}
	if e.InFlight != nil {
		b = append(b, `,"in_flight":`...)
		b = strconv.AppendInt(b, int64(*e.InFlight), 10)
	}
	if e.Lost != nil {
		b = append(b, `,"lost":{"events":`...)
		b = strconv.AppendUint(b, e.Lost.Events, 10)
		b = append(b, `,"first_seq":`...)
		b = strconv.AppendUint(b, e.Lost.FirstSeq, 10)
		b = append(b, `,"last_seq":`...)
		b = strconv.AppendUint(b, e.Lost.LastSeq, 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

// appendTime writes t in UTC as RFC 3339 with trailing-zero-trimmed
// nanoseconds, the layout of time.RFC3339Nano, without going through
// time.Format's layout interpreter.
func appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, time.RFC3339Nano)
	}
	hour, minute, sec := t.Clock()
	b = append(b,
		byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+int(month)/10), byte('0'+int(month)%10), '-',
		byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':',
		byte('0'+minute/10), byte('0'+minute%10), ':',
		byte('0'+sec/10), byte('0'+sec%10))
	if ns := t.Nanosecond(); ns != 0 {
		var frac [10]byte
		frac[0] = '.'
		for i := 9; i >= 1; i-- {
			frac[i] = byte('0' + ns%10)
			ns /= 10
		}
		n := 10
		for frac[n-1] == '0' {
			n--
		}
		b = append(b, frac[:n]...)
	}
	return append(b, 'Z')
}

const hexDigits = "0123456789abcdef"

// safe[c] is true for the ASCII bytes encoding/json writes as themselves
// (its htmlSafeSet: printable, not '"', '\\', '<', '>' or '&').
var safe = func() (s [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		s[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return s
}()

// appendString appends s as a JSON string, escaped exactly as encoding/json
// escapes it by default.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if safe[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default: // other control bytes and the HTML-unsafe <, >, &
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
