package watch

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ptr[T any](v T) *T { return &v }

var t0 = time.Date(2025, 3, 1, 14, 7, 9, 123456789, time.UTC)

// lineCases are the events of the golden table.
var lineCases = []struct {
	name string
	e    event.Event
}{
	{"listen", event.Event{Time: t0, Node: "node-a", RequestID: "r1", Route: "shared", Event: "listen", From: "received", To: "listening", ElapsedUS: 12}},
	{"share", event.Event{Time: t0, Node: "node-a", RequestID: "r1", Route: "shared", Event: "share", From: "listening", To: "shared", ElapsedUS: 1500, ShareID: ptr(int64(7)), NFDs: 56}},
	{"adopt", event.Event{Time: t0, Node: "node-a", RequestID: "r1", Route: "shared", Event: "adopt", From: "prefilled", To: "adopted", ElapsedUS: 234567, ShareID: ptr(int64(7)), NTokens: 512, NFDs: 56, Cleanup: &event.Cleanup{FDsClosed: 56, FilesRemoved: 3}}},
	{"restore", event.Event{Time: t0, Node: "node-b", RequestID: "r2", Route: "file", Event: "restore", From: "prefilled", To: "restored", NTokens: 100, ElapsedUS: 9000}},
	{"done", event.Event{Time: t0, Node: "node-a", RequestID: "r1", Route: "shared", Event: "finish", From: "forwarding", To: "done", ElapsedUS: 2_000_000, HTTPStatus: 200}},
	{"fallback provider", event.Event{Time: t0, Node: "node-a", RequestID: "r3", Route: "shared", Event: "fallback", From: "prefilled", To: "fallback", Step: "prefill", Reason: "the provider exited with status 1: out of memory", ProviderExit: ptr(1), ElapsedUS: 800}},
	{"fallback 501", event.Event{Time: t0, Node: "node-a", RequestID: "r4", Route: "shared", Event: "fallback", From: "listening", To: "fallback", Step: "share", Reason: "the decoder has no shareable region (501)", HTTPStatus: 501, ElapsedUS: 300}},
	{"provider exit 0 shown", event.Event{Time: t0, Node: "node-a", RequestID: "r5", Route: "file", Event: "prefill", From: "received", To: "prefilled", ProviderExit: ptr(0), ElapsedUS: 40}},
	{"failed", event.Event{Time: t0, Node: "node-a", RequestID: "r6", Route: "plain", Event: "fail", From: "forwarding", To: "failed", Reason: "client went away", HTTPStatus: 502, ElapsedUS: 5}},
	{"decoder lifecycle", event.Event{Time: t0, Node: "node-a", Event: "decoder.ready"}},
	{"skip decision", event.Event{Time: t0, Node: "node-a", RequestID: "r9", Route: "plain", Event: "forward", From: "received", To: "forwarding", ElapsedUS: 3,
		Decision: "skip", DecisionBasis: "model", PredictedDecoder: 4200, PredictedHandoff: 21500, TokensHeld: 300, TokensPrefill: 12}},
	{"incremental handoff", event.Event{Time: t0, Node: "node-a", RequestID: "r10", Route: "shared", Event: "listen", From: "received", To: "listening", ElapsedUS: 9,
		Decision: "handoff", DecisionBasis: "held", TokensHeld: 900, TokensPrefill: 140}},
	{"hostile strings", event.Event{Time: t0, Node: "evil\x1b[2Jnode", RequestID: "r 7\n", Route: "sha\"red", Event: "x", From: "", To: "adopted", Reason: "a\x1b[31mb\r\nc"}},
	{"non-ascii", event.Event{Time: t0, Node: "nœud", RequestID: "r8", Route: "shared", Event: "adopt", From: "prefilled", To: "adopted", ElapsedUS: 1}},
}

func TestLineGolden(t *testing.T) {
	var out bytes.Buffer
	for _, tc := range lineCases {
		out.WriteString("# " + tc.name + "\n")
		out.Write(AppendLine(nil, &tc.e, false, time.UTC))
		out.WriteString(strconv.Quote(string(AppendLine(nil, &tc.e, true, time.UTC))) + "\n")
	}
	path := filepath.Join("testdata", "lines.golden")
	if *update {
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update once)", err)
	}
	if got := out.String(); got != string(want) {
		t.Errorf("lines differ from %s (go test -update to accept):\n%s", path, got)
	}
}

func TestLineIsOneSafeLine(t *testing.T) {
	for _, tc := range lineCases {
		checkLine(t, AppendLine(nil, &tc.e, false, nil), false)
		checkLine(t, AppendLine(nil, &tc.e, true, nil), true)
	}
}

