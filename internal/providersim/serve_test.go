package providersim

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/provjob"
)

// warm is a provider binary started with --serve.
type warm struct {
	cmd  *exec.Cmd
	sock string
	mu   sync.Mutex
	errb bytes.Buffer
	done chan struct{}
}

func startWarm(t *testing.T, args ...string) *warm {
	t.Helper()
	w := &warm{sock: filepath.Join(t.TempDir(), "provider.sock"), done: make(chan struct{})}
	w.cmd = exec.Command(simBin, append([]string{"--serve", "--socket", w.sock}, args...)...)
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pipe, err := w.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			w.mu.Lock()
			w.errb.WriteString(sc.Text() + "\n")
			w.mu.Unlock()
			if strings.HasPrefix(sc.Text(), "onebit-provider-sim serving on ") {
				close(ready)
			}
		}
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
		<-w.done
		_ = w.cmd.Wait()
	})
	select {
	case <-ready:
	case <-w.done:
		t.Fatalf("the warm provider exited: %s", w.stderr())
	case <-time.After(20 * time.Second):
		t.Fatalf("no serving line: %s", w.stderr())
	}
	return w
}

func (w *warm) stderr() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.errb.String()
}

// send sends one job with files and returns the connection (for the reply).
func (w *warm) send(t *testing.T, j *provjob.Job, files []*os.File) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: w.sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := provjob.SendJob(c, j, files, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	return c
}

// holdsKV reports whether process pid holds an fd or a mapping of the
// decoder sim's KV memfds.
func holdsKV(t *testing.T, pid int) string {
	t.Helper()
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, e := range ents {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); strings.Contains(l, "onebit-sim-kv") {
			return "fd " + e.Name() + " -> " + l
		}
	}
	maps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if i := bytes.Index(maps, []byte("onebit-sim-kv")); i >= 0 {
		return "mapping " + string(maps[max(0, i-60):i+20])
	}
	return ""
}

// TestServe: the warm provider runs shared and file jobs with the same
// results as an exec'd one (identical text, prompt_n 1), reports n_tokens
// and prefill_ms, and holds no fd or mapping of the job's regions once it
// has replied.
func TestServe(t *testing.T) {
	d := startDecoder(t)
	prompt := gatePrompt(500, 3)
	plain := d.complete(prompt)
	w := startWarm(t, "--n-layer", fmt.Sprint(tinyLayers), "--cell-size", fmt.Sprint(tinyCell), "--fixed-ms", "20", "--ms-per-token", "0.02")
	pid := w.cmd.Process.Pid
	deadline := time.Now().Add(10 * time.Second)
	if holdsKV(t, os.Getpid()) == "" { // this process holds the decoder's memfds: the probe sees them
		t.Fatal("holdsKV does not see the in-process decoder's KV memfds")
	}

	msg, id := d.share()
	c := w.send(t, &provjob.Job{Version: 1, Route: provjob.RouteShared, Tokens: prompt, Model: d.model, Layout: msg.Raw}, msg.Files)
	msg.Close() // onebitd's copies; the provider has its own
	rep, err := provjob.ReadReply(c, deadline)
	if err != nil || !rep.OK || rep.NTokens != len(prompt) || rep.PrefillMs < 20+0.02*float64(len(prompt)) {
		t.Fatalf("shared job: %+v %v\n%s", rep, err, w.stderr())
	}
	if h := holdsKV(t, pid); h != "" {
		t.Errorf("after its reply the provider still holds the regions: %s", h)
	}
	d.post("/slots/0?action=adopt", map[string]any{"tokens": prompt, "share_id": id}, nil)
	if got := d.complete(prompt); got.Content != plain.Content || got.Timings.PromptN != 1 {
		t.Errorf("warm shared: %q prompt_n %d, want %q 1", got.Content, got.Timings.PromptN, plain.Content)
	}

	state := filepath.Join(d.dir, "warm.bin")
	c = w.send(t, &provjob.Job{Version: 1, Route: provjob.RouteFile, Tokens: prompt, Model: d.model, State: state}, nil)
	if rep, err := provjob.ReadReply(c, deadline); err != nil || !rep.OK || rep.NTokens != len(prompt) {
		t.Fatalf("file job: %+v %v", rep, err)
	}
	d.post("/slots/0?action=restore", map[string]string{"filename": "warm.bin"}, nil)
	if got := d.complete(prompt); got.Content != plain.Content || got.Timings.PromptN != 1 {
		t.Errorf("warm file: %q prompt_n %d, want %q 1", got.Content, got.Timings.PromptN, plain.Content)
	}

	// A job the provider cannot do: a reason, and the regions released.
	msg, _ = d.share()
	other, _ := writeModel(t, t.TempDir(), "other")
	c = w.send(t, &provjob.Job{Version: 1, Route: provjob.RouteShared, Tokens: prompt, Model: other, Layout: msg.Raw}, msg.Files)
	msg.Close()
	if rep, err := provjob.ReadReply(c, deadline); err != nil || rep.OK || !strings.HasPrefix(rep.Reason, "layout hash mismatch") {
		t.Errorf("mismatched job: %+v %v", rep, err)
	}
	if h := holdsKV(t, pid); h != "" {
		t.Errorf("after a failed job the provider still holds the regions: %s", h)
	}
	// Garbage on the socket: a reason, the provider keeps serving.
	raw, err := net.Dial("unix", w.sock)
	if err != nil {
		t.Fatal(err)
	}
	raw.Write([]byte{2, 0, 0, 0, '{', '}'})
	if rep, err := provjob.ReadReply(raw.(*net.UnixConn), deadline); err != nil || rep.OK || !strings.Contains(rep.Reason, "provjob") {
		t.Errorf("garbage job: %+v %v", rep, err)
	}
	raw.Close()
}

