package providersim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/decodersim"
	"github.com/onebitd/onebitd/internal/simkv"
	"github.com/onebitd/onebitd/provider"
)

// tiny is the geometry of the gate: the real tiny model's 2 KiB cells.
const tinyLayers, tinyCell = 4, 2048

// decoder is an in-process decoder simulator with full cells (honest costs).
type decoder struct {
	t       *testing.T
	srv     *decodersim.Server
	ts      *httptest.Server
	dir     string // slot save path
	model   string
	modelID uint64
}

func startDecoder(t *testing.T) *decoder {
	t.Helper()
	dir := t.TempDir()
	modelPath, model := writeModel(t, dir, "gate")
	cfg := decodersim.DefaultConfig()
	cfg.ModelPath, cfg.NCtx, cfg.NLayer, cfg.CellSize, cfg.SlotSavePath = modelPath, 16384, tinyLayers, tinyCell, dir
	srv, err := decodersim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	return &decoder{t: t, srv: srv, ts: ts, dir: dir, model: modelPath, modelID: model}
}

// post sends body as JSON and decodes a 200 answer into out (nil: ignore).
func (d *decoder) post(path string, body, out any) {
	d.t.Helper()
	b, _ := json.Marshal(body)
	resp, err := d.ts.Client().Post(d.ts.URL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		d.t.Fatalf("%s: %d %s", path, resp.StatusCode, rb)
	}
	if out != nil {
		if err := json.Unmarshal(rb, out); err != nil {
			d.t.Fatal(err)
		}
	}
}

type completion struct {
	Content string `json:"content"`
	Timings struct {
		PromptN  int     `json:"prompt_n"`
		CacheN   int     `json:"cache_n"`
		PromptMs float64 `json:"prompt_ms"`
	} `json:"timings"`
}

func (d *decoder) complete(tokens []int) completion {
	d.t.Helper()
	var c completion
	d.post("/completion", map[string]any{"prompt": tokens, "n_predict": 24, "id_slot": 0}, &c)
	return c
}

