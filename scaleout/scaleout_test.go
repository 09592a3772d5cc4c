package scaleout

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
	"github.com/onebitd/onebitd/internal/obtest"
)

// bins are built once per test binary (without -race: the test is a load
// test on a small machine; the packages' own tests run with -race).
var bins struct{ onebitd, sim string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "onebit-scaleout-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins.onebitd = filepath.Join(dir, "onebitd")
	bins.sim = filepath.Join(dir, "onebit-decoder-sim")
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/onebitd", "./cmd/onebit-decoder-sim")
	cmd.Dir = ".."
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build the binaries: %v\n", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// freePorts returns n loopback ports free a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// user is one nkey identity of the cluster, its seed in a 0600 file.
type user struct {
	pub, seedFile string
	perms         *server.Permissions
}

func newUser(t *testing.T, dir, name string, perms *server.Permissions) user {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	p := filepath.Join(dir, name+".nk")
	if err := os.WriteFile(p, append(seed, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return user{pub: pub, seedFile: p, perms: perms}
}

// cluster is three nats-servers, routed with a password, JetStream on,
// clients not told of the other servers (NoAdvertise: a client behind the
// cut proxy must not reconnect around it).
type cluster struct {
	t                 *testing.T
	clientPorts, rPts []int
	stores            []string
	users             []user
	srv               []*server.Server
}

const routeSecret = "scaleout-route-secret-0123456789"

func (c *cluster) opts(i int) *server.Options {
	var routes []*url.URL
	for _, p := range c.rPts {
		routes = append(routes, &url.URL{Scheme: "nats-route", User: url.UserPassword("route", routeSecret), Host: "127.0.0.1:" + strconv.Itoa(p)})
	}
	var nk []*server.NkeyUser
	for _, u := range c.users {
		nk = append(nk, &server.NkeyUser{Nkey: u.pub, Permissions: u.perms})
	}
	return &server.Options{
		ServerName: fmt.Sprintf("s%d", i), Host: "127.0.0.1", Port: c.clientPorts[i],
		NoSigs: true, NoLog: true, JetStream: true, StoreDir: c.stores[i], Nkeys: nk,
		Cluster: server.ClusterOpts{Name: "scaleout", Host: "127.0.0.1", Port: c.rPts[i],
			Username: "route", Password: routeSecret, NoAdvertise: true},
		Routes: routes,
	}
}

func (c *cluster) start(i int) {
	c.t.Helper()
	s, err := server.NewServer(c.opts(i))
	if err != nil {
		c.t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(20 * time.Second) {
		c.t.Fatalf("nats server s%d not ready", i)
	}
	c.srv[i] = s
}

func (c *cluster) stop(i int) {
	if s := c.srv[i]; s != nil {
		s.Shutdown()
		s.WaitForShutdown()
		c.srv[i] = nil
	}
}

func (c *cluster) url(i int) string { return "nats://127.0.0.1:" + strconv.Itoa(c.clientPorts[i]) }

func (c *cluster) urls() string {
	var u []string
	for i := range c.srv {
		u = append(u, c.url(i))
	}
	return strings.Join(u, ",")
}

func (c *cluster) waitRoutes() {
	obtest.WaitFor(c.t, 60*time.Second, "the three servers routed", func() bool {
		for _, s := range c.srv {
			if s == nil || s.NumRoutes() < 2 {
				return false
			}
		}
		return true
	})
}

// proxy forwards TCP to target until cut: then it closes every connection
// and refuses new ones until restored.
type proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		l.Close()
		p.setCut(true)
		p.wg.Wait()
	})
	return p
}

func (p *proxy) url() string { return "nats://" + p.l.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		go pipe(up, c)
		go pipe(c, up)
	}
}

func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
	}
}

// proc is a child process whose stderr is kept.
type proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{}
}

func (p *proc) Logs() string { p.mu.Lock(); defer p.mu.Unlock(); return p.logs.String() }

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// start runs bin and waits for a stderr line matching re.
func start(t *testing.T, bin string, re *regexp.Regexp, args ...string) (*proc, string) {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = pw
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	found := make(chan string, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			p.mu.Lock()
			p.logs.Write(sc.Bytes())
			p.logs.WriteByte('\n')
			p.mu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil && !sent {
				found <- m[1]
				sent = true
			}
		}
	}()
	go func() { _ = p.cmd.Wait(); <-read; close(p.done) }()
	t.Cleanup(func() { p.stop(syscall.SIGTERM) })
	select {
	case s := <-found:
		return p, s
	case <-p.done:
		t.Fatalf("%s exited before it was ready:\n%s", filepath.Base(bin), p.Logs())
	case <-time.After(60 * time.Second):
		t.Fatalf("%s not ready in 60s:\n%s", filepath.Base(bin), p.Logs())
	}
	return nil, ""
}

