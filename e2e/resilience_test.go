package e2e

import (
	"encoding/json"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/onebitd/onebitd/internal/obtest"
)

// natsServer runs a standalone NATS server on port (the "external cluster").
func natsServer(t *testing.T, port int) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	return ns
}

// TestExternalNATSOutage: the external NATS server dies mid-run. Requests go
// on and stay correct, the event log is complete, every event is either
// published or counted as dropped, and publishing resumes after the server
// is back.
func TestExternalNATSOutage(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	port := freePort(t)
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	ns := natsServer(t, port)
	plain := newEnv(t, envOpts{})
	e := newEnv(t, envOpts{provider: true, share: true, onebitArgs: []string{"--nats-url", url}})
	text := prompt(61, 300)
	want := complete(t, plain.onebitURL, epCompletion, false, text, 8).text
	check := func(phase string) {
		t.Helper()
		r := complete(t, e.onebitURL, epCompletion, false, text, 8)
		if r.status != 200 || r.route != "shared" || r.text != want {
			t.Fatalf("%s: %d %s %q", phase, r.status, r.route, r.text)
		}
	}
	sub := subscribe(t, url, "")
	for range 3 {
		check("before")
	}
	obtest.WaitFor(t, 10*time.Second, "events before the outage", func() bool { return len(sub.all()) == len(logEvents(t, e)) })

	ns.Shutdown()
	ns.WaitForShutdown()
	for range 10 {
		check("during the outage")
	}

	ns = natsServer(t, port)
	defer ns.Shutdown()
	sub2 := subscribe(t, url, "")
	obtest.WaitFor(t, 30*time.Second, "publishing to resume", func() bool {
		check("after")
		return len(sub2.all()) > 0
	})
	// A request's finish event is written after its answer reached the
	// client, so the log is read once onebitd has stopped, never before.
	// On stop the bus reports what it published and dropped: together they
	// account for every event.
	e.onebit.cmd.Process.Signal(syscall.SIGTERM)
	<-e.onebit.done
	total := len(logEvents(t, e))
	if n := countDone(logEvents(t, e)); n < 14 {
		t.Fatalf("event log incomplete: %d requests done", n)
	}
	var published, dropped int
	found := false
	for _, line := range strings.Split(e.onebit.Logs(), "\n") {
		if !strings.Contains(line, `"msg":"nats bus closed"`) {
			continue
		}
		var o struct{ Published, Dropped int }
		if err := json.Unmarshal([]byte(line), &o); err == nil {
			published, dropped, found = o.Published, o.Dropped, true
		}
	}
	if !found {
		t.Fatalf("no bus stats in the log:\n%s", tail(e.onebit.Logs()))
	}
	if published+dropped != total {
		t.Fatalf("published %d + dropped %d != %d events logged", published, dropped, total)
	}
	t.Logf("outage: %d events logged, %d published, %d dropped", total, published, dropped)
}

// TestKillUnderLoad: kill -9 of onebitd under load. The restarted onebitd
// reopens the event log (reporting a torn tail if the kill cut a line),
// removes the handoff files the dead one left, and replay shows the
// interrupted requests as in flight without any violation.
func TestKillUnderLoad(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	e := newEnv(t, envOpts{provider: true, share: true, simArgs: []string{"-np", "4", "--token-delay", "2ms"},
		onebitArgs: []string{"--slots", "4", "--event-log-sync", "batch"}})
	var ok atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				body := `{"prompt": ` + strconv.Quote(prompt(uint64(i*1000+j), 300)) + `, "n_predict": 16, "stream": true}`
				resp, err := httpPost(e.onebitURL+"/completion", body)
				if err != nil {
					return // onebitd is gone
				}
				if resp == 200 {
					ok.Add(1)
				}
			}
		}()
	}
	obtest.WaitFor(t, 30*time.Second, "load", func() bool { return ok.Load() >= 20 })
	syscall.Kill(e.onebit.PID(), syscall.SIGKILL)
	<-e.onebit.done
	close(stop)
	wg.Wait()

	// Restart on the same state dir.
	args := e.onebit.cmd.Args[1:]
	re, _ := startEnv(t, []string{"E2E_SIM_URL=" + e.simURL}, bins.onebitd, reOnebitd, args...)
	logs := re.Logs()
	if strings.Contains(logs, "torn last line") {
		t.Log("restart reported a torn tail")
	}
	ents, _ := dirEntries(e.slotDir)
	if len(ents) != 0 {
		t.Fatalf("slot dir after restart: %v", ents)
	}
	out, err := exec.Command(bins.onebitd, "replay", e.eventLog()).CombinedOutput()
	if err != nil {
		t.Fatalf("replay after kill -9: %v\n%s", err, tail(string(out)))
	}
	// The words alone are always printed (the audit line counts them):
	// read the counts. The killed boot has no shutdown line and a later
	// boot follows, so its unfinished requests are "interrupted" (or "in
	// flight" if the restarted onebitd wrote nothing yet).
	m := regexp.MustCompile(`(\d+) interrupted, \d+ incomplete, (\d+) in flight\)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("replay has no interrupted / in-flight counts:\n%s", tail(string(out)))
	}
	interrupted, _ := strconv.Atoi(m[1])
	inFlight, _ := strconv.Atoi(m[2])
	if interrupted+inFlight < 1 {
		t.Fatalf("replay reports no request interrupted by kill -9 under a load of 8 streams:\n%s", tail(string(out)))
	}
}