// share shares slot 0 and returns the message (the caller closes it) and
// the share_id.
func (d *decoder) share() (*fdpass.Message, int64) {
	d.t.Helper()
	l, err := fdpass.Listen(d.t.TempDir(), "share")
	if err != nil {
		d.t.Fatal(err)
	}
	defer l.Close()
	type res struct {
		id  int64
		err error
	}
	rc := make(chan res, 1)
	go func() {
		b, _ := json.Marshal(map[string]string{"socket": l.Path()})
		resp, err := d.ts.Client().Post(d.ts.URL+"/slots/0?action=share", "application/json", bytes.NewReader(b))
		if err != nil {
			rc <- res{err: err}
			return
		}
		defer resp.Body.Close()
		var r struct {
			ShareID int64 `json:"share_id"`
		}
		err = json.NewDecoder(resp.Body).Decode(&r)
		rc <- res{r.ShareID, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	conn, err := l.Accept(deadline)
	if err != nil {
		d.t.Fatal(err)
	}
	defer conn.Close()
	msg, err := conn.Receive(deadline, fdpass.MaxFDs)
	if err != nil {
		d.t.Fatal(err)
	}
	r := <-rc
	if r.err != nil || r.id == 0 {
		msg.Close()
		d.t.Fatalf("share: %v", r.err)
	}
	return msg, r.id
}

// gatePrompt is a prompt of n tokens (BOS first).
func gatePrompt(n, salt int) []int {
	p := make([]int, n)
	p[0] = simkv.TokBOS
	for i := 1; i < n; i++ {
		p[i] = simkv.WordBase + (i*7+salt)%100
	}
	return p
}

// sharedRun runs the provider binary on slot 0's share with extra args and
// adopts on success; it returns the provider's exit and last stderr line.
func (d *decoder) sharedRun(tokens []int, args ...string) simRun {
	d.t.Helper()
	msg, id := d.share()
	defer msg.Close()
	dir := d.t.TempDir()
	layout := filepath.Join(dir, "r.json")
	if err := os.WriteFile(layout, msg.Raw, 0o600); err != nil {
		d.t.Fatal(err)
	}
	tokFile := filepath.Join(dir, "r.tokens")
	if err := provider.WriteTokens(tokFile, tokens); err != nil {
		d.t.Fatal(err)
	}
	fds := make([]string, len(msg.Files))
	for i := range fds {
		fds[i] = fmt.Sprint(3 + i)
	}
	r := runSim(d.t, context.Background(), msg.Files, append(args, "--tokens", tokFile, "--model", d.model, "--layout", layout, "--fds", strings.Join(fds, ","))...)
	if r.code == 0 {
		d.post("/slots/0?action=adopt", map[string]any{"tokens": tokens, "share_id": id}, nil)
	}
	return r
}

// fileRun runs the provider binary on the file route and restores.
func (d *decoder) fileRun(tokens []int, name string) {
	d.t.Helper()
	tokFile := filepath.Join(d.t.TempDir(), "r.tokens")
	if err := provider.WriteTokens(tokFile, tokens); err != nil {
		d.t.Fatal(err)
	}
	r := runSim(d.t, context.Background(), nil, "--n-layer", fmt.Sprint(tinyLayers), "--cell-size", fmt.Sprint(tinyCell),
		"--tokens", tokFile, "--model", d.model, "--state", filepath.Join(d.dir, name))
	if r.code != 0 {
		d.t.Fatalf("provider: exit %d: %s", r.code, r.lastLine)
	}
	d.post("/slots/0?action=restore", map[string]string{"filename": name}, nil)
}

// TestGateHonest is the gate with honest costs (full cells everywhere, no
// --compact): plain, file and shared routes give identical greedy text, the
// handed-over routes with prompt_n 1; an incremental handoff (--start P on
// top of cells the slot kept) gives the text of the whole prompt, and a wrong
// prefix under it changes the text.
func TestGateHonest(t *testing.T) {
	d := startDecoder(t)
	prompt := gatePrompt(700, 0)
	plain := d.complete(prompt)
	d.post("/slots/0?action=erase", nil, nil)

	d.fileRun(prompt, "gate.bin")
	if c := d.complete(prompt); c.Content != plain.Content || c.Timings.PromptN != 1 {
		t.Errorf("file route: %q prompt_n %d, want %q 1", c.Content, c.Timings.PromptN, plain.Content)
	}
	fi, err := os.Stat(filepath.Join(d.dir, "gate.bin"))
	if err != nil || fi.Size() < int64(len(prompt)*tinyCell) {
		t.Errorf("the file route's state is %v bytes, want at least %d (full cells): %v", fi.Size(), len(prompt)*tinyCell, err)
	}

	if r := d.sharedRun(prompt); r.code != 0 {
		t.Fatalf("shared: exit %d: %s", r.code, r.lastLine)
	}
	if c := d.complete(prompt); c.Content != plain.Content || c.Timings.PromptN != 1 {
		t.Errorf("shared route: %q prompt_n %d, want %q 1", c.Content, c.Timings.PromptN, plain.Content)
	}

	// The next turn: the prompt grows; the slot holds the first turn's cells.
	next := append(append([]int{}, prompt...), gatePrompt(300, 5)[1:]...)
	d.post("/slots/0?action=erase", nil, nil)
	want := d.complete(next)
	for _, tc := range []struct {
		name   string
		prefix []int // what the slot's cells hold before the share
		same   bool
	}{
		{"right prefix", prompt, true},
		{"wrong prefix", gatePrompt(700, 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d.t = t
			d.post("/slots/0?action=erase", nil, nil)
			d.fileRun(tc.prefix, "prefix.bin") // cells 0..P-1, as an earlier turn left them
			if r := d.sharedRun(next, "--start", fmt.Sprint(len(prompt))); r.code != 0 {
				t.Fatalf("--start: exit %d: %s", r.code, r.lastLine)
			}
			c := d.complete(next)
			if (c.Content == want.Content) != tc.same || c.Timings.PromptN != 1 {
				t.Errorf("incremental handoff: %q prompt_n %d; whole prompt %q; want same %v", c.Content, c.Timings.PromptN, want.Content, tc.same)
			}
		})
	}
	d.t = t

	// --start past cells that hold nothing: refused before writing.
	fresh := startDecoder(t)
	if r := fresh.sharedRun(next, "--start", fmt.Sprint(len(prompt))); r.code != ExitInvalid || !strings.Contains(r.lastLine, "cannot continue from the cells in the region: cell 699 of the region holds no KV") {
		t.Errorf("--start on empty cells: exit %d %q", r.code, r.lastLine)
	}
}