// TestServeFaults: the fault switches in serve mode.
func TestServeFaults(t *testing.T) {
	d := startDecoder(t)
	prompt := gatePrompt(200, 1)
	deadline := time.Now().Add(10 * time.Second)
	job := func(_ *fdpass.Message, raw []byte) *provjob.Job {
		return &provjob.Job{Version: 1, Route: provjob.RouteShared, Tokens: prompt, Model: d.model, Layout: raw}
	}
	t.Run("fail", func(t *testing.T) {
		w := startWarm(t, "--fail")
		msg, _ := d.share()
		defer msg.Close()
		c := w.send(t, job(msg, msg.Raw), msg.Files)
		if rep, err := provjob.ReadReply(c, deadline); err != nil || rep.OK || rep.Reason != "simulated failure" {
			t.Errorf("%+v %v", rep, err)
		}
	})
	t.Run("write then fail", func(t *testing.T) {
		w := startWarm(t, "--write-then-fail")
		msg, _ := d.share()
		defer msg.Close()
		c := w.send(t, job(msg, msg.Raw), msg.Files)
		if rep, err := provjob.ReadReply(c, deadline); err != nil || rep.OK || rep.Reason != "simulated failure after writing" {
			t.Errorf("%+v %v", rep, err)
		}
	})
	t.Run("hang", func(t *testing.T) {
		w := startWarm(t, "--hang")
		msg, _ := d.share()
		defer msg.Close()
		c := w.send(t, job(msg, msg.Raw), msg.Files)
		if rep, err := provjob.ReadReply(c, time.Now().Add(200*time.Millisecond)); err == nil {
			t.Errorf("a hanging provider replied %+v", rep)
		}
	})
	t.Run("slow", func(t *testing.T) {
		w := startWarm(t, "--slow", "100ms")
		msg, _ := d.share()
		defer msg.Close()
		c := w.send(t, job(msg, msg.Raw), msg.Files)
		if rep, err := provjob.ReadReply(c, deadline); err != nil || !rep.OK || rep.PrefillMs < 100 {
			t.Errorf("%+v %v", rep, err)
		}
	})
	t.Run("keep writing until the group is killed", func(t *testing.T) {
		w := startWarm(t, "--keep-writing")
		msg, _ := d.share()
		defer msg.Close()
		c := w.send(t, job(msg, msg.Raw), msg.Files)
		k0 := layer0K(t, msg.Header.Regions)
		mem := readRegion(t, msg.Files[k0.FDIndex], k0.Offset, 8)
		// It writes: the counter moves.
		obtest.WaitFor(t, 5*time.Second, "the keep-writing provider writes", func() bool {
			return !bytes.Equal(readRegion(t, msg.Files[k0.FDIndex], k0.Offset, 8), mem)
		})
		if err := syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-w.done
		_ = w.cmd.Wait()
		after := readRegion(t, msg.Files[k0.FDIndex], k0.Offset, 8)
		if _, err := provjob.ReadReply(c, time.Now().Add(time.Second)); err == nil {
			t.Error("a reply from a killed provider")
		}
		if got := readRegion(t, msg.Files[k0.FDIndex], k0.Offset, 8); !bytes.Equal(got, after) {
			t.Error("the region changed after the provider's group was killed")
		}
	})
}

// layer0K is the layer 0 K region of a share header.
func layer0K(t *testing.T, regions []fdpass.Region) fdpass.Region {
	t.Helper()
	for _, r := range regions {
		if r.Layer == 0 && r.Kind == "k" {
			return r
		}
	}
	t.Fatal("no layer 0 k region")
	return fdpass.Region{}
}

// readRegion reads n bytes at off of f.
func readRegion(t *testing.T, f *os.File, off int64, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}
