package schemas

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/machine"
)

func ptr[T any](v T) *T { return &v }

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 123000000, time.UTC)

func stamped(e event.Event) event.Event {
	e.V, e.Boot, e.Seq, e.Node = event.Version, "0123456789abcdef", 42, "node-a"
	if e.Time.IsZero() {
		e.Time = t0
	}
	return e
}

func eventJSON(e event.Event) string { return string(e.AppendJSON(nil)) }

// edit marshals e, applies f to the generic object and returns the JSON.
func edit(e event.Event, f func(m map[string]any)) string {
	var m map[string]any
	if err := json.Unmarshal(e.AppendJSON(nil), &m); err != nil {
		panic(err)
	}
	f(m)
	b, _ := json.Marshal(m)
	return string(b)
}

func TestEventSchema(t *testing.T) {
	adopt := stamped(event.Event{RequestID: "r-1", Slot: 1, Route: "shared", Event: "adopt", From: "prefilled",
		To: "adopted", ElapsedUS: 900, ShareID: ptr(int64(0)), NTokens: 512,
		Cleanup: &event.Cleanup{FDsClosed: 3, FilesRemoved: 3}})
	fallback := stamped(event.Event{RequestID: "r-2", Route: "fallback", Event: "fallback", From: "shared",
		To: "fallback", Reason: "provider exited with status 1", Step: "provider", ProviderExit: ptr(1),
		Cleanup: &event.Cleanup{FDsClosed: 3, FilesRemoved: 2}})
	lifecycle := stamped(event.Event{Event: "decoder.exited", Reason: "signal: killed"})
	shutdown := stamped(event.Event{Event: event.Shutdown, InFlight: ptr(0)})
	marker := stamped(event.Event{Event: event.LostEvent, Reason: "no space left on device",
		Lost: &event.Lost{Events: 4979, FirstSeq: 1023, LastSeq: 6001}})
	marker.Seq = 0
	tests := []struct {
		name  string
		doc   string
		valid bool
	}{
		{"adopt", eventJSON(adopt), true},
		{"fallback", eventJSON(fallback), true},
		{"decoder lifecycle", eventJSON(lifecycle), true},
		{"plain forward", eventJSON(stamped(event.Event{RequestID: "r", Route: "plain", Event: "forward", From: "received", To: "forwarding"})), true},
		{"fail with status", eventJSON(stamped(event.Event{RequestID: "r", Route: "file", Event: "fail", From: "forwarding", To: "failed", HTTPStatus: 502, Reason: "decoder closed the connection"})), true},
		{"offset time", edit(adopt, func(m map[string]any) { m["time"] = "2026-11-29T11:00:00+01:00" }), true},
		{"missing seq", edit(adopt, func(m map[string]any) { delete(m, "seq") }), false},
		{"unknown field", edit(adopt, func(m map[string]any) { m["colour"] = "red" }), false},
		{"version 2", edit(adopt, func(m map[string]any) { m["v"] = 2 }), false},
		{"seq 0", edit(adopt, func(m map[string]any) { m["seq"] = 0 }), false},
		{"bad time", edit(adopt, func(m map[string]any) { m["time"] = "yesterday" }), false},
		{"bad route", edit(adopt, func(m map[string]any) { m["route"] = "teleport" }), false},
		{"bad event", edit(adopt, func(m map[string]any) { m["event"] = "jump" }), false},
		{"bad state", edit(adopt, func(m map[string]any) { m["to"] = "limbo" }), false},
		{"empty state on a request", edit(adopt, func(m map[string]any) { m["from"] = "" }), false},
		{"empty request id", edit(adopt, func(m map[string]any) { m["request_id"] = "" }), false},
		{"string slot", edit(adopt, func(m map[string]any) { m["slot"] = "1" }), false},
		{"adopt without cleanup", edit(adopt, func(m map[string]any) { delete(m, "cleanup") }), false},
		{"adopt without share id", edit(adopt, func(m map[string]any) { delete(m, "share_id") }), false},
		{"cleanup missing a count", edit(adopt, func(m map[string]any) { m["cleanup"] = map[string]any{"fds_closed": 1} }), false},
		{"fallback without reason", edit(fallback, func(m map[string]any) { delete(m, "reason") }), false},
		{"empty reason", edit(fallback, func(m map[string]any) { m["reason"] = "" }), false},
		{"lifecycle with a request", edit(lifecycle, func(m map[string]any) { m["request_id"] = "r-1" }), false},
		{"lifecycle with states", edit(lifecycle, func(m map[string]any) { m["to"] = "done" }), false},
		{"http status 42", edit(adopt, func(m map[string]any) { m["http_status"] = 42 }), false},
		{"not an object", `[1]`, false},
		{"shutdown line", eventJSON(shutdown), true},
		{"shutdown without in_flight", edit(shutdown, func(m map[string]any) { delete(m, "in_flight") }), false},
		{"shutdown with a request", edit(shutdown, func(m map[string]any) { m["request_id"] = "r-1" }), false},
		{"in_flight on a transition", edit(adopt, func(m map[string]any) { m["in_flight"] = 0 }), false},
		{"loss marker", eventJSON(marker), true},
		{"loss marker with a seq", edit(marker, func(m map[string]any) { m["seq"] = 3 }), false},
		{"loss marker without lost", edit(marker, func(m map[string]any) { delete(m, "lost") }), false},
		{"loss marker without reason", edit(marker, func(m map[string]any) { delete(m, "reason") }), false},
		{"lost on a transition", edit(adopt, func(m map[string]any) { m["lost"] = map[string]any{"events": 1, "first_seq": 1, "last_seq": 1} }), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(KindEvent, []byte(tt.doc))
			if (err == nil) != tt.valid {
				t.Fatalf("Validate(%s) = %v, want valid=%v", tt.doc, err, tt.valid)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
		})
	}
}