func (p *proc) stop(sig syscall.Signal) {
	if !p.alive() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

var (
	reSim     = regexp.MustCompile(`listening on (http://\S+)`)
	reOnebitd = regexp.MustCompile(`"msg":"onebitd serving".*"listen":"(http://[^"]+)"`)
)

// node is one onebitd in front of its decoder simulator.
type node struct {
	name, stateDir string
	args           []string
	proc           *proc
	url            atomic.Value // string
}

func (n *node) start(t *testing.T) {
	t.Helper()
	p, u := start(t, bins.onebitd, reOnebitd, n.args...)
	n.proc = p
	n.url.Store(u)
}

func (n *node) logPath() string { return filepath.Join(n.stateDir, "events.jsonl") }

func (n *node) logSize() int64 {
	fi, err := os.Stat(n.logPath())
	if err != nil {
		return 0
	}
	return fi.Size()
}

func newNode(t *testing.T, c *cluster, name, natsURL, seedFile string, extra ...string) *node {
	t.Helper()
	dir := t.TempDir()
	slots := filepath.Join(dir, "slots")
	if err := os.MkdirAll(slots, 0o700); err != nil {
		t.Fatal(err)
	}
	model := filepath.Join(dir, "m.gguf")
	if err := os.WriteFile(model, []byte("GGUF-SIM model a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, simURL := start(t, bins.sim, reSim, "--port", "0", "-m", model, "-c", "20480", "--slot-save-path", slots, "--compact")
	port := freePorts(t, 1)[0]
	n := &node{name: name, stateDir: dir}
	n.args = append([]string{"serve", "--listen", "127.0.0.1:" + strconv.Itoa(port), "--decoder-url", simURL,
		"--state-dir", dir, "--slot-dir", slots, "--model", model, "--log-format", "json", "--node", name,
		"--nats-url", natsURL, "--nats-nkey", seedFile, "--jetstream", "--stream-replicas", "3",
		// A kill -9 keeps what was written: with the default batch policy the
		// bus can publish an event still in the log's memory (reported).
		"--event-log-sync", "always"}, extra...)
	n.start(t)
	return n
}

// load sends small plain-route completions to n from workers goroutines
// until ctx ends; it counts the answers that were 200.
func load(ctx context.Context, wg *sync.WaitGroup, n *node, workers int, ok *atomic.Int64) {
	body := `{"prompt":"the cache of the decoder slot","n_predict":2}`
	cl := &http.Client{Timeout: 10 * time.Second}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, n.url.Load().(string)+"/completion", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := cl.Do(req)
				if err != nil {
					select { // the node is down: try again soon
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ok.Add(1)
				}
			}
		}()
	}
}

// key names an event across nodes and boots.
func key(e *event.Event) string { return fmt.Sprintf("%s/%s/%d", e.Node, e.Boot, e.Seq) }

func logEvents(t *testing.T, path string) []event.Event {
	t.Helper()
	var out []event.Event
	if _, err := eventlog.ReadFile(path, func(_ int, e event.Event) error {
		if e.Seq != 0 { // loss markers are the log's own
			out = append(out, e)
		}
		return nil
	}); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return out
}

func streamEvents(t *testing.T, c bus.Client) ([]event.Event, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []event.Event
	for e, err := range bus.StreamEvents(ctx, c, bus.StreamName) {
		if err != nil {
			return out, err
		}
		out = append(out, e)
	}
	return out, nil
}

// TestScaleOutNoEventLost is issue 14's acceptance: two onebitd nodes under
// load publish into stream ONEBIT (3 replicas) on a three-server cluster;
// one server is killed and restarted, node b's link is cut for longer
// than its reconnect buffer holds, node a is killed with -9 and restarted.
// Afterwards the stream holds exactly the union of the two logs (same
// count, no duplicate, every boot's seqs in order) and replay gives the
// same report from the stream as from the logs.
func TestScaleOutNoEventLost(t *testing.T) {
	if testing.Short() {
		t.Skip("acceptance test: processes and a NATS cluster")
	}
	keys := t.TempDir()
	daemonPerms := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"onebit.>", "$JS.API.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
	readerPerms := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.>"}, Deny: []string{"onebit.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"onebit.>", "_INBOX.>"}},
	}
	userA := newUser(t, keys, "node-a", daemonPerms)
	userB := newUser(t, keys, "node-b", daemonPerms)
	reader := newUser(t, keys, "reader", readerPerms)

	ports := freePorts(t, 6)
	c := &cluster{t: t, clientPorts: ports[:3], rPts: ports[3:], srv: make([]*server.Server, 3),
		users: []user{userA, userB, reader}}
	for range 3 {
		c.stores = append(c.stores, t.TempDir())
	}
	for i := range 3 {
		c.start(i)
	}
	t.Cleanup(func() {
		for i := range 3 {
			c.stop(i)
		}
	})
	c.waitRoutes()

	// Node b reaches the cluster only through the proxy to s1; its
	// reconnect buffer holds 2 KiB (a handful of events).
	px := newProxy(t, "127.0.0.1:"+strconv.Itoa(c.clientPorts[1]))
	a := newNode(t, c, "node-a", c.urls(), userA.seedFile)
	b := newNode(t, c, "node-b", px.url(), userB.seedFile, "--nats-reconnect-buf", "2048")
	rc := bus.Client{URLs: c.urls(), NKeyFile: reader.seedFile, Name: "scaleout test"}

	ctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var okA, okB atomic.Int64
	load(ctx, &wg, a, 3, &okA)
	load(ctx, &wg, b, 3, &okB)
	defer func() { stopLoad(); wg.Wait() }()

	grows := func(n *node, by int64, what string) {
		from := n.logSize()
		obtest.WaitFor(t, 60*time.Second, what, func() bool { return n.logSize() >= from+by })
	}
	nc, err := rc.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// inStream counts n's events the stream holds now.
	inStreamOf := func(n *node) uint64 {
		ictx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ictx, bus.StreamName)
		if err != nil {
			return 0
		}
		info, err := s.Info(ictx, jetstream.WithSubjectFilter(bus.NodeSubjects(n.name)))
		if err != nil {
			return 0
		}
		var sum uint64
		for _, c := range info.State.Subjects {
			sum += c
		}
		return sum
	}
	// publishing waits until n's events reach the stream live.
	publishing := func(n *node, what string) {
		from := inStreamOf(n)
		obtest.WaitFor(t, 60*time.Second, what, func() bool { return inStreamOf(n) >= from+200 })
	}
	publishing(a, "node a's events in the stream")
	publishing(b, "node b's events in the stream")

	// 1. A NATS server dies and comes back with its store.
	c.stop(2)
	grows(a, 64<<10, "load while s2 is down")
	c.start(2)
	c.waitRoutes()
	t.Log("s2 restarted")

	// 2. Node b's link is cut while it writes far more than its buffer.
	publishing(b, "node b publishing before the cut")
	px.setCut(true)
	grows(b, 128<<10, "node b's log grows while its link is cut")
	px.setCut(false)
	t.Log("node b's link restored")

	// 3. Node a is killed with -9 under load and restarted.
	publishing(a, "node a publishing before the kill")
	a.proc.stop(syscall.SIGKILL)
	a.start(t)
	grows(a, 64<<10, "node a's next boot under load")

	stopLoad()
	wg.Wait()
	t.Logf("answered: node a %d, node b %d", okA.Load(), okB.Load())

	// The stream converges on the union of the logs.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("node a:\n%s\nnode b:\n%s", tailLog(a.proc.Logs()), tailLog(b.proc.Logs()))
		evs, err := streamEvents(t, rc)
		inS := map[string]bool{}
		for _, e := range evs {
			inS[key(&e)] = true
		}
		for _, n := range []*node{a, b} {
			var miss []string
			l := logEvents(t, n.logPath())
			for _, e := range l {
				if !inS[key(&e)] {
					miss = append(miss, key(&e))
				}
			}
			t.Logf("%s: log %d events, %d not in the stream (%v), first %v", n.name, len(l), len(miss), err, head(miss))
		}
	})
	var logA, logB []event.Event
	obtest.WaitFor(t, 120*time.Second, "the stream to hold as many events as the logs", func() bool {
		logA, logB = logEvents(t, a.logPath()), logEvents(t, b.logPath())
		ictx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ictx, bus.StreamName)
		if err != nil {
			return false
		}
		return s.CachedInfo().State.Msgs >= uint64(len(logA)+len(logB))
	})
	inStream, err := streamEvents(t, rc)
	if err != nil {
		t.Fatal(err)
	}
	union := map[string]bool{}
	for _, e := range slices.Concat(logA, logB) {
		union[key(&e)] = true
	}
	seen := map[string]bool{}
	lastSeq := map[string]uint64{} // node/boot → seq
	var dup, extra, disorder []string
	for _, e := range inStream {
		k := key(&e)
		if seen[k] {
			dup = append(dup, k)
		}
		seen[k] = true
		if !union[k] {
			extra = append(extra, k)
		}
		nb := e.Node + "/" + e.Boot
		if e.Seq <= lastSeq[nb] {
			disorder = append(disorder, fmt.Sprintf("%s after seq %d", k, lastSeq[nb]))
		}
		lastSeq[nb] = e.Seq
	}
	var missing []string
	for k := range union {
		if !seen[k] {
			missing = append(missing, k)
		}
	}
	t.Logf("logs: node a %d events, node b %d; stream %d", len(logA), len(logB), len(inStream))
	if len(inStream) != len(union) || len(dup)+len(extra)+len(missing)+len(disorder) > 0 {
		t.Fatalf("stream %d events, union of the logs %d: %d duplicated %v, %d not in a log %v, %d missing %v, %d out of order %v",
			len(inStream), len(union), len(dup), head(dup), len(extra), head(extra), len(missing), head(missing),
			len(disorder), head(disorder))
	}

	// The faults happened as meant: node b lost events beyond its buffer
	// (the catch-up brought them), node a's crash left a second boot.
	if !strings.Contains(b.proc.Logs(), `"msg":"nats events dropped"`) {
		t.Errorf("node b never overflowed its reconnect buffer:\n%s", tailLog(b.proc.Logs()))
	}
	boots := map[string]bool{}
	for _, e := range logA {
		boots[e.Boot] = true
	}
	if len(boots) != 2 {
		t.Errorf("node a's log holds %d boots, want 2 (kill -9 and restart)", len(boots))
	}

	// replay from the stream and from the logs: the same report.
	fromLogs := replayReport(t, "--json", a.logPath(), b.logPath())
	fromStream := replayReport(t, "--json", "--stream", bus.StreamName, "--nats-url", c.urls(), "--nats-nkey", reader.seedFile)
	if fromLogs != fromStream {
		t.Fatalf("replay reports differ:\nlogs:   %s\nstream: %s", fromLogs, fromStream)
	}
	t.Logf("replay report: %s", fromLogs)
}

