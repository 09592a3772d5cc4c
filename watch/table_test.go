package watch

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
)

// tableEvents: two nodes, a shared request that is adopted, a file request,
// a shared request that falls back (its reason in red), a decoder restart,
// a request first seen mid-way, and hostile strings.
func tableEvents() []event.Event {
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	return []event.Event{
		{Time: at(0), Node: "node-a", Event: "decoder.ready"},
		{Time: at(1), Node: "node-a", Boot: "b1", RequestID: "r1", Route: "shared", Event: "listen", From: "received", To: "listening", ElapsedUS: 12},
		{Time: at(2), Node: "node-b", Boot: "b2", RequestID: "r2", Route: "file", Event: "prefill", From: "received", To: "prefilled", ElapsedUS: 40_000, NTokens: 300},
		{Time: at(3), Node: "node-a", Boot: "b1", RequestID: "r1", Route: "shared", Event: "share", From: "listening", To: "shared", ElapsedUS: 900, ShareID: ptr(int64(4)), NFDs: 3},
		{Time: at(4), Node: "node-a", Boot: "b1", RequestID: "r3", Route: "shared", Event: "listen", From: "received", To: "listening", ElapsedUS: 20},
		{Time: at(5), Node: "node-a", Boot: "b1", RequestID: "r1", Route: "shared", Event: "prefill", From: "shared", To: "prefilled", ElapsedUS: 50_000, NTokens: 512},
		{Time: at(6), Node: "node-a", Boot: "b1", RequestID: "r3", Route: "fallback", Event: "fallback", From: "listening", To: "fallback", ElapsedUS: 700,
			Step: "share", HTTPStatus: 501, Reason: "the decoder has no shareable region (501)"},
		{Time: at(7), Node: "node-a", Boot: "b1", RequestID: "r1", Route: "shared", Event: "adopt", From: "prefilled", To: "adopted", ElapsedUS: 51_000},
		{Time: at(8), Node: "node-b", Boot: "b2", RequestID: "r2", Route: "file", Event: "restore", From: "prefilled", To: "restored", ElapsedUS: 52_500},
		{Time: at(9), Node: "node-b", Event: "decoder.exited", Reason: "signal: killed"},
		{Time: at(10), Node: "node-a", Boot: "b1", RequestID: "r3", Route: "fallback", Event: "forward", From: "fallback", To: "forwarding", ElapsedUS: 800},
		{Time: at(11), Node: "node-a", Boot: "b1", RequestID: "r1", Route: "shared", Event: "forward", From: "adopted", To: "forwarding", ElapsedUS: 52_000},
		{Time: at(12), Node: "node-a", Boot: "b1", RequestID: "r1", Route: "shared", Event: "finish", From: "forwarding", To: "done", ElapsedUS: 2_052_000, HTTPStatus: 200},
		{Time: at(13), Node: "node-b", Boot: "b2", RequestID: "r-mid", Route: "shared", Event: "adopt", From: "prefilled", To: "adopted", ElapsedUS: 9_000},
		{Time: at(14), Node: "evil\x1b[2J", Boot: "b9", RequestID: "r\n7", Route: "sha\"red", Event: "fail", From: "forwarding", To: "failed",
			Reason: "a\x1b[31mb\r\nc", ElapsedUS: 5},
	}
}

// TestTableGolden: the frames after each event, as the terminal gets them
// (quoted), and the last frame plain.
func TestTableGolden(t *testing.T) {
	tb := Table{Rows: 4, Width: 150}
	var out bytes.Buffer
	for i, e := range tableEvents() {
		tb.Add(&e)
		out.WriteString("# after event " + strconv.Itoa(i) + " (" + e.Event + ")\n")
		for _, l := range strings.SplitAfter(string(tb.Render(nil, true)), "\n") {
			if l != "" {
				out.WriteString(strconv.Quote(l) + "\n")
			}
		}
	}
	plain := Table{Rows: 4, Width: 150}
	for _, e := range tableEvents() {
		plain.Add(&e)
	}
	out.WriteString("# plain, last frame\n")
	out.Write(plain.Render(nil, false))
	path := filepath.Join("testdata", "table.golden")
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
		t.Errorf("frames differ from %s (go test -update to accept):\n%s", path, got)
	}
}

// TestTableFrameBounds: every line fits the width, has no control byte but
// our escapes, and a frame has at most header + Rows + summary + lifecycle
// lines, whatever comes in.
func TestTableFrameBounds(t *testing.T) {
	for _, width := range []int{20, 80, 200} {
		tb := Table{Rows: 5, Width: width}
		evs := tableEvents()
		for i := range 300 {
			e := evs[i%len(evs)]
			e.RequestID += strconv.Itoa(i / len(evs))
			tb.Add(&e)
			frame := string(tb.Render(nil, false))
			lines := strings.Split(strings.TrimSuffix(frame, "\n"), "\n")
			if len(lines) > 1+5+1+3 {
				t.Fatalf("width %d: frame of %d lines", width, len(lines))
			}
			for _, l := range lines {
				if n := utf8.RuneCountInString(l); n > width {
					t.Fatalf("width %d: line of %d columns: %q", width, n, l)
				}
				for j := 0; j < len(l); j++ {
					if l[j] < 0x20 || l[j] == 0x7f {
						t.Fatalf("control byte in %q", l)
					}
				}
			}
		}
		if len(tb.byKey) != 5 || len(tb.rows) != 5 {
			t.Fatalf("table keeps %d rows, %d keys; want 5", len(tb.rows), len(tb.byKey))
		}
	}
}

