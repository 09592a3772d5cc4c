package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/internal/browsertest"
	"github.com/onebitd/onebitd/internal/obtest"
)

// TestDashboardCommandTwoNodes: two daemons publish on one NATS server (the
// first one's embedded server, the second connects to it with the daemon
// identity); `onebitd dashboard` with the reader identity shows both nodes
// and their requests' timelines, through the API and in headless Chromium
// (without a chromium binary the test stops before the browser part).
func TestDashboardCommandTwoNodes(t *testing.T) {
	state := t.TempDir()
	a := openTestBus(t, bus.Config{Listen: "127.0.0.1:0", StateDir: state, Node: "node-a"})
	b := openTestBus(t, bus.Config{URLs: a.ClientURL(), CredsFile: filepath.Join(state, bus.DaemonCredsFile), Node: "node-b"})

	var stderr obtest.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	urlc := make(chan string, 1)
	done := make(chan int, 1)
	go func() {
		done <- dashboardRun(ctx, []string{"--listen", "127.0.0.1:0", "--nats-url", a.ClientURL(), "--nats-creds", a.ReaderCreds()},
			&stderr, func(u string) { urlc <- u })
	}()
	var page string
	select {
	case page = <-urlc:
	case code := <-done:
		t.Fatalf("dashboard exited %d: %s", code, stderr.String())
	}
	base := strings.TrimSuffix(page, "ui/")
	for _, pair := range []struct {
		bus  *bus.Bus
		node string
	}{{a, "node-a"}, {b, "node-b"}} {
		for _, e := range watchEvents(pair.node) {
			pair.bus.Emit(e)
		}
	}
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	var body string
	obtest.WaitFor(t, 10*time.Second, "both nodes' r1", func() bool {
		var code int
		code, body = get("api/requests/r1")
		return code == 200 && strings.Count(body, `"outcome":"done"`) == 2
	})
	var tl struct {
		Timelines []struct {
			Node   string
			Events []event.Event
		}
	}
	if err := json.Unmarshal([]byte(body), &tl); err != nil {
		t.Fatal(err)
	}
	nodes := map[string]int{}
	for _, x := range tl.Timelines {
		nodes[x.Node] = len(x.Events)
	}
	if nodes["node-a"] != 6 || nodes["node-b"] != 6 {
		t.Errorf("r1's events per node: %v, want 6 on each (watchEvents: r1 listen … finish)", nodes)
	}
	if code, html := get(""); code != 200 || !strings.Contains(html, "<title>onebitd dashboard</title>") {
		t.Errorf("GET / = %d, not the page", code)
	}
	// The page, in a real browser: both nodes, each with its r1 row.
	p := browsertest.Open(t, page, "#conn.on")
	p.Do(chromedp.WaitVisible(chromedp.CSS(`div[data-node="node-a"] tr[data-request="r1"] td.st-done`)),
		chromedp.WaitVisible(chromedp.CSS(`div[data-node="node-b"] tr[data-request="r1"] td.st-done`)))
	obtest.WaitFor(t, 5*time.Second, "both nodes in the nodes table", func() bool {
		s := p.Text(`#nodes tbody`)
		return strings.Contains(s, "node-a") && strings.Contains(s, "node-b")
	})
	p.Shot("dashboard-two-nodes")
	p.NoConsoleErrors()
	if !strings.Contains(stderr.String(), "as "+a.ReaderCreds()) {
		t.Errorf("the dashboard does not say which credentials it uses: %q", stderr.String())
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d after cancel: %s", code, stderr.String())
	}
}

func TestDashboardCommandErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"help", []string{"-h"}, 0, "-listen"},
		{"argument", []string{"extra"}, 2, `unexpected argument "extra"`},
		{"no server", []string{"--nats-url", "nats://127.0.0.1:1"}, 1, "cannot reach NATS"},
		{"no key file", []string{"--api-key-file", "/nonexistent/keys"}, 2, "/nonexistent/keys"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr obtest.Buffer
			if code := dashboardRun(context.Background(), tt.args, &stderr, nil); code != tt.code {
				t.Fatalf("exit %d, want %d: %s", code, tt.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.want)
			}
		})
	}
}

// TestDashboardCommandAPIKey: with --api-key-file the API wants the key
// (the page stays readable and asks for it).
func TestDashboardCommandAPIKey(t *testing.T) {
	a := openTestBus(t, bus.Config{Listen: "127.0.0.1:0", StateDir: t.TempDir()})
	keyFile := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keyFile, []byte("k-one\nk-two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr obtest.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	urlc := make(chan string, 1)
	done := make(chan int, 1)
	go func() {
		done <- dashboardRun(ctx, []string{"--listen", "127.0.0.1:0", "--nats-url", a.ClientURL(), "--nats-creds", a.ReaderCreds(),
			"--api-key-file", keyFile}, &stderr, func(u string) { urlc <- u })
	}()
	var page string
	select {
	case page = <-urlc:
	case code := <-done:
		t.Fatalf("dashboard exited %d: %s", code, stderr.String())
	}
	base := strings.TrimSuffix(page, "ui/")
	for _, c := range []struct {
		path, key string
		want      int
	}{
		{"api/session", "", 401}, {"api/session", "k-two", 204}, {"api/session", "k-three", 401},
		{"api/requests/x", "k-one", 404}, {"ui/", "", 200},
	} {
		req, _ := http.NewRequest("GET", base+c.path, nil)
		if c.key != "" {
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("GET %s with key %q = %d, want %d", c.path, c.key, resp.StatusCode, c.want)
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}
