package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func ptr[T any](v T) *T { return &v }

var t0 = time.Date(2026, 11, 29, 10, 15, 29, 123456000, time.UTC)

// sampleEvents covers every optional field on and off, odd strings and odd
// times.
func sampleEvents() map[string]Event {
	base := Event{V: 1, Boot: "0123456789abcdef", Seq: 7, Time: t0, Node: "n1",
		RequestID: "r-1", Slot: 2, Route: "shared", Event: "share", From: "listening",
		To: "shared", ElapsedUS: 1234}
	with := func(f func(*Event)) Event { e := base; f(&e); return e }
	return map[string]Event{
		"zero":    {},
		"minimal": base,
		"all optional": with(func(e *Event) {
			e.ShareID = ptr(int64(0))
			e.NTokens = 512
			e.NFDs = 56
			e.BytesMapped = 1 << 40
			e.Reason = "provider exited with status 3: out of memory"
			e.Step = "adopt"
			e.HTTPStatus = 501
			e.ProviderExit = ptr(0)
			e.Cleanup = &Cleanup{FDsClosed: 56, FilesRemoved: 3}
			e.Decision = "handoff"
			e.DecisionBasis = "model"
			e.PredictedDecoder = 123456
			e.PredictedHandoff = 23456
			e.TokensHeld = 300
			e.TokensPrefill = 212
		}),
		"skip decision": with(func(e *Event) {
			e.Event, e.From, e.To, e.Route = "forward", "received", "forwarding", "plain"
			e.Decision, e.DecisionBasis, e.TokensPrefill = "skip", "floor", 10
		}),
		"negative and extremes": with(func(e *Event) {
			e.Seq = math.MaxUint64
			e.Slot = -1
			e.ElapsedUS = math.MinInt64
			e.ShareID = ptr(int64(math.MaxInt64))
			e.ProviderExit = ptr(-9)
			e.PredictedDecoder = math.MinInt64
			e.PredictedHandoff = math.MaxInt64
			e.TokensHeld = -1
			e.Cleanup = &Cleanup{}
		}),
		"escapes": with(func(e *Event) {
			e.Reason = "a \"quoted\" \\ path\n\r\t\b\f\x00\x1f <tag> & \u2028\u2029 é 日本 🎉 /"
			e.RequestID = "bad utf8 \xff\xfe end"
		}),
		"whole second":     with(func(e *Event) { e.Time = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }),
		"nanoseconds":      with(func(e *Event) { e.Time = time.Date(2026, 1, 2, 3, 4, 5, 1, time.UTC) }),
		"trailing zeros":   with(func(e *Event) { e.Time = time.Date(2026, 1, 2, 3, 4, 5, 120000000, time.UTC) }),
		"leap day":         with(func(e *Event) { e.Time = time.Date(2024, 2, 29, 23, 59, 59, 999999999, time.UTC) }),
		"year 0":           with(func(e *Event) { e.Time = time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC) }),
		"lifecycle event":  {V: 1, Boot: "b", Seq: 1, Time: t0, Node: "n", Event: "decoder.ready"},
		"non-UTC location": with(func(e *Event) { e.Time = t0.In(time.FixedZone("X", 3600)) }),
		"shutdown line":    {V: 1, Boot: "b", Seq: 9, Time: t0, Node: "n", Event: Shutdown, InFlight: ptr(0)},
		"loss marker": {V: 1, Boot: "b", Time: t0, Node: "n", Event: LostEvent, Reason: "no space left on device",
			Lost: &Lost{Events: 4979, FirstSeq: 1024, LastSeq: 6002}},
	}
}

// eventsEqual compares two events, times by instant.
func eventsEqual(a, b Event) bool {
	if !a.Time.Equal(b.Time) {
		return false
	}
	a.Time, b.Time = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}