// checkLine: exactly one line, no control bytes but our own colour codes.
func checkLine(t *testing.T, b []byte, colour bool) {
	t.Helper()
	if len(b) == 0 || b[len(b)-1] != '\n' {
		t.Fatalf("line %q does not end in a newline", b)
	}
	s := string(b[:len(b)-1])
	if colour {
		for _, c := range []string{ansiGreen, ansiRed, ansiYellow, ansiReset} {
			s = strings.ReplaceAll(s, c, "")
		}
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			t.Fatalf("line %q has control byte %#x at %d", b, s[i], i)
		}
	}
}

func TestFailedFilter(t *testing.T) {
	tests := []struct {
		e    event.Event
		want bool
	}{
		{event.Event{To: "fallback", Reason: "x"}, true},
		{event.Event{To: "fallback"}, true},
		{event.Event{To: "failed"}, true},
		{event.Event{To: "done", Reason: "odd but carries a reason"}, true},
		{event.Event{To: "adopted"}, false},
		{event.Event{To: "done"}, false},
	}
	for _, tt := range tests {
		if got := Failed(&tt.e); got != tt.want {
			t.Errorf("Failed(to=%s reason=%q) = %v", tt.e.To, tt.e.Reason, got)
		}
	}
}

func TestPrinterModes(t *testing.T) {
	adopt := lineCases[2].e
	fb := lineCases[5].e
	payload := func(e event.Event) []byte {
		e.V = event.Version
		return e.AppendJSON(nil)
	}
	tests := []struct {
		name string
		p    Printer
		msgs [][]byte
		want string
	}{
		{"lines", Printer{}, [][]byte{payload(adopt), payload(fb)},
			string(AppendLine(nil, &adopt, false, nil)) + string(AppendLine(nil, &fb, false, nil))},
		{"failed only", Printer{Failed: true}, [][]byte{payload(adopt), payload(fb)},
			string(AppendLine(nil, &fb, false, nil))},
		{"json raw", Printer{JSON: true}, [][]byte{payload(adopt), payload(fb)},
			string(payload(adopt)) + "\n" + string(payload(fb)) + "\n"},
		{"json failed", Printer{JSON: true, Failed: true}, [][]byte{payload(adopt), payload(fb)},
			string(payload(fb)) + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			tt.p.W = &out
			for _, m := range tt.msgs {
				if err := tt.p.Message("onebit.node-a.handoff.x", m); err != nil {
					t.Fatal(err)
				}
			}
			if out.String() != tt.want {
				t.Fatalf("got:\n%s\nwant:\n%s", out.String(), tt.want)
			}
		})
	}
	p := Printer{W: &bytes.Buffer{}}
	for _, bad := range []string{"", "not json", `{"v":99}`, `[1,2]`} {
		if err := p.Message("s", []byte(bad)); !errors.Is(err, ErrPayload) {
			t.Errorf("Message(%q) = %v, want ErrPayload", bad, err)
		}
	}
}

func FuzzMessage(f *testing.F) {
	for _, tc := range lineCases {
		e := tc.e
		e.V = event.Version
		f.Add(e.AppendJSON(nil), false)
	}
	f.Add([]byte(`{"v":1,"node":"\u001b[2J","to":"done"}`), true)
	f.Add([]byte(`{"v":1`), false)
	f.Fuzz(func(t *testing.T, data []byte, colour bool) {
		var out bytes.Buffer
		p := Printer{W: &out, Colour: colour}
		if err := p.Message("s", data); err != nil {
			if !errors.Is(err, ErrPayload) {
				t.Fatalf("unexpected error %v", err)
			}
			if out.Len() != 0 {
				t.Fatalf("printed %q for a bad payload", out.Bytes())
			}
			return
		}
		checkLine(t, out.Bytes(), colour)
	})
}

func TestRunAgainstServer(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	var out, errw obtest.Buffer
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, nc, SubjectAll, &Printer{W: &out}, &errw, func(string) { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run returned before subscribing: %v", err)
	}
	var want strings.Builder
	for _, tc := range lineCases[:6] {
		e := tc.e
		e.V = event.Version
		if err := pub.Publish("onebit.node-a.handoff."+e.To, e.AppendJSON(nil)); err != nil {
			t.Fatal(err)
		}
		want.Write(AppendLine(nil, &e, false, nil))
	}
	if err := pub.Publish("onebit.node-a.junk", []byte("junk")); err != nil {
		t.Fatal(err)
	}
	obtest.WaitFor(t, 5*time.Second, "lines", func() bool {
		return out.String() == want.String() && strings.Contains(errw.String(), "not an event")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
}
