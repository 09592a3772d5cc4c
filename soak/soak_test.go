package soak

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/onebitd/onebitd/internal/simfault"
)

// TestMain checks that no test leaves a goroutine behind (the soak's HTTP
// client, progress ticker and log readers included).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSoakShort runs the whole soak for 20 seconds on freshly built
// binaries: every check of the 10-minute run (make soak), fewer requests.
func TestSoakShort(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries and runs 20 s of requests")
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/onebitd", "./cmd/onebit-decoder-sim", "./cmd/onebit-provider-sim")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	var log bytes.Buffer
	rep, err := Run(context.Background(), Config{
		Duration: 20 * time.Second,
		Onebitd:  filepath.Join(dir, "onebitd"),
		Sim:      filepath.Join(dir, "onebit-decoder-sim"),
		Provider: filepath.Join(dir, "onebit-provider-sim"),
		Seed:     uint64(time.Now().UnixNano()),
		Log:      &log,
	})
	if err != nil {
		t.Fatalf("soak: %v\n%s", err, log.String())
	}
	var md bytes.Buffer
	rep.Markdown(&md)
	t.Logf("\n%s", md.String())
	if rep.Failed() {
		t.Fatal("the soak failed (report above)")
	}
	if rep.total() < 30 {
		t.Errorf("only %d requests in 20 s", rep.total())
	}
}

// TestRunRefusesMissingBinary: a soak that cannot run says so before
// starting anything.
func TestRunRefusesMissingBinary(t *testing.T) {
	_, err := Run(context.Background(), Config{Duration: time.Second, Onebitd: "/nonexistent/onebitd", Sim: "/bin/true", Provider: "/bin/true"})
	if err == nil || !strings.Contains(err.Error(), "onebitd") {
		t.Fatalf("err = %v", err)
	}
}

// TestPromptFor: each fault's prompt names that fault (and only it) to the
// simulators, and the fault-free prompt names none.
func TestPromptFor(t *testing.T) {
	for i := range Faults {
		f := &Faults[i]
		for b := range nBasePrompts {
			p := promptFor(7, b, f)
			if got := simfault.Find(p); got != f.Marker {
				t.Errorf("%s, prompt %d: the simulators see %q", f.Name, b, got)
			}
			if !strings.HasPrefix(p, " ") || strings.Count(p, simfault.Prefix) > 1 {
				t.Errorf("%s: prompt %q", f.Name, p[:min(60, len(p))])
			}
		}
	}
}

func TestErrorShape(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want bool
	}{
		{`{"error":{"code":500,"message":"x","type":"server_error"}}`, true},
		{`{"error":{"code":503,"message":"","type":"unavailable_error"}}`, true},
		{`{"error":{"code":200,"message":"x","type":"server_error"}}`, false},
		{`{"error":{"message":"x","type":"server_error"}}`, false},
		{`{"error":"x"}`, false},
		{`{"content":"x"}`, false},
		{`not json`, false},
	} {
		if got := errorShape([]byte(tc.raw)); got != tc.want {
			t.Errorf("errorShape(%s) = %v", tc.raw, got)
		}
	}
}

func FuzzErrorShape(f *testing.F) {
	f.Add([]byte(`{"error":{"code":500,"message":"x","type":"server_error"}}`))
	f.Fuzz(func(t *testing.T, b []byte) { errorShape(b) })
}

// TestLogTail: lines are taken whole, across partial writes; lifecycle lines
// are not requests; a request is terminal at done or failed.
func TestLogTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "events.jsonl")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := newLogTail(p)
	line := func(id, to, route, step string) string {
		return fmt.Sprintf(`{"v":1,"request_id":%q,"to":%q,"route":%q,"step":%q,"event":"x"}`+"\n", id, to, route, step)
	}
	whole := line("a", "fallback", "shared", "receive") + line("a", "forwarding", "shared", "") + `{"v":1,"event":"decoder.ready"}` + "\n" + line("a", "done", "shared", "")
	f.WriteString(whole[:len(whole)-10])
	if err := l.update(); err != nil {
		t.Fatal(err)
	}
	if st := l.get("a"); st == nil || st.terminal() || st.step != "receive" {
		t.Fatalf("before the last line: %+v", st)
	}
	f.WriteString(whole[len(whole)-10:] + line("b", "forwarding", "file", ""))
	if err := l.update(); err != nil {
		t.Fatal(err)
	}
	if st := l.get("a"); !st.terminal() || st.step != "receive" {
		t.Fatalf("after: %+v", st)
	}
	if open := l.open(); len(open) != 1 || open[0] != "b" || l.count() != 2 || l.bad != 0 {
		t.Fatalf("open %v count %d bad %d", open, l.count(), l.bad)
	}
}