func TestAppendJSONMatchesMarshal(t *testing.T) {
	for name, e := range sampleEvents() {
		t.Run(name, func(t *testing.T) {
			got := e.AppendJSON(nil)
			u := e
			u.Time = u.Time.UTC()
			want, err := json.Marshal(&u)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("AppendJSON:\n got %s\nwant %s", got, want)
			}
			if e.V != Version {
				return
			}
			back, err := Parse(got)
			if err != nil {
				t.Fatalf("Parse(%s): %v", got, err)
			}
			if utf8.ValidString(u.RequestID) && !eventsEqual(back, u) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", back, u)
			}
			var std Event
			if err := json.Unmarshal(got, &std); err != nil {
				t.Fatal(err)
			}
			if !eventsEqual(back, std) {
				t.Fatalf("Parse differs from encoding/json:\n got %+v\nwant %+v", back, std)
			}
		})
	}
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", " ", "\"", "\\", "/", "<", ">", "&", "\n", "\x00", "\x7f", "\x1b",
		"é", "\u2028", "\u2029", "\ufffd", "🎉", "\xff", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80"}
	for i := range 20000 {
		var sb strings.Builder
		n := rng.IntN(12)
		for range n {
			if rng.IntN(4) == 0 {
				sb.WriteByte(byte(rng.IntN(256)))
			} else {
				sb.WriteString(alphabet[rng.IntN(len(alphabet))])
			}
		}
		s := sb.String()
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("case %d %q:\n got %s\nwant %s", i, s, got, want)
		}
		// And back: Parse's string decoder agrees with encoding/json.
		var std string
		if err := json.Unmarshal(want, &std); err != nil {
			t.Fatal(err)
		}
		p := parser{b: want, d: &Decoder{}}
		got, err := p.str()
		if err != nil || string(got) != std {
			t.Fatalf("case %d: str(%s) = %q, %v; want %q", i, want, got, err, std)
		}
	}
}