// replayReport runs onebitd replay and returns its report, normalised:
// the sources and lines (file vs stream) blanked, id lists sorted (their
// order is first-event order, which interleaves differently).
func replayReport(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(bins.onebitd, append([]string{"replay"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil && cmd.ProcessState.ExitCode() != 1 { // 1: violations, compared below
		t.Fatalf("replay %v: %v\n%s", args, err, stderr.String())
	}
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	var r struct {
		Report eventlog.Report `json:"report"`
	}
	if err := json.Unmarshal(lines[len(lines)-1], &r); err != nil {
		t.Fatalf("replay %v: last line %q: %v", args, lines[len(lines)-1], err)
	}
	rep := r.Report
	for i := range rep.Violations {
		rep.Violations[i].Source, rep.Violations[i].Line = "", 0
	}
	for i := range rep.Lost {
		rep.Lost[i].Source, rep.Lost[i].Line = "", 0
	}
	slices.Sort(rep.InFlight)
	slices.Sort(rep.Interrupted)
	slices.Sort(rep.Incomplete)
	slices.SortFunc(rep.Violations, func(x, y eventlog.Violation) int {
		return strings.Compare(x.RequestID+x.Rule+x.Detail, y.RequestID+y.Rule+y.Detail)
	})
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func head(s []string) []string { return s[:min(len(s), 5)] }

func tailLog(s string) string {
	if len(s) > 3000 {
		return s[len(s)-3000:]
	}
	return s
}