func TestPrinterFilters(t *testing.T) {
	evs := tableEvents()
	tests := []struct {
		name string
		p    Printer
		want []int // indexes of tableEvents printed as lines
	}{
		{"node", Printer{Node: "node-b"}, []int{2, 8, 9, 13}},
		{"route file", Printer{Route: "file"}, []int{2, 8}},
		{"route fallback", Printer{Route: "fallback"}, []int{6, 10}},
		{"node and failed", Printer{Node: "node-a", Failed: true}, []int{6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, want bytes.Buffer
			tt.p.W = &out
			for _, e := range evs {
				e.V = event.Version
				if err := tt.p.Message("s", e.AppendJSON(nil)); err != nil {
					t.Fatal(err)
				}
			}
			for _, i := range tt.want {
				want.Write(AppendLine(nil, &evs[i], false, nil))
			}
			if out.String() != want.String() {
				t.Fatalf("got:\n%s\nwant:\n%s", out.String(), want.String())
			}
		})
	}
	// In a table, --route keeps a shown row updating after its fallback.
	tb := &Table{}
	p := Printer{W: &bytes.Buffer{}, Route: "shared", Table: tb}
	for _, e := range evs {
		e.V = event.Version
		if err := p.Message("s", e.AppendJSON(nil)); err != nil {
			t.Fatal(err)
		}
	}
	r3 := tb.byKey[tableKey{"node-a", "b1", "r3"}]
	if r3 == nil || r3.state != "forwarding" || r3.route != "fallback" {
		t.Fatalf("r3's row under --route shared: %+v", r3)
	}
	if tb.byKey[tableKey{"node-b", "b2", "r2"}] != nil || len(tb.lifecycle) != 0 {
		t.Error("a file request or a lifecycle event passed --route shared")
	}
}

// TestRunRedrawsTable: Run draws a table in place and, once events stop,
// redraws within RedrawEvery without another message.
func TestRunRedrawsTable(t *testing.T) {
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
	var out, errw obtest.Buffer
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, nc, SubjectAll, &Printer{W: &out, Colour: true, Table: &Table{}}, &errw, func(string) { close(ready) })
	}()
	<-ready
	evs := tableEvents()
	for _, e := range evs[:13] {
		e.V = event.Version
		if err := nc.Publish("onebit.x.handoff."+e.To, e.AppendJSON(nil)); err != nil {
			t.Fatal(err)
		}
	}
	// The last frame shows r1 done: drawn by the timer, not by a message.
	obtest.WaitFor(t, 5*time.Second, "r1 done", func() bool {
		frames := strings.Split(out.String(), "\x1b[J")
		last := frames[len(frames)-1]
		return strings.Contains(last, "r1") && strings.Contains(last, ansiGreen+"done"+ansiReset)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPrinterEventlogLost: a daemon's event log loss report
// (onebit.<node>.eventlog.lost, an eventlog.Loss, not an event) is shown,
// not rejected as a bad payload.
func TestPrinterEventlogLost(t *testing.T) {
	loss := []byte(`{"node":"node-a","boot":"b","events":3,"first_seq":4,"last_seq":6,"total":7,"error":"no space left on device","recovered":false}`)
	var out bytes.Buffer
	p := Printer{W: &out}
	if err := p.Message("onebit.node-a.eventlog.lost", loss); err != nil {
		t.Fatalf("Message: %v", err)
	}
	want := `node-a - eventlog.lost events=3 seq=4..6 total=7 error="no space left on device"` + "\n"
	if got := out.String(); !strings.HasSuffix(got, want) {
		t.Errorf("line %q, want suffix %q", got, want)
	}
	out.Reset()
	tb := &Table{}
	p = Printer{W: &out, Table: tb}
	if err := p.Message("onebit.node-a.eventlog.lost", loss); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `node-a eventlog.lost "7 events lost: no space left on device"`) {
		t.Errorf("table: %q", out.String())
	}
	if err := p.Message("onebit.node-a.eventlog.lost", []byte("junk")); !errors.Is(err, ErrPayload) {
		t.Errorf("junk loss report: %v", err)
	}
}

// FuzzTable: any payload on any subject, as a line or into a table: one
// safe line per event, frames within the width, never a panic.
func FuzzTable(f *testing.F) {
	for _, e := range tableEvents() {
		e.V = event.Version
		f.Add("onebit.n.handoff.x", e.AppendJSON(nil), false)
	}
	f.Add("onebit.n.eventlog.lost", []byte(`{"node":"n\u001b[2J","total":3,"error":"a\nb"}`), true)
	f.Add("onebit.n.eventlog.lost", []byte(`{"node":""}`), false)
	f.Fuzz(func(t *testing.T, subject string, data []byte, table bool) {
		var out bytes.Buffer
		p := Printer{W: &out}
		if table {
			p.Table = &Table{Width: 60, Rows: 3}
		}
		if err := p.Message(subject, data); err != nil {
			if !errors.Is(err, ErrPayload) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if err := p.Flush(); err != nil {
			t.Fatal(err)
		}
		if out.Len() == 0 {
			return // filtered
		}
		for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
			if table && utf8.RuneCountInString(l) > 60 {
				t.Fatalf("line of %d columns: %q", utf8.RuneCountInString(l), l)
			}
			for j := 0; j < len(l); j++ {
				if l[j] < 0x20 || l[j] == 0x7f {
					t.Fatalf("control byte in %q", l)
				}
			}
		}
		if !table && strings.Count(out.String(), "\n") != 1 {
			t.Fatalf("%q is not one line", out.String())
		}
	})
}
