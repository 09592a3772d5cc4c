package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
	"github.com/onebitd/onebitd/machine"
)

// update rewrites the golden files of this package's tests (go test
// ./cmd/onebitd -run Replay -update). Another test file of the package that
// wants the flag should look it up with flag.Lookup("update").
var update = flag.Bool("update", false, "rewrite testdata golden files")

var replayT0 = time.Date(2026, 11, 29, 10, 15, 29, 0, time.UTC)

// replayLogEvents is the small log of the golden test: a shared, a file, a
// plain request, a fallback, a failed forward, a decoder restart and one
// request interrupted by a crash (its boot has no shutdown line and another
// follows), over two boots.
func replayLogEvents() []event.Event {
	var out []event.Event
	now := replayT0
	rec := func(boot string) *event.Recorder {
		r := event.NewRecorder("node-a", event.SinkFunc(func(e *event.Event) { out = append(out, *e) }))
		r.Boot = boot
		r.Now = func() time.Time { now = now.Add(250 * time.Microsecond); return now }
		return r
	}
	r := rec("00000000000000b1")
	i64 := func(v int64) *int64 { return &v }
	iptr := func(v int) *int { return &v }
	type step struct {
		ev       machine.Event
		from, to machine.State
		a        machine.Attrs
	}
	run := func(r *event.Recorder, id string, slot int, route machine.Route, steps ...step) {
		for i, s := range steps {
			if s.ev == machine.EvFallback {
				route = machine.RouteFallback
			}
			r.Emit(&event.Event{RequestID: id, Slot: slot, Route: string(route), Event: string(s.ev),
				From: string(s.from), To: string(s.to), ElapsedUS: int64(i) * 1500, ShareID: s.a.ShareID,
				NTokens: s.a.NTokens, NFDs: s.a.NFDs, BytesMapped: s.a.BytesMapped, Reason: s.a.Reason,
				Step: s.a.Step, HTTPStatus: s.a.HTTPStatus, ProviderExit: s.a.ProviderExit, Cleanup: s.a.Cleanup})
		}
	}
	r.Emit(&event.Event{Event: "decoder.starting"})
	r.Emit(&event.Event{Event: "decoder.ready"})
	run(r, "req-shared", 0, machine.RouteShared,
		step{machine.EvListen, machine.Received, machine.Listening, machine.Attrs{}},
		step{machine.EvShare, machine.Listening, machine.Shared, machine.Attrs{ShareID: i64(1), NFDs: 3, BytesMapped: 3 << 20}},
		step{machine.EvPrefill, machine.Shared, machine.Prefilled, machine.Attrs{NTokens: 512, ProviderExit: iptr(0)}},
		step{machine.EvAdopt, machine.Prefilled, machine.Adopted, machine.Attrs{ShareID: i64(1), NTokens: 512, Cleanup: &event.Cleanup{FDsClosed: 3, FilesRemoved: 3}}},
		step{machine.EvForward, machine.Adopted, machine.Forwarding, machine.Attrs{}},
		step{machine.EvFinish, machine.Forwarding, machine.Done, machine.Attrs{HTTPStatus: 200}})
	run(r, "req-file", 1, machine.RouteFile,
		step{machine.EvPrefill, machine.Received, machine.Prefilled, machine.Attrs{NTokens: 40, ProviderExit: iptr(0)}},
		step{machine.EvRestore, machine.Prefilled, machine.Restored, machine.Attrs{NTokens: 40, Cleanup: &event.Cleanup{FilesRemoved: 2}}},
		step{machine.EvForward, machine.Restored, machine.Forwarding, machine.Attrs{}},
		step{machine.EvFinish, machine.Forwarding, machine.Done, machine.Attrs{HTTPStatus: 200}})
	run(r, "req-adopt-refused", 2, machine.RouteShared,
		step{machine.EvListen, machine.Received, machine.Listening, machine.Attrs{}},
		step{machine.EvShare, machine.Listening, machine.Shared, machine.Attrs{ShareID: i64(2), NFDs: 3, BytesMapped: 3 << 20}},
		step{machine.EvPrefill, machine.Shared, machine.Prefilled, machine.Attrs{NTokens: 512, ProviderExit: iptr(0)}},
		step{machine.EvFallback, machine.Prefilled, machine.Fallback, machine.Attrs{Reason: "the decoder refused the adopt: 409 share id 2 is not the slot's last share",
			Step: machine.StepAdopt, HTTPStatus: 409, Cleanup: &event.Cleanup{FDsClosed: 3, FilesRemoved: 3}}},
		step{machine.EvForward, machine.Fallback, machine.Forwarding, machine.Attrs{}},
		step{machine.EvFinish, machine.Forwarding, machine.Done, machine.Attrs{HTTPStatus: 200}})
	r.Emit(&event.Event{Event: "decoder.exited", Reason: "signal: killed"})
	r.Emit(&event.Event{Event: "decoder.starting"})
	r.Emit(&event.Event{Event: "decoder.ready"})
	run(r, "req-after-restart", 0, machine.RouteShared, // share ids start again after a decoder restart
		step{machine.EvListen, machine.Received, machine.Listening, machine.Attrs{}},
		step{machine.EvShare, machine.Listening, machine.Shared, machine.Attrs{ShareID: i64(1), NFDs: 3, BytesMapped: 3 << 20}},
		step{machine.EvPrefill, machine.Shared, machine.Prefilled, machine.Attrs{NTokens: 64, ProviderExit: iptr(0)}},
		step{machine.EvAdopt, machine.Prefilled, machine.Adopted, machine.Attrs{ShareID: i64(1), NTokens: 64, Cleanup: &event.Cleanup{FDsClosed: 3, FilesRemoved: 3}}},
		step{machine.EvForward, machine.Adopted, machine.Forwarding, machine.Attrs{}},
		step{machine.EvFail, machine.Forwarding, machine.Failed, machine.Attrs{HTTPStatus: 502, Reason: "the decoder closed the connection mid-stream"}})
	run(r, "req-interrupted", 3, machine.RouteFile,
		step{machine.EvPrefill, machine.Received, machine.Prefilled, machine.Attrs{NTokens: 7, ProviderExit: iptr(0)}})
	// The daemon restarts: a new boot.
	r = rec("00000000000000b2")
	run(r, "req-plain", 0, machine.RoutePlain,
		step{machine.EvForward, machine.Received, machine.Forwarding, machine.Attrs{}},
		step{machine.EvFinish, machine.Forwarding, machine.Done, machine.Attrs{HTTPStatus: 200}})
	run(r, "req-provider-failed", 1, machine.RouteFile,
		step{machine.EvFallback, machine.Received, machine.Fallback, machine.Attrs{Reason: "provider exited with status 3: model file not found",
			Step: machine.StepProvider, ProviderExit: iptr(3), Cleanup: &event.Cleanup{FilesRemoved: 1}}},
		step{machine.EvForward, machine.Fallback, machine.Forwarding, machine.Attrs{}},
		step{machine.EvFinish, machine.Forwarding, machine.Done, machine.Attrs{HTTPStatus: 200}})
	return out
}