func TestShareHeaderSchema(t *testing.T) {
	h := fdpass.Header{Version: fdpass.HeaderVersion, LayoutHash: "9f86d081884c7d65", NCtx: 20480, NLayer: 28,
		KVTypeK: "f16", KVTypeV: "f16", FlashAttn: true, NBatch: 2048, NUbatch: 512,
		Regions: []fdpass.Region{
			{FDIndex: 0, Offset: 0, Size: 1 << 20, Kind: "k", Layer: 0, CellStride: 1024},
			{FDIndex: 0, Offset: 1 << 20, Size: 1 << 20, Kind: "v", Layer: 0, CellStride: 1024},
		}}
	with := func(f func(h *fdpass.Header)) string {
		c := h
		c.Regions = slices.Clone(h.Regions)
		f(&c)
		b, _ := json.Marshal(c)
		return string(b)
	}
	tests := []struct {
		name  string
		doc   string
		valid bool
	}{
		{"valid", with(func(*fdpass.Header) {}), true},
		{"upper-case hash", with(func(h *fdpass.Header) { h.LayoutHash = "ABCDEF" }), true},
		{"version 2", with(func(h *fdpass.Header) { h.Version = 2 }), false},
		{"empty hash", with(func(h *fdpass.Header) { h.LayoutHash = "" }), false},
		{"non-hex hash", with(func(h *fdpass.Header) { h.LayoutHash = "xyz" }), false},
		{"long hash", with(func(h *fdpass.Header) { h.LayoutHash = strings.Repeat("a", 129) }), false},
		{"negative n_ctx", with(func(h *fdpass.Header) { h.NCtx = -1 }), false},
		{"no regions", with(func(h *fdpass.Header) { h.Regions = []fdpass.Region{} }), false},
		{"null regions", with(func(h *fdpass.Header) { h.Regions = nil }), false},
		{"bad kind", with(func(h *fdpass.Header) { h.Regions[0].Kind = "q" }), false},
		{"unaligned offset", with(func(h *fdpass.Header) { h.Regions[1].Offset = 100 }), false},
		{"zero size", with(func(h *fdpass.Header) { h.Regions[0].Size = 0 }), false},
		{"zero stride", with(func(h *fdpass.Header) { h.Regions[0].CellStride = 0 }), false},
		{"negative fd index", with(func(h *fdpass.Header) { h.Regions[0].FDIndex = -1 }), false},
		{"unknown field", `{"version":1,"layout_hash":"ab","n_ctx":1,"n_layer":1,"kv_type_k":"f16","kv_type_v":"f16","flash_attn":false,"n_batch":1,"n_ubatch":1,"regions":[{"fd_index":0,"offset":0,"size":4096,"kind":"k","layer":0,"cell_stride":1}],"extra":1}`, false},
		{"missing field", `{"version":1,"layout_hash":"ab","regions":[{"fd_index":0,"offset":0,"size":4096,"kind":"k","layer":0,"cell_stride":1}]}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(KindShareHeader, []byte(tt.doc))
			if (err == nil) != tt.valid {
				t.Fatalf("Validate(%s) = %v, want valid=%v", tt.doc, err, tt.valid)
			}
		})
	}
}

// TestShareHeaderFields keeps the schema's properties equal to the JSON
// names of fdpass.Header and fdpass.Region.
func TestShareHeaderFields(t *testing.T) {
	raw, err := FS().ReadFile("share-header.json")
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Properties map[string]any
		Required   []string
		Defs       map[string]struct {
			Properties map[string]any
			Required   []string
		} `json:"$defs"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	keys := func(v any) []string {
		var m map[string]any
		b, _ := json.Marshal(v)
		json.Unmarshal(b, &m)
		var out []string
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	sorted := func(m map[string]any) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	if got, want := sorted(s.Properties), keys(fdpass.Header{}); !slices.Equal(got, want) {
		t.Errorf("header properties %v, fdpass.Header fields %v", got, want)
	}
	if got, want := sorted(s.Defs["region"].Properties), keys(fdpass.Region{}); !slices.Equal(got, want) {
		t.Errorf("region properties %v, fdpass.Region fields %v", got, want)
	}
}

func TestTokensSchema(t *testing.T) {
	tests := []struct {
		doc   string
		valid bool
	}{
		{`[1]`, true}, {`[0, 1, 151643]`, true},
		{`[]`, false}, {`[-1]`, false}, {`[1.5]`, false}, {`["1"]`, false}, {`{"tokens":[1]}`, false}, {`null`, false},
	}
	for _, tt := range tests {
		if err := Validate(KindTokens, []byte(tt.doc)); (err == nil) != tt.valid {
			t.Errorf("Validate(%s) = %v, want valid=%v", tt.doc, err, tt.valid)
		}
	}
}

func TestValidateErrors(t *testing.T) {
	if err := Validate("nope", []byte(`{}`)); !errors.Is(err, ErrUnknownKind) {
		t.Errorf("unknown kind: %v", err)
	}
	for _, doc := range []string{``, `{`, `[1] [2]`, `nul`} {
		if err := Validate(KindTokens, []byte(doc)); !errors.Is(err, ErrNotJSON) && !errors.Is(err, ErrInvalid) {
			t.Errorf("Validate(%q) = %v", doc, err)
		}
	}
	for _, kind := range Kinds {
		if _, err := Schema(kind); err != nil {
			t.Errorf("Schema(%s): %v", kind, err)
		}
	}
}

// TestEventEnumsMatchMachine keeps the schema's enums equal to the machine's
// constants.
func TestEventEnumsMatchMachine(t *testing.T) {
	raw, err := FS().ReadFile("event.json")
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Properties map[string]struct {
			Enum []string
		}
		Defs map[string]struct{ Enum []string } `json:"$defs"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	var events, states []string
	for _, tr := range machine.Transitions {
		events = append(events, string(tr.Event))
		states = append(states, string(tr.To))
		for _, f := range tr.From {
			states = append(states, string(f))
		}
	}
	events = append(events, "decoder.starting", "decoder.ready", "decoder.exited", event.Shutdown, event.LostEvent)
	states = append(states, "")
	routes := []string{string(machine.RoutePlain), string(machine.RouteFile), string(machine.RouteShared), string(machine.RouteFallback), ""}
	norm := func(v []string) []string { v = slices.Clone(v); slices.Sort(v); return slices.Compact(v) }
	for _, c := range []struct {
		name      string
		got, want []string
	}{
		{"event", s.Properties["event"].Enum, events},
		{"state", s.Defs["state"].Enum, states},
		{"route", s.Properties["route"].Enum, routes},
	} {
		if !slices.Equal(norm(c.got), norm(c.want)) {
			t.Errorf("%s enum %v, machine has %v", c.name, norm(c.got), norm(c.want))
		}
	}
}

// TestRandomWalkEventsValidate drives real machine.Machines through random
// legal walks of machine.Transitions, with the attributes the handoff puts
// on each event, and validates every event emitted.
func TestRandomWalkEventsValidate(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	var lines [][]byte
	rec := event.NewRecorder("node-a", event.SinkFunc(func(e *event.Event) {
		lines = append(lines, e.AppendJSON(nil))
	}))
	rec.Emit(&event.Event{Event: "decoder.starting"})
	rec.Emit(&event.Event{Event: "decoder.ready"})
	routes := []machine.Route{machine.RoutePlain, machine.RouteFile, machine.RouteShared}
	for i := range 500 {
		m := machine.New("r-"+strconv.Itoa(i), i%4, routes[rng.IntN(len(routes))], rec, nil)
		for !machine.Terminal(m.State()) {
			var choices []machine.Transition
			for _, tr := range machine.Transitions {
				if slices.Contains(tr.From, m.State()) {
					choices = append(choices, tr)
				}
			}
			tr := choices[rng.IntN(len(choices))]
			var a machine.Attrs
			switch tr.Event {
			case machine.EvShare:
				a = machine.Attrs{ShareID: ptr(int64(i)), NFDs: 3, BytesMapped: 3 << 20}
			case machine.EvPrefill:
				a = machine.Attrs{NTokens: 100 + i, ProviderExit: ptr(0)}
			case machine.EvAdopt:
				a = machine.Attrs{ShareID: ptr(int64(i)), NTokens: 100 + i, Cleanup: &event.Cleanup{FDsClosed: 3, FilesRemoved: 3}}
			case machine.EvRestore:
				a = machine.Attrs{NTokens: 100 + i, Cleanup: &event.Cleanup{FilesRemoved: 2}}
			case machine.EvFallback:
				a = machine.Attrs{Reason: "the decoder answered 501: no shareable region", Step: machine.StepShare,
					HTTPStatus: 501, Cleanup: &event.Cleanup{}}
			case machine.EvFinish:
				a = machine.Attrs{HTTPStatus: 200}
			case machine.EvFail:
				a = machine.Attrs{HTTPStatus: 502, Reason: "decoder closed the connection"}
			}
			if err := m.Fire(tr.Event, a); err != nil {
				t.Fatal(err)
			}
		}
	}
	rec.Emit(&event.Event{Event: "decoder.exited", Reason: "exit status 0"})
	rec.Shutdown(0)
	for i, line := range lines {
		if err := Validate(KindEvent, line); err != nil {
			t.Fatalf("event %d: %s: %v", i, line, err)
		}
	}
	if len(lines) < 1500 {
		t.Fatalf("only %d events", len(lines))
	}
}

func BenchmarkValidateEvent(b *testing.B) {
	e := stamped(event.Event{RequestID: "r-1", Slot: 1, Route: "shared", Event: "adopt", From: "prefilled",
		To: "adopted", ShareID: ptr(int64(3)), Cleanup: &event.Cleanup{FDsClosed: 3, FilesRemoved: 3}})
	line := e.AppendJSON(nil)
	b.ReportAllocs()
	for b.Loop() {
		if err := Validate(KindEvent, line); err != nil {
			b.Fatal(err)
		}
	}
}
