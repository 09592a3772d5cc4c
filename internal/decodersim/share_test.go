package decodersim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/internal/simkv"
)

// shared is the outcome of one share: the decoder's reply and the message
// the socket received (the caller closes msg).
type shared struct {
	reply shareReply
	msg   *fdpass.Message
}

// postAsync posts from another goroutine (no t.Fatal there).
func postAsync(s *simServer, path string, body any) <-chan reply {
	ch := make(chan reply, 1)
	b, _ := json.Marshal(body)
	go func() {
		resp, err := s.ts.Client().Post(s.ts.URL+path, "application/json", bytes.NewReader(b))
		if err != nil {
			ch <- reply{status: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		rb, _ := io.ReadAll(resp.Body)
		ch <- reply{status: resp.StatusCode, header: resp.Header, body: rb}
	}()
	return ch
}

// share asks for a share of slot id on a fresh fdpass listener and receives
// the message the way onebitd does.
func share(tb testing.TB, s *simServer, id int) shared {
	tb.Helper()
	l := listen(tb)
	defer l.Close()
	return shareOn(tb, s, id, l)
}

// listen makes a share socket the way onebitd does.
func listen(tb testing.TB) *fdpass.Listener {
	tb.Helper()
	l, err := fdpass.Listen(tb.TempDir(), "share")
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// shareOn shares slot id through the socket of l.
func shareOn(tb testing.TB, s *simServer, id int, l *fdpass.Listener) shared {
	tb.Helper()
	rc := postAsync(s, fmt.Sprintf("/slots/%d?action=share", id), map[string]string{"socket": l.Path()})
	deadline := time.Now().Add(10 * time.Second)
	conn, err := l.Accept(deadline)
	if err != nil {
		r := <-rc
		tb.Fatalf("accept: %v (decoder answered %d %s)", err, r.status, r.body)
	}
	msg, err := conn.Receive(deadline, fdpass.MaxFDs)
	conn.Close()
	r := <-rc
	if err != nil {
		tb.Fatalf("receive: %v", err)
	}
	if r.status != http.StatusOK {
		msg.Close()
		tb.Fatalf("share: %d %s", r.status, r.body)
	}
	var sh shared
	sh.msg = msg
	if err := json.Unmarshal(r.body, &sh.reply); err != nil {
		msg.Close()
		tb.Fatal(err)
	}
	return sh
}

// provide plays the provider: it maps the shared layer-0 K and V regions
// and writes the records of tokens into cells 0..n-1.
func provide(t testing.TB, sh shared, model uint64, tokens []int) {
	t.Helper()
	recs := simkv.Chain(model, tokens)
	for _, rg := range sh.msg.Header.Regions {
		if rg.Layer != 0 {
			continue
		}
		mem, err := unix.Mmap(int(sh.msg.Files[rg.FDIndex].Fd()), rg.Offset, int(rg.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatalf("mmap region %+v: %v", rg, err)
		}
		for i, r := range recs {
			cell := mem[int64(i)*rg.CellStride:]
			if rg.Kind == "k" {
				simkv.PutK(cell, r)
			} else {
				simkv.PutV(cell, r)
			}
		}
		if err := unix.Munmap(mem); err != nil {
			t.Fatal(err)
		}
	}
}

func TestShareAdoptHandoff(t *testing.T) {
	cfg := testConfig(t)
	cfg.NParallel = 2
	plain := startSim(t, cfg)
	s := startSim(t, cfg)
	p := simkv.Tokenize(promptText, true)
	want := plain.complete(map[string]any{"prompt": promptText, "n_predict": 12, "id_slot": 1})

	// Something cached in slot 1 before the share: the share clears it.
	s.complete(map[string]any{"prompt": promptText, "n_predict": 2, "id_slot": 1})
	sh := share(t, s, 1)
	defer sh.msg.Close()

	h := sh.msg.Header
	layout := simkv.Layout{ModelHash: s.srv.modelHash, NCtx: 512, NLayer: 28, CellSize: simkv.DefaultCellSize,
		KVTypeK: "f16", KVTypeV: "f16", FlashAttn: true, NBatch: 2048, NUbatch: 512}
	if h.Version != 1 || h.LayoutHash != layout.Hash() || h.NCtx != 512 || h.NLayer != 28 || h.KVTypeK != "f16" ||
		h.KVTypeV != "f16" || !h.FlashAttn || h.NBatch != 2048 || h.NUbatch != 512 {
		t.Errorf("header %+v, layout hash want %s", h, layout.Hash())
	}
	if len(h.Regions) != 56 || len(sh.msg.Files) != 1 {
		t.Fatalf("%d regions in %d fds, want 56 in 1", len(h.Regions), len(sh.msg.Files))
	}
	for i, rg := range h.Regions {
		if rg.Layer != i/2 || rg.Kind != [2]string{"k", "v"}[i%2] || rg.Size != 256*2048 || rg.CellStride != 2048 ||
			rg.Offset != int64(i)*512*2048+256*2048 {
			t.Errorf("region %d = %+v", i, rg)
		}
	}
	r := sh.reply
	if r.IDSlot != 1 || r.ShareID != 1 || r.NRegions != 56 || r.NFDs != 1 || r.BytesMapped != 56*256*2048 {
		t.Errorf("share reply %+v", r)
	}

	provide(t, sh, s.srv.modelHash, p)
	ad := s.post("/slots/1?action=adopt", map[string]any{"tokens": p, "share_id": r.ShareID}).json(t)
	if ad["id_slot"] != 1.0 || ad["n_adopted"] != float64(len(p)) {
		t.Fatalf("adopt: %v", ad)
	}
	if _, ok := ad["timings"].(map[string]any)["adopt_ms"]; !ok {
		t.Errorf("adopt: no timings.adopt_ms: %v", ad)
	}
	got := s.complete(map[string]any{"prompt": promptText, "n_predict": 12, "id_slot": 1})
	if got.Content != want.Content || got.Timings.PromptN != 1 || got.Timings.CacheN != len(p)-1 {
		t.Errorf("after the handoff: %q prompt_n %d cache_n %d, want %q 1 %d", got.Content, got.Timings.PromptN, got.Timings.CacheN, want.Content, len(p)-1)
	}

	// A provider that writes stale KV (another prompt's cells) changes the text.
	sh2 := share(t, s, 1)
	defer sh2.msg.Close()
	stale := append([]int{}, p...)
	stale[2] = simkv.WordBase // the last cell is evaluated again anyway
	provide(t, sh2, s.srv.modelHash, stale)
	s.post("/slots/1?action=adopt", map[string]any{"tokens": p, "share_id": sh2.reply.ShareID})
	if got := s.complete(map[string]any{"prompt": promptText, "n_predict": 12, "id_slot": 1}); got.Content == want.Content {
		t.Errorf("stale KV gave the same text %q", got.Content)
	}
}

func TestShareClearsSlot(t *testing.T) {
	s := startSim(t, testConfig(t))
	n := len(simkv.Tokenize(promptText, true))
	s.complete(map[string]any{"prompt": promptText, "n_predict": 2})
	sh := share(t, s, 0)
	sh.msg.Close()
	if c := s.complete(map[string]any{"prompt": promptText, "n_predict": 0}); c.Timings.PromptN != n {
		t.Errorf("after share prompt_n %d, want %d: a shared slot's cache must be cleared", c.Timings.PromptN, n)
	}
}

// refused is the one message of every share_id refusal: it says nothing that
// helps guessing (not the slot's last share_id, not whether an id was
// adopted, superseded or voided).
func refused(shareID, slot int) string {
	return fmt.Sprintf("share_id %d is not the pending share of slot %d", shareID, slot)
}

// TestShareIDRules walks the share_id rules on one server. Every refusal
// has the same message, whatever the reason.
func TestShareIDRules(t *testing.T) {
	cfg := testConfig(t)
	cfg.NParallel = 2
	s := startSim(t, cfg)
	toks := simkv.Tokenize("hi", true)
	doShare := func(slot int) {
		sh := share(t, s, slot)
		sh.msg.Close()
	}
	adopt := func(slot int, shareID any) func() reply {
		return func() reply {
			body := map[string]any{"tokens": toks}
			if shareID != nil {
				body["share_id"] = shareID
			}
			return s.post(fmt.Sprintf("/slots/%d?action=adopt", slot), body)
		}
	}
	steps := []struct {
		name   string
		before func()
		do     func() reply
		status int
		msg    string
	}{
		{"first share adopted", func() { doShare(0) }, adopt(0, 1), 200, ""},
		{"reused", nil, adopt(0, 1), 400, refused(1, 0)},
		{"older share", func() { doShare(0); doShare(0) }, adopt(0, 2), 400, refused(2, 0)},
		{"missing", nil, adopt(0, nil), 400, "share_id is required"},
		{"last share", nil, adopt(0, 3), 200, ""},
		{"another slot's share", func() { doShare(1) }, adopt(0, 4), 400, refused(4, 0)},
		{"unknown id", nil, adopt(1, 99), 400, refused(99, 1)},
		{"voided by a completion", func() {
			s.complete(map[string]any{"prompt": "x", "n_predict": 1, "id_slot": 1})
		}, adopt(1, 4), 400, refused(4, 1)},
		{"voided by a new share that failed", func() {
			doShare(1) // 5
			r := s.post("/slots/1?action=share", map[string]string{"socket": "/nonexistent/x.sock"})
			if r.status != 500 {
				t.Errorf("share to nowhere: %d", r.status)
			}
		}, adopt(1, 5), 200, ""},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			s.t = t
			if st.before != nil {
				st.before()
			}
			r := st.do()
			if r.status != st.status {
				t.Fatalf("%d %s, want %d", r.status, r.body, st.status)
			}
			if st.status != 200 {
				if _, typ, msg := r.errorOf(t); typ != "invalid_request_error" || msg != st.msg {
					t.Errorf("%s %q, want invalid_request_error %q", typ, msg, st.msg)
				}
			}
		})
	}
}

func TestLaxShareID(t *testing.T) {
	cfg := testConfig(t)
	cfg.LaxShareID = true
	s := startSim(t, cfg)
	sh := share(t, s, 0)
	sh.msg.Close()
	for _, id := range []any{nil, 1, 1, 42} {
		body := map[string]any{"tokens": []int{1}}
		if id != nil {
			body["share_id"] = id
		}
		if r := s.post("/slots/0?action=adopt", body); r.status != 200 {
			t.Errorf("lax adopt share_id %v: %d %s", id, r.status, r.body)
		}
	}
}

// residentPages counts the pages of b that are in memory (mincore).
func residentPages(t testing.TB, b []byte) int {
	t.Helper()
	vec := make([]byte, (len(b)+pageSize-1)/pageSize)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestShareWritesNothing: -c 20480 maps 2240 MiB in 3 chunks; sharing it
// populates none of it, and evaluating tokens with --compact touches only
// layer 0.
func TestShareWritesNothing(t *testing.T) {
	cfg := testConfig(t)
	cfg.NCtx = 20480
	cfg.Compact = true
	s := startSim(t, cfg)
	kv := s.srv.kv
	if len(kv.chunks) != 3 || kv.totalBytes() != 2240<<20 {
		t.Fatalf("%d chunks of %d bytes, want 3 of 2240 MiB", len(kv.chunks), kv.totalBytes())
	}
	sh := share(t, s, 0)
	defer sh.msg.Close()
	if sh.reply.NFDs != 3 || sh.reply.NRegions != 56 || sh.reply.BytesMapped != 2240<<20 {
		t.Errorf("share reply %+v", sh.reply)
	}
	for i, c := range kv.chunks {
		if n := residentPages(t, c.mem); n != 0 {
			t.Errorf("chunk %d: %d pages resident after a share, want 0", i, n)
		}
	}
	for i, f := range sh.msg.Files {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Blocks != 0 {
			t.Errorf("received fd %d: %d blocks allocated (%v), want 0", i, st.Blocks, err)
		}
	}
	c := s.complete(map[string]any{"prompt": promptText, "n_predict": 4})
	touched := residentPages(t, kv.chunks[0].mem)
	if max := 2 * ((c.TokensCached*2048 + pageSize - 1) / pageSize); touched == 0 || touched > max {
		t.Errorf("%d pages resident after %d cells, want 1..%d (layer 0 only)", touched, c.TokensCached, max)
	}
}

// TestShareRoundedSlots: with -c 8192 -np 6 a slot holds 1364 cells so that
// every region stays page aligned (fdpass.Receive validates alignment).
func TestShareRoundedSlots(t *testing.T) {
	cfg := testConfig(t)
	cfg.NCtx, cfg.NParallel = 8192, 6
	s := startSim(t, cfg)
	sh := share(t, s, 5)
	defer sh.msg.Close()
	if rg := sh.msg.Header.Regions[1]; rg.Size != 1364*2048 || rg.Offset != 8192*2048+5*1364*2048 {
		t.Errorf("slot 5's layer 0 V region %+v", rg)
	}
	if n := s.do("GET", "/props", nil).json(t)["default_generation_settings"].(map[string]any)["n_ctx"]; n != 1364.0 {
		t.Errorf("per-slot n_ctx %v, want 1364", n)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// TestNoFDLeak: failed and successful slot actions leave no fd behind, and
// Close releases the chunk fds.
func TestNoFDLeak(t *testing.T) {
	before := openFDs(t)
	cfg := testConfig(t)
	cfg.NCtx = 20480
	s := startSim(t, cfg)
	s.ts.Client().Transport.(*http.Transport).DisableKeepAlives = true
	withServer := openFDs(t)
	if withServer < before+3 {
		t.Fatalf("%d fds with the server, %d before: the 3 chunk fds are not counted", withServer, before)
	}
	for range 3 {
		sh := share(t, s, 0)
		sh.msg.Close()
		s.post("/slots/0?action=share", map[string]string{"socket": "/nonexistent/x.sock"})
		s.post("/slots/0?action=restore", map[string]string{"filename": "missing.bin"})
		s.post("/slots/0?action=save", map[string]string{"filename": "ok.bin"})
		s.post("/slots/0?action=restore", map[string]string{"filename": "ok.bin"})
	}
	s.ts.Client().CloseIdleConnections()
	obtest.WaitFor(t, 5*time.Second, "fds back to the server's own", func() bool { return openFDs(t) <= withServer })
	s.ts.Close()
	s.srv.Close()
	if after := openFDs(t); after > before {
		t.Errorf("%d fds open after Close, %d before New", after, before)
	}
}