func encodeLog(evs []event.Event) []byte {
	var b []byte
	for i := range evs {
		b = append(evs[i].AppendJSON(b), '\n')
	}
	return b
}

const goldenLog = "testdata/replay/events.jsonl"

func TestReplayGoldenLogIsCurrent(t *testing.T) {
	want := encodeLog(replayLogEvents())
	if *update {
		if err := os.MkdirAll(filepath.Dir(goldenLog), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenLog, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(goldenLog)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run go test ./cmd/onebitd -run Replay -update", goldenLog)
	}
}

func replayRun(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = runReplay(context.Background(), args, &out, &errb, false)
	return out.String(), errb.String(), code
}

func TestReplayGolden(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		golden string
	}{
		{"all timelines", []string{goldenLog}, 0, "all.txt"},
		{"one request", []string{"--request", "req-adopt-refused", goldenLog}, 0, "request.txt"},
		{"flags after the file", []string{goldenLog, "--request", "req-adopt-refused"}, 0, "request.txt"},
		{"failed only", []string{"--failed", goldenLog}, 0, "failed.txt"},
		{"json", []string{"--json", "--failed", goldenLog}, 0, "failed.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := replayRun(t, tt.args...)
			if code != tt.code || errOut != "" {
				t.Fatalf("exit %d (want %d), stderr %q\n%s", code, tt.code, errOut, out)
			}
			path := filepath.Join("testdata/replay", tt.golden)
			if *update {
				if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if out != string(want) {
				t.Fatalf("output differs from %s (-update to accept):\n%s", path, out)
			}
		})
	}
}

