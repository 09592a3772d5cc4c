package e2e

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/schemas"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// subscriber collects every message on onebit.>.
type subscriber struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

// subscribe reads onebit.> at url; creds is the reader identity of an
// embedded server (bus.ReaderCredsPath of its state dir), "" for a server
// without auth.
func subscribe(t *testing.T, url, creds string) *subscriber {
	t.Helper()
	nc, err := (bus.Client{URLs: url, CredsFile: creds}).Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	s := &subscriber{}
	if _, err := nc.Subscribe("onebit.>", func(m *nats.Msg) {
		s.mu.Lock()
		s.msgs = append(s.msgs, m)
		s.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *subscriber) all() []*nats.Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*nats.Msg(nil), s.msgs...)
}

// TestEventsEndToEnd: with events on, a real nats.go subscriber receives
// every transition, in order per request, on onebit.<node>.handoff.<to>; the
// event log holds exactly the same events (byte for byte); every one is
// valid against schemas/event.json; `onebitd replay` passes the log.
func TestEventsEndToEnd(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	for _, share := range []bool{false, true} {
		port := freePort(t)
		url := "nats://127.0.0.1:" + strconv.Itoa(port)
		e := newEnv(t, envOpts{provider: true, share: share,
			onebitArgs: []string{"--nats-listen", "127.0.0.1:" + strconv.Itoa(port)}})
		sub := subscribe(t, url, bus.ReaderCredsPath(e.stateDir))
		text := prompt(51, 250)
		n := 0
		for _, ep := range entries {
			for _, stream := range []bool{false, true} {
				if r := complete(t, e.onebitURL, ep, stream, text, 8); r.status != 200 || r.promptN != 1 {
					t.Fatalf("%s: %d prompt_n %d", ep, r.status, r.promptN)
				}
				n++
			}
		}
		// One fallback too: a prompt too short to hand over.
		resp, err := http.Post(e.onebitURL+"/completion", "application/json", strings.NewReader(`{"prompt":[1],"n_predict":4}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if r := resp.Header.Get("X-Onebit-Route"); resp.StatusCode != 200 || r != "fallback" {
			t.Fatalf("one-token prompt: %d route %s", resp.StatusCode, r)
		}
		n++

		var logged []event.Event
		obtest.WaitFor(t, 10*time.Second, "every event on NATS", func() bool {
			logged = logEvents(t, e)
			return len(logged) > 0 && len(sub.all()) == len(logged) && countDone(logged) == n
		})
		msgs := sub.all()
		lastSeq := map[string]uint64{}
		for i, m := range msgs {
			want := logged[i].AppendJSON(nil)
			if !bytes.Equal(m.Data, want) {
				t.Fatalf("message %d differs from log line %d:\nnats %s\nlog  %s", i, i, m.Data, want)
			}
			if err := schemas.Validate(schemas.KindEvent, m.Data); err != nil {
				t.Fatalf("event %d not valid against the schema: %v\n%s", i, err, m.Data)
			}
			ev := logged[i]
			if wantSubj := "onebit.e2e.handoff." + ev.To; m.Subject != wantSubj {
				t.Fatalf("subject %s, want %s", m.Subject, wantSubj)
			}
			if ev.Seq <= lastSeq[ev.RequestID] {
				t.Fatalf("request %s: seq %d after %d", ev.RequestID, ev.Seq, lastSeq[ev.RequestID])
			}
			lastSeq[ev.RequestID] = ev.Seq
		}
		out, err := exec.Command(bins.onebitd, "replay", e.eventLog()).CombinedOutput()
		if err != nil {
			t.Fatalf("replay of the e2e log failed: %v\n%s", err, out)
		}
	}
}

func countDone(evs []event.Event) int {
	n := 0
	for _, e := range evs {
		if e.To == "done" {
			n++
		}
	}
	return n
}

// TestJetStreamReplay: with --jetstream the embedded server keeps every
// event in stream ONEBIT (store in the state dir), and `onebitd replay
// --nats-url … --stream ONEBIT` audits the same requests as the log.
func TestJetStreamReplay(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	port := freePort(t)
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	e := newEnv(t, envOpts{provider: true, share: true,
		onebitArgs: []string{"--nats-listen", "127.0.0.1:" + strconv.Itoa(port), "--jetstream"}})
	for i := range 4 {
		if r := complete(t, e.onebitURL, epCompletion, i%2 == 0, prompt(uint64(70+i), 200), 4); r.status != 200 || r.route != "shared" {
			t.Fatalf("%d %s", r.status, r.route)
		}
	}
	var fromLog, fromStream []byte
	obtest.WaitFor(t, 10*time.Second, "the stream to hold every logged event", func() bool {
		var err error
		fromLog, err = exec.Command(bins.onebitd, "replay", "--json", e.eventLog()).Output()
		if err != nil {
			t.Fatalf("replay log: %v", err)
		}
		fromStream, err = exec.Command(bins.onebitd, "replay", "--json", "--nats-url", url,
			"--nats-creds", bus.ReaderCredsPath(e.stateDir), "--stream", "ONEBIT").Output()
		return err == nil && bytes.Count(fromStream, []byte("\n")) == bytes.Count(fromLog, []byte("\n"))
	})
	if countDone(logEvents(t, e)) != 4 {
		t.Fatal("log incomplete")
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, "jetstream")); err != nil {
		t.Fatalf("JetStream store not in the state dir: %v", err)
	}
}