func TestParseStringEscapes(t *testing.T) {
	for _, in := range []string{
		`"\u00e9\u65e5"`, `"\ud83c\udf89"`, `"\ud83c"`, `"\ud83cx"`, `"\udf89\ud83c"`,
		`"\ud83c\u0041"`, `"\/\b\f"`, "\"raw \xff byte\"", `"\uD83C\uDF89"`,
	} {
		var std string
		if err := json.Unmarshal([]byte(in), &std); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		p := parser{b: []byte(in), d: &Decoder{}}
		got, err := p.str()
		if err != nil || string(got) != std {
			t.Errorf("str(%s) = %q, %v; want %q", in, got, err, std)
		}
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name, in string
		want     Event
		err      error
	}{
		{"minimal", `{"v":1}`, Event{V: 1}, nil},
		{"whitespace and newline", " \t{ \"v\" : 1 , \"seq\" : 3 }\r\n", Event{V: 1, Seq: 3}, nil},
		{"unknown fields skipped", `{"x":[1,{"y":null},"s",true,false,-1.5e3],"v":1,"z":{}}`, Event{V: 1}, nil},
		{"null is absent", `{"v":1,"share_id":null,"cleanup":null,"reason":null,"time":null,"slot":null}`, Event{V: 1}, nil},
		{"offset time", `{"v":1,"time":"2026-11-29T11:15:29.123456+01:00"}`, Event{V: 1, Time: t0}, nil},
		{"cleanup", `{"v":1,"cleanup":{"files_removed":2,"extra":"x","fds_closed":3}}`,
			Event{V: 1, Cleanup: &Cleanup{FDsClosed: 3, FilesRemoved: 2}}, nil},
		{"share id zero", `{"v":1,"share_id":0}`, Event{V: 1, ShareID: ptr(int64(0))}, nil},
		{"missing v", `{"seq":1}`, Event{}, ErrVersion},
		{"v 2", `{"v":2}`, Event{}, ErrVersion},
		{"empty", ``, Event{}, ErrSyntax},
		{"not an object", `[1]`, Event{}, ErrSyntax},
		{"trailing data", `{"v":1}{"v":1}`, Event{}, ErrSyntax},
		{"truncated", `{"v":1,"boot":"ab`, Event{}, ErrSyntax},
		{"trailing comma", `{"v":1,}`, Event{}, ErrSyntax},
		{"string for int", `{"v":"1"}`, Event{}, ErrField},
		{"fraction for int", `{"v":1,"slot":1.5}`, Event{}, ErrField},
		{"exponent for int", `{"v":1,"slot":1e2}`, Event{}, ErrField},
		{"negative seq", `{"v":1,"seq":-1}`, Event{}, ErrField},
		{"seq overflow", `{"v":1,"seq":18446744073709551616}`, Event{}, ErrField},
		{"int64 overflow", `{"v":1,"elapsed_us":9223372036854775808}`, Event{}, ErrField},
		{"leading zero", `{"v":01}`, Event{}, ErrSyntax},
		{"number for string", `{"v":1,"boot":1}`, Event{}, ErrField},
		{"bad time", `{"v":1,"time":"yesterday"}`, Event{}, ErrField},
		{"bad month", `{"v":1,"time":"2026-13-01T00:00:00Z"}`, Event{}, ErrField},
		{"control char in string", "{\"v\":1,\"boot\":\"a\nb\"}", Event{}, ErrSyntax},
		{"bad escape", `{"v":1,"boot":"\x"}`, Event{}, ErrSyntax},
		{"deep nesting", `{"v":1,"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, Event{}, ErrSyntax},
		{"bad literal", `{"v":1,"x":nul}`, Event{}, ErrSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.in))
			if !errors.Is(err, tt.err) {
				t.Fatalf("Parse(%s) error = %v, want %v", tt.in, err, tt.err)
			}
			if err == nil && !eventsEqual(got, tt.want) {
				t.Fatalf("Parse(%s) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestDecoderReusesBootAndNode(t *testing.T) {
	var d Decoder
	line := []byte(`{"v":1,"boot":"b1","node":"n1"}`)
	a, err := d.Parse(line)
	if err != nil {
		t.Fatal(err)
	}
	copy(line[len(`{"v":1,"boot":"`):], "xx") // Parse must not alias its input
	b, err := d.Parse([]byte(`{"v":1,"boot":"b1","node":"n1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if a.Boot != "b1" || b.Boot != "b1" || a.Node != "n1" {
		t.Fatalf("got %q %q %q", a.Boot, b.Boot, a.Node)
	}
	again := []byte(`{"v":1,"boot":"b1","node":"n1","route":"file"}`)
	if allocs := testing.AllocsPerRun(100, func() { _, _ = d.Parse(again) }); allocs != 0 {
		t.Errorf("Parse of repeated boot/node/enum allocates %v times", allocs)
	}
}

// FuzzRoundTrip builds an event from fuzzed fields: AppendJSON must equal
// encoding/json's Marshal byte for byte, and Parse must give the event back.
func FuzzRoundTrip(f *testing.F) {
	f.Add("0123456789abcdef", uint64(1), int64(1764411329123456789), "n1", "r-1", 0, "shared", "adopt",
		"prefilled", "adopted", int64(10), int64(3), 512, "", "", true, true)
	f.Add("b", uint64(0), int64(0), "", "", -1, "", "decoder.ready", "", "", int64(0), int64(-1), 0,
		"reason \"x\" <\u2028>\xff", "adopt", false, false)
	f.Fuzz(func(t *testing.T, boot string, seq uint64, unixNano int64, node, req string, slot int,
		route, ev, from, to string, elapsed, shareID int64, nTokens int, reason, step string,
		withPtrs, withCleanup bool) {
		e := Event{V: Version, Boot: boot, Seq: seq, Time: time.Unix(0, unixNano).UTC(), Node: node,
			RequestID: req, Slot: slot, Route: route, Event: ev, From: from, To: to, ElapsedUS: elapsed,
			NTokens: nTokens, NFDs: nTokens / 7, BytesMapped: shareID * 3, Reason: reason, Step: step,
			HTTPStatus: slot % 600}
		if withPtrs {
			e.ShareID = &shareID
			e.ProviderExit = ptr(int(elapsed % 256))
		}
		if withCleanup {
			e.Cleanup = &Cleanup{FDsClosed: slot, FilesRemoved: nTokens}
			e.Decision, e.DecisionBasis = step, reason
			e.PredictedDecoder, e.PredictedHandoff = elapsed, shareID
			e.TokensHeld, e.TokensPrefill = slot, nTokens
		}
		got := e.AppendJSON(nil)
		want, err := json.Marshal(&e)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("AppendJSON:\n got %s\nwant %s", got, want)
		}
		back, err := Parse(got)
		if err != nil {
			t.Fatalf("Parse(%s): %v", got, err)
		}
		var std Event
		if err := json.Unmarshal(got, &std); err != nil {
			t.Fatal(err)
		}
		if !eventsEqual(back, std) {
			t.Fatalf("Parse differs from encoding/json:\n got %+v\nwant %+v", back, std)
		}
		// Strings with invalid UTF-8 come back with U+FFFD; everything else is exact.
		valid := true
		for _, s := range []string{boot, node, req, route, ev, from, to, reason, step} {
			valid = valid && utf8.ValidString(s)
		}
		if valid && !eventsEqual(back, e) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", back, e)
		}
	})
}

// FuzzParse feeds arbitrary bytes to Parse: no panic; whatever it accepts is
// valid JSON that encoding/json reads to the same event, and re-encoding is a
// fixed point.
func FuzzParse(f *testing.F) {
	for _, e := range sampleEvents() {
		f.Add(e.AppendJSON(nil))
	}
	f.Add([]byte(`{"v":1,"x":[{"a":"\ud83c\udf89"}],"time":"2026-11-29T11:15:29+01:00"}` + "\n"))
	f.Add([]byte(`{"v":1,"seq":-0}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := Parse(line)
		if err != nil {
			return
		}
		if !json.Valid(line) {
			t.Fatalf("Parse accepted invalid JSON %q", line)
		}
		out := e.AppendJSON(nil)
		again, err := Parse(out)
		if err != nil {
			// Parse accepts years encoding/json cannot write back (RFC 3339 offsets
			// pushing the UTC year out of 0000-9999).
			if y := e.Time.UTC().Year(); y < 0 || y > 9999 {
				return
			}
			t.Fatalf("re-Parse(%s): %v", out, err)
		}
		if !eventsEqual(e, again) {
			t.Fatalf("not a fixed point:\n%+v\n%+v", e, again)
		}
	})
}

func BenchmarkAppendJSON(b *testing.B) {
	e := sampleEvents()["all optional"]
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = e.AppendJSON(buf[:0])
	}
	b.SetBytes(int64(len(buf)))
}

func BenchmarkMarshalStdlib(b *testing.B) {
	e := sampleEvents()["all optional"]
	b.ReportAllocs()
	for b.Loop() {
		_, _ = json.Marshal(&e)
	}
}

func BenchmarkParse(b *testing.B) {
	e := sampleEvents()["all optional"]
	line := e.AppendJSON(nil)
	var d Decoder
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, err := d.Parse(line); err != nil {
			b.Fatal(err)
		}
	}
}

// hasFoldedKey reports whether the object in line has a key that
// encoding/json would match case-insensitively to a field but Parse would
// not (Parse matches keys exactly), at the top level or in cleanup.
func hasFoldedKey(line []byte) bool {
	var top map[string]json.RawMessage
	if json.Unmarshal(line, &top) != nil {
		return false
	}
	folded := func(m map[string]json.RawMessage, names []string) bool {
		for k := range m {
			for _, n := range names {
				if k != n && strings.EqualFold(k, n) {
					return true
				}
			}
		}
		return false
	}
	if folded(top, keyNames[:]) {
		return true
	}
	for k, v := range top {
		if strings.EqualFold(k, "cleanup") {
			var c map[string]json.RawMessage
			if json.Unmarshal(v, &c) == nil && folded(c, []string{"fds_closed", "files_removed"}) {
				return true
			}
		}
	}
	return false
}

// FuzzParseMatchesEncodingJSON: on any input without case-folded keys,
// Parse and encoding/json (plus the version check) agree on success and on
// the event.
func FuzzParseMatchesEncodingJSON(f *testing.F) {
	for _, e := range sampleEvents() {
		f.Add(e.AppendJSON(nil))
	}
	f.Add([]byte(`{"v":1,"\u0076":1,"cleanup":{"fds_closed":2},"cleanup":null,"x":{"y":[1,2]}}`))
	f.Add([]byte(`{"v":1,"time":"2026-01-02T03:04:05.5-07:00","seq":-0}`))
	f.Add([]byte(`{"v":1,"share_id":1,"share_id":null,"provider_exit":-3}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		if hasFoldedKey(line) {
			return
		}
		got, err := Parse(line)
		var std Event
		stdErr := json.Unmarshal(line, &std)
		if stdErr == nil && std.V != Version {
			stdErr = ErrVersion
		}
		if (err == nil) != (stdErr == nil) {
			t.Fatalf("%q: Parse error %v, encoding/json error %v", line, err, stdErr)
		}
		if err == nil && !eventsEqual(got, std) {
			t.Fatalf("%q:\nParse         %+v\nencoding/json %+v", line, got, std)
		}
	})
}

// BenchmarkParseTypical parses an adopt event as the daemon writes it.
func BenchmarkParseTypical(b *testing.B) {
	e := sampleEvents()["minimal"]
	e.Event, e.From, e.To, e.ShareID, e.NTokens = "adopt", "prefilled", "adopted", ptr(int64(7)), 512
	e.Cleanup = &Cleanup{FDsClosed: 3, FilesRemoved: 3}
	line := append(e.AppendJSON(nil), '\n')
	var d Decoder
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, err := d.Parse(line); err != nil {
			b.Fatal(err)
		}
	}
}
