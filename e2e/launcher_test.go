package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/obtest"
)

// children lists the pids whose parent is pid.
func children(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// TestLaunchedDecoder: onebitd serve --decoder-bin runs the simulator end to
// end; a decoder killed mid-stream ends the client's stream with an error
// event (never a fake [DONE]), is restarted, and later requests succeed;
// onebitd killed with SIGKILL leaves no decoder running.
func TestLaunchedDecoder(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	e := newLaunchedEnv(t, bins.sim, []string{"--provider", bins.prov, "--kv-share"})
	// newLaunchedEnv passes "-- -c 20480"; a per-token delay keeps the stream open.
	text := prompt(31, 400)
	if r := complete(t, e.onebitURL, epChat, true, text, 8); r.status != 200 || r.route != "shared" || r.promptN != 1 {
		t.Fatalf("launched decoder: %d %s prompt_n %d %s", r.status, r.route, r.promptN, tail(r.body))
	}
	kids := children(e.onebit.PID())
	if len(kids) != 1 {
		t.Fatalf("onebitd children %v, want one decoder", kids)
	}
	dec := kids[0]

	// Kill the decoder in the middle of a long stream.
	body, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": text}},
		"max_tokens": 100000, "stream": true})
	resp, err := http.Post(e.onebitURL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var events []string
	killed := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		events = append(events, line)
		if !killed && len(events) >= 3 {
			syscall.Kill(dec, syscall.SIGKILL)
			killed = true
		}
	}
	if !killed {
		t.Fatalf("stream ended before the kill: %v", events)
	}
	last := events[len(events)-1]
	if last == "data: [DONE]" || !strings.Contains(last, `"error"`) {
		t.Fatalf("stream after the decoder died ends with %q, want an error event and no [DONE]", last)
	}

	// Restarted: 503 meanwhile (never a hang), then success.
	var r result
	obtest.WaitFor(t, 30*time.Second, "the restarted decoder to serve", func() bool {
		r = complete(t, e.onebitURL, epCompletion, false, text, 8)
		if r.status != 200 && r.status != 503 {
			t.Fatalf("while restarting: status %d %s", r.status, r.body)
		}
		return r.status == 200
	})
	if r.route != "shared" || r.promptN != 1 {
		t.Fatalf("after restart: route %s prompt_n %d", r.route, r.promptN)
	}
	kids = children(e.onebit.PID())
	if len(kids) != 1 || kids[0] == dec {
		t.Fatalf("children after restart %v (old decoder %d)", kids, dec)
	}
	var lifecycle []string
	for _, ev := range logEvents(t, e) {
		if strings.HasPrefix(ev.Event, "decoder.") {
			lifecycle = append(lifecycle, ev.Event)
		}
	}
	if strings.Join(lifecycle, ",") != "decoder.starting,decoder.ready,decoder.exited,decoder.starting,decoder.ready" {
		t.Fatalf("lifecycle events %v", lifecycle)
	}

	// kill -9 of onebitd: Pdeathsig takes the decoder down with it.
	dec = kids[0]
	syscall.Kill(e.onebit.PID(), syscall.SIGKILL)
	obtest.WaitFor(t, 10*time.Second, "the decoder to die with onebitd", func() bool { return obtest.Gone(dec) })
}

// TestPrefillServerDiesWithOnebitd: onebitd serve --decoder-bin S
// --prefill-bin S serves on the file route through onebit-prefill, and a
// kill -9 of onebitd takes both servers down (Pdeathsig).
func TestPrefillServerDiesWithOnebitd(t *testing.T) {
	t.Parallel() // own processes, ports and temp dirs
	e := newLaunchedEnv(t, bins.sim, []string{"--prefill-bin", bins.sim, "--prefill-provider", bins.prefill})
	text := prompt(33, 300)
	if r := complete(t, e.onebitURL, epCompletion, false, text, 8); r.status != 200 || r.route != "file" || r.promptN != 1 {
		t.Fatalf("hybrid: %d %s prompt_n %d %s", r.status, r.route, r.promptN, tail(r.body))
	}
	kids := children(e.onebit.PID())
	if len(kids) != 2 {
		t.Fatalf("onebitd children %v, want the decoder and the prefill server", kids)
	}
	syscall.Kill(e.onebit.PID(), syscall.SIGKILL)
	for _, pid := range kids {
		obtest.WaitFor(t, 10*time.Second, "the servers to die with onebitd", func() bool { return obtest.Gone(pid) })
	}
}
