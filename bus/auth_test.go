package bus

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

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
	// Nor can it have the server replay genuine events onto onebit.> as
	// new ones, through a push consumer delivering there: JetStream refuses
	// a deliver subject the stream itself captures (a cycle).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err = js.CreateOrUpdatePushConsumer(ctx, StreamName, jetstream.ConsumerConfig{
		DeliverSubject: "onebit.node-a.handoff.fallback", AckPolicy: jetstream.AckNonePolicy,
	})
	cancel()
	if err == nil {
		t.Fatal("a reader made a push consumer deliver onto onebit.>")
	}
	t.Logf("push consumer onto onebit.>: %v", err)

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

// TestSeedFiles: the embedded server's identities are 0600 files in the
// state dir, made once and kept, so that a reader's file stays valid
// across restarts; a file open to others or not a seed is refused.
func TestSeedFiles(t *testing.T) {
	dir := t.TempDir()
	b := openBus(t, Config{Listen: ListenOff, StateDir: dir})
	pubs := map[string]string{}
	for _, f := range []string{DaemonCredsFile, ReaderCredsFile} {
		path := filepath.Join(dir, f)
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %04o, want 0600", f, fi.Mode().Perm())
		}
		id, err := loadSeedFile(path)
		if err != nil {
			t.Fatal(err)
		}
		pubs[f] = id.pub
	}
	if b.ReaderCreds() != ReaderCredsPath(dir) {
		t.Errorf("ReaderCreds %q, want %q", b.ReaderCreds(), ReaderCredsPath(dir))
	}
	if pubs[DaemonCredsFile] == pubs[ReaderCredsFile] {
		t.Fatal("daemon and reader share a key")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	// A restart keeps both keys.
	b2 := openBus(t, Config{Listen: ListenOff, StateDir: dir})
	if got := b2.creds.reader.pub; got != pubs[ReaderCredsFile] {
		t.Errorf("reader key changed across a restart: %s → %s", pubs[ReaderCredsFile], got)
	}
	if got := b2.creds.daemon.pub; got != pubs[DaemonCredsFile] {
		t.Errorf("daemon key changed across a restart: %s → %s", pubs[DaemonCredsFile], got)
	}
	_ = b2.Close()

	// No state dir: keys in memory, no file to hand out.
	mem, err := Open(context.Background(), Config{Listen: ListenOff, Node: "n", Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	if got := mem.ReaderCreds(); got != "" {
		t.Errorf("ReaderCreds without a state dir = %q, want empty", got)
	}

	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  error
	}{
		{"group readable", func(t *testing.T, dir string) {
			if _, err := loadOrCreateCredentials(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(ReaderCredsPath(dir), 0o640); err != nil {
				t.Fatal(err)
			}
		}, ErrCredsMode},
		{"not a seed", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, DaemonCredsFile), "hello\n", 0o600)
		}, ErrCreds},
		{"an account seed", func(t *testing.T, dir string) {
			kp, err := nkeys.CreateAccount()
			if err != nil {
				t.Fatal(err)
			}
			seed, _ := kp.Seed()
			writeFile(t, filepath.Join(dir, DaemonCredsFile), string(seed)+"\n", 0o600)
		}, ErrCreds},
		{"state dir is a file", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "f"), "", 0o600)
		}, ErrCreds},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := t.TempDir()
			tt.setup(t, d)
			sd := d
			if tt.name == "state dir is a file" {
				sd = filepath.Join(d, "f")
			}
			b, err := Open(context.Background(), Config{Listen: ListenOff, StateDir: sd, Node: "n", Logger: discardLogger()})
			if err == nil {
				_ = b.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Open: %v, want %v", err, tt.want)
			}
			t.Log(err)
		})
	}
}

func writeFile(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

// TestSeedFileCreationRace: daemons starting together on one state dir
// end up with one key each identity, the same for all.
func TestSeedFileCreationRace(t *testing.T) {
	dir := t.TempDir()
	const n = 8
	got := make([]*credentials, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = loadOrCreateCredentials(dir)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("creator %d: %v", i, errs[i])
		}
		if got[i].reader.pub != got[0].reader.pub || got[i].daemon.pub != got[0].daemon.pub {
			t.Fatalf("creator %d got other keys than creator 0", i)
		}
	}
}
