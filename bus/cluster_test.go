package bus

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/obtest"
)

// writeSecret writes a route secret file (0600) and returns its path.
func writeSecret(t testing.TB, dir, secret string) string {
	t.Helper()
	p := filepath.Join(dir, "route.secret")
	if err := os.WriteFile(p, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const testSecret = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0Cg=="

// freePorts returns n loopback ports free a moment ago (a JetStream
// cluster needs its routes configured before it starts).
func freePorts(t testing.TB, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
}

// openCluster opens n buses whose embedded servers form cluster "onebit"
// with JetStream, every one routing to all (its own address is ignored).
func openCluster(t testing.TB, n int, cfg Config) []*Bus {
	t.Helper()
	secret := writeSecret(t, t.TempDir(), testSecret)
	routes := freePorts(t, n)
	var buses []*Bus
	for i := range n {
		c := cfg
		c.Node = fmt.Sprintf("node-%c", 'a'+i)
		c.Listen = "127.0.0.1:-1"
		c.JetStream = true
		c.StateDir = t.TempDir()
		c.StoreDir = filepath.Join(c.StateDir, "jetstream")
		c.ClusterName = "onebit"
		c.ClusterListen = routes[i]
		c.ClusterSecretFile = secret
		c.ClusterRoutes = strings.Join(routes, ",")
		buses = append(buses, openBus(t, c))
	}
	obtest.WaitFor(t, 30*time.Second, "every server routes to the others", func() bool {
		for _, b := range buses {
			if b.srv.NumRoutes() < n-1 {
				return false
			}
		}
		return true
	})
	return buses
}

// TestEmbeddedCluster: three daemons' embedded servers form one cluster
// (--nats-cluster, --nats-routes) holding stream ONEBIT with three
// replicas; every node's events land in it once, and a reader of one node
// sees the others' events live.
func TestEmbeddedCluster(t *testing.T) {
	buses := openCluster(t, 3, Config{StreamReplicas: 3})
	ncA, err := readerClient(buses[0]).Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer ncA.Close()
	live := subscribe(t, ncA, "onebit.node-c.>")

	obtest.WaitFor(t, 60*time.Second, "stream ONEBIT ready on every node", func() bool {
		for _, b := range buses {
			if !b.streamReady.Load() {
				return false
			}
		}
		return true
	})
	const per = 200
	for i := range per {
		for _, b := range buses {
			b.Emit(testEvent(b.cfg.Node, "boot1", i))
		}
	}
	obtest.WaitFor(t, 30*time.Second, "every event acknowledged", func() bool {
		for _, b := range buses {
			if b.Stats().Published < per {
				return false
			}
		}
		return true
	})
	obtest.WaitFor(t, 10*time.Second, "node-c's events seen live on node-a", func() bool { return live.len() == per })

	info := streamInfo(t, ncA)
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream replicas %d, cluster %+v; want 3 replicas on 3 servers", info.Config.Replicas, info.Cluster)
	}
	evs, errs := readAll(t, readerClient(buses[1]), StreamName)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	if len(evs) != 3*per {
		t.Fatalf("stream holds %d events, want %d", len(evs), 3*per)
	}
	last := map[string]uint64{}
	for _, e := range evs {
		if e.Seq <= last[e.Node] {
			t.Fatalf("node %s: seq %d after %d (duplicate or out of order)", e.Node, e.Seq, last[e.Node])
		}
		last[e.Node] = e.Seq
	}
	for _, b := range buses {
		if st := b.Stats(); st.Dropped != 0 {
			t.Errorf("%s dropped %d", b.cfg.Node, st.Dropped)
		}
	}
}

// TestClusterRouteNeedsSecret: the route port admits a route that presents
// the secret and nobody else (a route may carry any subject: without the
// secret anyone who reaches the port could forge events).
func TestClusterRouteNeedsSecret(t *testing.T) {
	secret := writeSecret(t, t.TempDir(), testSecret)
	b := openBus(t, Config{Listen: "127.0.0.1:-1", ClusterName: "onebit", ClusterListen: "127.0.0.1:-1", ClusterSecretFile: secret})
	addr := strings.TrimPrefix(b.ClusterURL(), "nats-route://")
	tests := []struct {
		name    string
		connect string
		ok      bool
	}{
		{"no credentials", `{"verbose":false,"pedantic":false,"name":"x","cluster":"onebit"}`, false},
		{"wrong password", `{"verbose":false,"pedantic":false,"user":"onebit-route","pass":"nope","name":"x","cluster":"onebit"}`, false},
		{"wrong user", `{"verbose":false,"pedantic":false,"user":"someone","pass":"` + testSecret + `","name":"x","cluster":"onebit"}`, false},
		{"the secret", `{"verbose":true,"pedantic":false,"user":"onebit-route","pass":"` + testSecret + `","name":"x","cluster":"onebit"}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			r := bufio.NewReader(c)
			info, err := r.ReadString('\n')
			if err != nil || !strings.HasPrefix(info, "INFO ") {
				t.Fatalf("route INFO: %q %v", info, err)
			}
			if _, err := fmt.Fprintf(c, "CONNECT %s\r\nPING\r\n", tt.connect); err != nil {
				t.Fatal(err)
			}
			var got []string
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					break // the server closed a refused route
				}
				got = append(got, strings.TrimSpace(line))
				if strings.HasPrefix(line, "PONG") || strings.HasPrefix(line, "-ERR") {
					break
				}
			}
			joined := strings.Join(got, " | ")
			refused := strings.Contains(joined, "Authorization Violation")
			if tt.ok == refused || (tt.ok && !strings.Contains(joined, "PONG")) {
				t.Fatalf("route with %s: server said %q", tt.name, joined)
			}
		})
	}
}

func TestClusterConfigErrors(t *testing.T) {
	dir := t.TempDir()
	good := writeSecret(t, dir, testSecret)
	short := filepath.Join(dir, "short")
	open := filepath.Join(dir, "open")
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(open, []byte(testSecret), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil { // umask
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  Config
		want error
	}{
		{"routes without a cluster", Config{ClusterRoutes: "nats-route://127.0.0.1:6222"}, ErrCluster},
		{"secret without a cluster", Config{ClusterSecretFile: good}, ErrCluster},
		{"cluster without a secret", Config{ClusterName: "c"}, ErrCluster},
		{"secret missing", Config{ClusterName: "c", ClusterSecretFile: filepath.Join(dir, "none")}, ErrCluster},
		{"secret too short", Config{ClusterName: "c", ClusterSecretFile: short}, ErrCluster},
		{"secret open to others", Config{ClusterName: "c", ClusterSecretFile: open}, ErrCredsMode},
		{"bad name", Config{ClusterName: "a.b", ClusterSecretFile: good}, ErrCluster},
		{"bad listen", Config{ClusterName: "c", ClusterSecretFile: good, ClusterListen: "nowhere"}, ErrCluster},
		{"bad route", Config{ClusterName: "c", ClusterSecretFile: good, ClusterListen: "127.0.0.1:-1", ClusterRoutes: "nats-route://"}, ErrCluster},
		{"password in the route", Config{ClusterName: "c", ClusterSecretFile: good, ClusterListen: "127.0.0.1:-1", ClusterRoutes: "nats-route://u:p@127.0.0.1:1"}, ErrCluster},
		{"cluster with --nats-url", Config{URLs: "nats://127.0.0.1:1", ClusterName: "c", ClusterSecretFile: good}, ErrCluster},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Node, cfg.Listen, cfg.StateDir, cfg.Logger = "n", "127.0.0.1:-1", t.TempDir(), discardLogger()
			b, err := Open(context.Background(), cfg)
			if err == nil {
				_ = b.Close()
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Open: %v, want %v", err, tt.want)
			}
		})
	}
}

// TestRouteURL: the route entries take the credentials from the secret,
// whatever the form given.
func TestRouteURL(t *testing.T) {
	for _, in := range []string{"nats-route://10.0.0.2:6222", "10.0.0.2:6222"} {
		u, err := routeURL(in, "s/e+c=")
		if err != nil {
			t.Fatal(err)
		}
		if p, _ := u.User.Password(); u.User.Username() != RouteUser || p != "s/e+c=" || u.Host != "10.0.0.2:6222" {
			t.Errorf("routeURL(%q) = %s", in, u.Redacted())
		}
	}
}