func TestReplayJSONReport(t *testing.T) {
	out, _, code := replayRun(t, "--json", goldenLog)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) != 29 {
		t.Fatalf("exit %d, %d lines:\n%s", code, len(lines), out)
	}
	for _, l := range lines[:len(lines)-1] {
		if _, err := event.Parse([]byte(l)); err != nil {
			t.Fatalf("event line %s: %v", l, err)
		}
	}
	var last struct {
		Report eventlog.Report
		Torn   []eventlog.TornTail
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatal(err)
	}
	// req-interrupted: boot b1 ended without a shutdown line and b2 followed.
	if last.Report.Requests != 7 || !last.Report.OK() || len(last.Report.InFlight) != 0 ||
		len(last.Report.Interrupted) != 1 || last.Torn == nil {
		t.Fatalf("report %+v", last)
	}
}

// doctor rewrites the golden log's events: f gets the events of one
// request (by id) in order and may change them in place.
func doctor(t *testing.T, f func(byID map[string][]*event.Event, all []event.Event) []event.Event) string {
	t.Helper()
	evs := replayLogEvents()
	byID := map[string][]*event.Event{}
	for i := range evs {
		if id := evs[i].RequestID; id != "" {
			byID[id] = append(byID[id], &evs[i])
		}
	}
	evs = f(byID, evs)
	path := filepath.Join(t.TempDir(), "events.jsonl")
	if err := os.WriteFile(path, encodeLog(evs), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReplayDoctoredLogs(t *testing.T) {
	same := func(_ map[string][]*event.Event, all []event.Event) []event.Event { return all }
	tests := []struct {
		name     string
		doctor   func(byID map[string][]*event.Event, all []event.Event) []event.Event
		tail     string // appended raw to the file
		code     int
		contains []string
	}{
		{"clean", same, "", 0, []string{"audit: OK"}},
		{"reused share_id", func(byID map[string][]*event.Event, all []event.Event) []event.Event {
			// req-adopt-refused adopts share 1 (req-shared's) instead of falling back.
			evs := byID["req-adopt-refused"]
			*evs[1].ShareID = 1
			fb := evs[3]
			fb.Event, fb.To, fb.Route, fb.Reason, fb.Step, fb.HTTPStatus = "adopt", "adopted", "shared", "", "", 0
			fb.ShareID = evs[1].ShareID
			evs[4].From, evs[4].Route = "adopted", "shared"
			evs[5].Route = "shared"
			return all
		}, "", 1, []string{"violation: request req-adopt-refused: share-id-reused", "share_id 1 was already adopted"}},
		{"missing cleanup", func(byID map[string][]*event.Event, all []event.Event) []event.Event {
			byID["req-shared"][3].Cleanup = nil
			return all
		}, "", 1, []string{"violation: request req-shared: missing-cleanup"}},
		{"fds not closed", func(byID map[string][]*event.Event, all []event.Event) []event.Event {
			byID["req-adopt-refused"][3].Cleanup.FDsClosed = 1
			return all
		}, "", 1, []string{"violation: request req-adopt-refused: missing-cleanup", "closed 1 fds of the 3"}},
		{"two fallback reasons", func(byID map[string][]*event.Event, all []event.Event) []event.Event {
			byID["req-provider-failed"][1].Reason = "and also the socket timed out"
			return all
		}, "", 1, []string{"violation: request req-provider-failed: fallback-reasons"}},
		{"fallback without reason", func(byID map[string][]*event.Event, all []event.Event) []event.Event {
			byID["req-provider-failed"][0].Reason = ""
			return all
		}, "", 1, []string{"violation: request req-provider-failed: fallback-reasons"}},
		{"illegal transition", func(byID map[string][]*event.Event, all []event.Event) []event.Event {
			e := byID["req-file"][1]
			e.From = "received" // restore straight from received
			return all
		}, "", 1, []string{"violation: request req-file: illegal-transition"}},
		{"seq gap", func(_ map[string][]*event.Event, all []event.Event) []event.Event {
			return append(all[:5:5], all[6:]...)
		}, "", 1, []string{"seq-gap", "1 events missing"}},
		{"loss marker", func(_ map[string][]*event.Event, all []event.Event) []event.Event {
			// The log lost seq 6 to 8 and said so (eventlog's marker line).
			m := event.Event{V: 1, Boot: all[5].Boot, Node: all[5].Node, Time: all[5].Time, Event: event.LostEvent,
				Reason: "no space left on device", Lost: &event.Lost{Events: 3, FirstSeq: 6, LastSeq: 8}}
			return append(append(all[:5:5], m), all[8:]...)
		}, "", 1, []string{"lost: 3 events lost between seq 6 and 8 (node node-a, boot 00000000000000b1)",
			"violation: events-lost", "no space left on device"}},
		{"clean shutdown with an unfinished request", func(_ map[string][]*event.Event, all []event.Event) []event.Event {
			// Boot b1 stopped cleanly with nothing in flight, yet
			// req-interrupted has no final event: its last events were lost.
			i := 0
			for all[i].Boot == all[0].Boot {
				i++
			}
			n := 0
			sd := event.Event{V: 1, Boot: all[0].Boot, Seq: all[i-1].Seq + 1, Node: all[0].Node, Time: all[i-1].Time,
				Event: event.Shutdown, InFlight: &n}
			return append(append(all[:i:i], sd), all[i:]...)
		}, "", 1, []string{"incomplete (their last events were lost): req-interrupted", "violation: events-lost",
			"stopped cleanly with 0 requests in flight, but 1 have no final event"}},
		{"torn last line", same, `{"v":1,"boot":"00000000000000b2","seq":9,"ti`, 0,
			[]string{"warning: ", "torn last line 34 (offset", "no final newline", "audit: OK"}},
		{"torn last line and a violation", func(byID map[string][]*event.Event, all []event.Event) []event.Event {
			byID["req-shared"][3].Cleanup = nil
			return all
		}, "garbage\n", 1, []string{"warning: ", "not an event", "missing-cleanup"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := doctor(t, tt.doctor)
			if tt.tail != "" {
				f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.WriteString(tt.tail)
				f.Close()
			}
			out, errOut, code := replayRun(t, "--failed", path)
			if code != tt.code {
				t.Fatalf("exit %d, want %d; stderr %q\n%s", code, tt.code, errOut, out)
			}
			for _, s := range tt.contains {
				if !strings.Contains(out, s) {
					t.Fatalf("output lacks %q:\n%s", s, out)
				}
			}
			if tt.code == 1 && !strings.Contains(out, "audit: FAILED") {
				t.Fatalf("no FAILED line:\n%s", out)
			}
		})
	}
}

func TestReplayUsageAndErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte("nope\n{\"v\":1}\n"), 0o600)
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"no file", nil, 2, "no log file given"},
		{"unknown flag", []string{"--colour", goldenLog}, 2, "flag provided but not defined"},
		{"request and failed", []string{"--request", "x", "--failed", goldenLog}, 2, "do not go together"},
		{"stream half given", []string{"--nats-url", "nats://127.0.0.1:4222"}, 2, "go together"},
		{"stream and files", []string{"--nats-url", "u", "--stream", "ONEBIT", goldenLog}, 2, "not both"},
		{"missing file", []string{filepath.Join(dir, "nope.jsonl")}, 2, "no such file"},
		{"bad middle line", []string{bad}, 2, "line 1"},
		{"unknown request", []string{"--request", "nope", goldenLog}, 1, "request nope is not in the log"},
		{"help", []string{"-h"}, 0, "usage: onebitd replay"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, code := replayRun(t, tt.args...)
			if code != tt.code || !strings.Contains(errOut, tt.stderr) {
				t.Fatalf("exit %d (want %d), stderr %q (want %q)", code, tt.code, errOut, tt.stderr)
			}
		})
	}
}

func TestReplayProgressBar(t *testing.T) {
	var b bytes.Buffer
	p := &progress{w: &b, total: 100 << 20}
	p.nextFile(goldenLog)
	for i := range 4096 * 3 {
		p.update(int64(i) << 10)
	}
	p.clear()
	if s := b.String(); !strings.Contains(s, "replay [") || !strings.HasSuffix(s, "\r\033[K") {
		t.Fatalf("progress output %q", s)
	}
	var nilBar *progress
	nilBar.update(1)
	nilBar.clear()
	_ = strconv.Itoa
}
