package bus

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/obtest"
)

// TestEmbeddedServerRefusesAnonymous: a client without the daemon's
// credentials cannot connect to the embedded server, so it cannot publish
// (issue 10 item 2).
func TestEmbeddedServerRefusesAnonymous(t *testing.T) {
	b := openBus(t, Config{Listen: "127.0.0.1:0"})
	nc, err := nats.Connect(b.ClientURL(), nats.Name("anonymous"))
	if err == nil {
		defer nc.Close()
		pubErr := nc.Publish("onebit.node-a.handoff.fallback", []byte(`{"forged":true}`))
		t.Fatalf("anonymous connection accepted (publish: %v)", pubErr)
	}
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous connect: %v, want %v", err, nats.ErrAuthorization)
	}
}

// TestReaderCannotForge: the reader identity (what watch, replay and
// dashboards get) cannot put anything on onebit.>: not by a plain publish,
// not through JetStream, and it cannot purge or delete the stream; the
// daemon's events still reach it. Every attempt is answered with a
// permissions violation, and a subscriber sees none of it.
func TestReaderCannotForge(t *testing.T) {
	b := openBus(t, Config{Listen: "127.0.0.1:0", JetStream: true, StoreDir: t.TempDir()})
	watcher, err := readerClient(b).Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	seen := subscribe(t, watcher, "onebit.>")

	violations := make(chan error, 16)
	forger, err := readerClient(b).Connect(nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		violations <- err
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer forger.Close()
	forged := []byte(`{"v":1,"boot":"b","seq":1,"node":"node-a","request_id":"forged","event":"fallback","from":"prefilled","to":"fallback","reason":"forged"}`)
	js, err := jetstream.New(forger)
	if err != nil {
		t.Fatal(err)
	}
	attempts := []struct {
		name string
		try  func(ctx context.Context) error // nil error: the client library did not notice
	}{
		{"core publish", func(ctx context.Context) error { return forger.Publish("onebit.node-a.handoff.fallback", forged) }},
		{"publish with reply", func(ctx context.Context) error {
			return forger.PublishRequest("onebit.node-a.handoff.fallback", "_INBOX.x", forged)
		}},
		{"jetstream publish", func(ctx context.Context) error {
			_, err := js.Publish(ctx, "onebit.node-a.handoff.fallback", forged)
			return err
		}},
		{"purge stream", func(ctx context.Context) error {
			s, err := js.Stream(ctx, StreamName)
			if err != nil {
				return err
			}
			return s.Purge(ctx)
		}},
		{"delete stream", func(ctx context.Context) error { return js.DeleteStream(ctx, StreamName) }},
		{"delete a message", func(ctx context.Context) error {
			s, err := js.Stream(ctx, StreamName)
			if err != nil {
				return err
			}
			return s.DeleteMsg(ctx, 1)
		}},
	}
	b.Emit(testEvent("node-a", "genuine", 0))
	obtest.WaitFor(t, 10*time.Second, "the first genuine event", func() bool { return seen.len() == 1 })
	for _, a := range attempts {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := a.try(ctx)
		cancel()
		t.Logf("%s: %v", a.name, err)
		select {
		case v := <-violations:
			if !errors.Is(v, nats.ErrPermissionViolation) {
				t.Errorf("%s: async error %v, want a permissions violation", a.name, v)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s: no permissions violation reported", a.name)
		}
	}
	// What a reader can still cause (docs/security.md): nats-server does not
	// check reply subjects against permissions, so a JetStream API request
	// with reply "onebit.…" makes the server publish its API response there.
	// That response is the server's JSON, never a parseable event: watch
	// skips it with a warning and StreamEvents reports ErrNotAnEvent.
	if err := forger.PublishRequest("$JS.API.INFO", "onebit.node-a.handoff.fallback", nil); err != nil {
		t.Fatal(err)
	}
	obtest.WaitFor(t, 10*time.Second, "the API response", func() bool { return seen.len() == 2 })
	reply := seen.snapshot()[1]
	if _, err := event.Parse(reply.Data); err == nil {
		t.Fatalf("a JetStream API response parses as an event: %s", reply.Data)
	}

	// The daemon's events still flow; once the sentinel is in, anything
	// forged before it would be too.
	b.Emit(testEvent("node-a", "genuine", 1))
	obtest.WaitFor(t, 10*time.Second, "the second genuine event", func() bool { return seen.len() >= 3 })
	var genuine int
	for _, m := range seen.snapshot() {
		if strings.Contains(string(m.Data), "forged") {
			t.Errorf("subscriber saw a forged event on %s: %s", m.Subject, m.Data)
		}
		if e, err := event.Parse(m.Data); err == nil {
			if e.Boot != "genuine" {
				t.Errorf("subscriber saw an event the daemon did not send: %s", m.Data)
			}
			genuine++
		}
	}
	if genuine != 2 || seen.len() != 3 {
		t.Errorf("subscriber saw %d events in %d messages, want the 2 genuine ones and the API response", genuine, seen.len())
	}
	obtest.WaitFor(t, 10*time.Second, "acks", func() bool { return b.Stats().Published == 2 })
	evs, errs := readAll(t, readerClient(b), StreamName)
	if len(evs) != 2 || len(errs) != 1 || !errors.Is(errs[0], ErrNotAnEvent) {
		t.Errorf("stream holds %d events (errors %v), want the 2 genuine ones and one ErrNotAnEvent", len(evs), errs)
	}
	for _, e := range evs {
		if e.Boot != "genuine" {
			t.Errorf("stream holds an event the daemon did not send: %+v", e)
		}
	}
}
