package decodersim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/internal/simkv"
)

const promptText = "The decoder and the prefill share the cache of one slot"

// TestPromptCache walks one slot through the prompt cache rules.
func TestPromptCache(t *testing.T) {
	s := startSim(t, testConfig(t))
	p := simkv.Tokenize(promptText, true)
	n := len(p)

	first := s.complete(map[string]any{"prompt": promptText, "n_predict": 8})
	if first.Timings.PromptN != n || first.Timings.CacheN != 0 || first.TokensEval != n {
		t.Fatalf("cold: prompt_n %d cache_n %d tokens_evaluated %d, want %d 0 %d", first.Timings.PromptN, first.Timings.CacheN, first.TokensEval, n, n)
	}
	if len(first.Tokens) != 8 || first.StopType != stopLimit && first.StopType != stopEOS {
		t.Fatalf("cold: %d tokens, stop_type %q", len(first.Tokens), first.StopType)
	}
	if first.TokensCached != n+len(first.Tokens)-1 {
		t.Errorf("tokens_cached %d, want prompt+generated-1 = %d", first.TokensCached, n+len(first.Tokens)-1)
	}

	changed := append(append([]int{}, p[:n-3]...), simkv.Tokenize(" slot token", false)...)
	tests := []struct {
		name              string
		body              map[string]any
		promptN, cacheN   int
		sameContentAsCold bool
	}{
		{"same prompt", map[string]any{"prompt": promptText, "n_predict": 8}, 1, n - 1, true},
		{"same prompt as ids", map[string]any{"prompt": p, "n_predict": 8}, 1, n - 1, true},
		{"changed suffix", map[string]any{"prompt": changed, "n_predict": 8}, len(changed) - (n - 3), n - 3, false},
		{"back to the prompt", map[string]any{"prompt": p, "n_predict": 8}, 3, n - 3, true},
		{"cache_prompt false", map[string]any{"prompt": p, "n_predict": 8, "cache_prompt": false}, n, 0, true},
		{"prefill only", map[string]any{"prompt": p, "n_predict": 0}, 1, n - 1, false},
		{"after prefill", map[string]any{"prompt": p, "n_predict": 8}, 1, n - 1, true},
		{"one prompt in a list", map[string]any{"prompt": []any{promptText}, "n_predict": 8}, 1, n - 1, true},
		{"one id list in a list", map[string]any{"prompt": []any{p}, "n_predict": 8}, 1, n - 1, true},
		{"mixed prompt", map[string]any{"prompt": mixed(promptText[:3], p[len(simkv.Tokenize(promptText[:3], true)):]), "n_predict": 8}, 1, n - 1, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.t = t
			c := s.complete(tc.body)
			if c.Timings.PromptN != tc.promptN || c.Timings.CacheN != tc.cacheN {
				t.Errorf("prompt_n %d cache_n %d, want %d %d", c.Timings.PromptN, c.Timings.CacheN, tc.promptN, tc.cacheN)
			}
			if tc.sameContentAsCold && c.Content != first.Content {
				t.Errorf("content %q, want the cold run's %q", c.Content, first.Content)
			}
			if np := tc.body["n_predict"]; np == 0 && (c.Content != "" || len(c.Tokens) != 0 || c.TokensCached != n || c.StopType != stopLimit) {
				t.Errorf("n_predict 0: content %q tokens %v tokens_cached %d stop_type %q", c.Content, c.Tokens, c.TokensCached, c.StopType)
			}
		})
	}

	// The prompt extended by the whole generation reuses prompt+generated-1.
	t.Run("continuation", func(t *testing.T) {
		s.t = t
		s.complete(map[string]any{"prompt": p, "n_predict": 8})
		cont := append(append([]int{}, p...), first.Tokens...)
		c := s.complete(map[string]any{"prompt": cont, "n_predict": 4})
		if c.Timings.CacheN != n+len(first.Tokens)-1 || c.Timings.PromptN != 1 {
			t.Errorf("prompt_n %d cache_n %d, want 1 %d", c.Timings.PromptN, c.Timings.CacheN, n+len(first.Tokens)-1)
		}
	})
}

func TestStopConditions(t *testing.T) {
	s := startSim(t, testConfig(t))
	base := s.complete(map[string]any{"prompt": promptText, "n_predict": 12})
	if len(base.Tokens) < 4 || base.StopType != stopLimit {
		t.Skipf("the sim model ended early on this prompt: %+v", base)
	}
	stop := simkv.Piece(base.Tokens[2])
	want := base.Content[:len(simkv.Detokenize(base.Tokens[:2]))]
	c := s.complete(map[string]any{"prompt": promptText, "n_predict": 12, "stop": []string{"zzz", stop}})
	if c.StopType != stopWord || c.StoppingWord != stop || c.Content != want {
		t.Errorf("stop %q: stop_type %q stopping_word %q content %q, want word %q %q", stop, c.StopType, c.StoppingWord, c.Content, stop, want)
	}
	if c.TokensCached != len(simkv.Tokenize(promptText, true))+len(c.Tokens)-1 {
		t.Errorf("tokens_cached %d after a stop word", c.TokensCached)
	}

	// EOS: about one token in 64; some prompt among a few ends with it.
	for i := range 40 {
		c := s.complete(map[string]any{"prompt": fmt.Sprintf("prompt number %d", i)})
		if c.StopType == stopEOS {
			if last := c.Tokens[len(c.Tokens)-1]; last != simkv.TokEOS || c.Content != simkv.Detokenize(c.Tokens) {
				t.Errorf("eos: tokens %v content %q", c.Tokens, c.Content)
			}
			return
		}
		if c.StopType != stopLimit || len(c.Tokens) != defaultNPredict {
			t.Fatalf("n_predict absent: stop_type %q after %d tokens, want eos or limit at %d", c.StopType, len(c.Tokens), defaultNPredict)
		}
	}
	t.Error("no prompt ended with EOS")
}

// TestTextDependsOnKVMemory: the next token is read from KV memory, so KV
// that differs from what the cache claims changes the text.
func TestTextDependsOnKVMemory(t *testing.T) {
	s := startSim(t, testConfig(t))
	a := s.complete(map[string]any{"prompt": promptText, "n_predict": 8})
	rec := s.srv.kv.cellK(0, 3)
	rec[0] ^= 1 // a stale or wrong cell
	b := s.complete(map[string]any{"prompt": promptText, "n_predict": 8})
	if b.Timings.PromptN != 1 || b.Content == a.Content {
		t.Errorf("after corrupting cell 3: prompt_n %d content %q, want 1 and a different text than %q", b.Timings.PromptN, b.Content, a.Content)
	}
}

// TestSaveEraseRestore runs with full cells (the default: every buffer's
// cells are saved and restored) and with --compact (layer 0's records).
func TestSaveEraseRestore(t *testing.T) {
	for _, compact := range []bool{false, true} {
		t.Run(fmt.Sprintf("compact=%t", compact), func(t *testing.T) { testSaveEraseRestore(t, compact) })
	}
}

func testSaveEraseRestore(t *testing.T, compact bool) {
	cfg := testConfig(t)
	cfg.Compact = compact
	s := startSim(t, cfg)
	n := len(simkv.Tokenize(promptText, true))
	a := s.complete(map[string]any{"prompt": promptText, "n_predict": 8})

	save := s.post("/slots/0?action=save", map[string]string{"filename": "a.bin"}).json(t)
	if save["id_slot"] != 0.0 || save["filename"] != "a.bin" || save["n_saved"] != float64(a.TokensCached) {
		t.Fatalf("save: %v", save)
	}
	fi, err := os.Stat(filepath.Join(cfg.SlotSavePath, "a.bin"))
	if err != nil || save["n_written"] != float64(fi.Size()) {
		t.Fatalf("save wrote %v bytes, the file has %v (%v)", save["n_written"], fi, err)
	}
	// A full state is what llama-server writes: every cell's bytes of
	// every layer, K and V (plus header, tokens and sum).
	wantSize := int64(24 + 4*a.TokensCached + 2*simkv.RecordSize*a.TokensCached + 8)
	if !compact {
		wantSize = int64(32 + 4*a.TokensCached + cfg.CellSize*a.TokensCached + 8)
	}
	if fi.Size() != wantSize {
		t.Errorf("state file of %d cells has %d bytes, want %d", a.TokensCached, fi.Size(), wantSize)
	}
	before := slotBytes(s.srv, 0, a.TokensCached)
	last := s.srv.kv.bufSlot(len(s.srv.kv.bufs)-1, 0, a.TokensCached) // the last layer's V
	if zero := bytes.Count(last, []byte{0}) == len(last); zero != compact {
		t.Errorf("the last layer's V cells all zero: %v; want %v (full cells are evaluated in every layer)", zero, compact)
	}
	if _, ok := save["timings"].(map[string]any)["save_ms"]; !ok {
		t.Errorf("save: no timings.save_ms: %v", save)
	}
	if erase := s.post("/slots/0?action=erase", nil).json(t); erase["n_erased"] != float64(a.TokensCached) {
		t.Fatalf("erase: %v", erase)
	}
	if c := s.complete(map[string]any{"prompt": promptText, "n_predict": 0}); c.Timings.PromptN != n {
		t.Fatalf("after erase prompt_n %d, want %d", c.Timings.PromptN, n)
	}
	s.post("/slots/0?action=erase", nil)
	// Clobber the cells: the restore must bring them back.
	for _, c := range s.srv.kv.chunks {
		clear(c.mem)
	}
	rest := s.post("/slots/0?action=restore", map[string]string{"filename": "a.bin"}).json(t)
	if rest["n_restored"] != float64(a.TokensCached) || rest["n_read"] != save["n_written"] || rest["filename"] != "a.bin" {
		t.Fatalf("restore: %v", rest)
	}
	if after := slotBytes(s.srv, 0, a.TokensCached); !compact && !bytes.Equal(after, before) {
		t.Errorf("a full restore did not bring back every buffer's cells")
	}
	b := s.complete(map[string]any{"prompt": promptText, "n_predict": 8})
	if b.Content != a.Content || b.Timings.PromptN != 1 || b.Timings.CacheN != n-1 {
		t.Errorf("after restore: content %q prompt_n %d cache_n %d, want %q 1 %d", b.Content, b.Timings.PromptN, b.Timings.CacheN, a.Content, n-1)
	}
	entries, _ := os.ReadDir(cfg.SlotSavePath)
	if len(entries) != 1 {
		t.Errorf("slot dir holds %d entries, want only a.bin (no temp files)", len(entries))
	}

	// A state file of another model is refused, and the refusal clears the slot.
	other := testConfig(t)
	other.ModelPath = writeModel(t, "another model")
	other.SlotSavePath = cfg.SlotSavePath
	o := startSim(t, other)
	o.complete(map[string]any{"prompt": promptText, "n_predict": 2})
	o.post("/slots/0?action=save", map[string]string{"filename": "other.bin"})

	// A truncated file is refused too.
	whole, _ := os.ReadFile(filepath.Join(cfg.SlotSavePath, "a.bin"))
	if err := os.WriteFile(filepath.Join(cfg.SlotSavePath, "short.bin"), whole[:len(whole)-5], 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, msg string }{
		{"other.bin", "Unable to restore slot: " + simkv.ErrStateModel.Error()},
		{"short.bin", "Unable to restore slot: " + simkv.ErrStateChecksum.Error()},
	} {
		s.complete(map[string]any{"prompt": promptText, "n_predict": 0})
		r := s.post("/slots/0?action=restore", map[string]string{"filename": tc.file})
		if _, typ, msg := r.errorOf(t); r.status != 400 || typ != "invalid_request_error" || msg != tc.msg {
			t.Errorf("restore %s: %d %s, want 400 %q", tc.file, r.status, r.body, tc.msg)
		}
		if c := s.complete(map[string]any{"prompt": promptText, "n_predict": 0}); c.Timings.PromptN != n {
			t.Errorf("after a failed restore of %s: prompt_n %d, want %d (slot cleared)", tc.file, c.Timings.PromptN, n)
		}
	}

	// A state larger than the slot is refused.
	small := testConfig(t)
	small.SlotSavePath = cfg.SlotSavePath
	small.NCtx = 64
	sm := startSim(t, small)
	long := make([]int, 100)
	for i := range long {
		long[i] = simkv.WordBase + i%50
	}
	s.complete(map[string]any{"prompt": long, "n_predict": 0})
	s.post("/slots/0?action=save", map[string]string{"filename": "long.bin"})
	r := sm.post("/slots/0?action=restore", map[string]string{"filename": "long.bin"})
	if _, _, msg := r.errorOf(t); r.status != 400 || msg != "Unable to restore slot: the state holds 100 tokens, more than the slot's 64 cells" {
		t.Errorf("restore too large: %d %s", r.status, r.body)
	}
}

// TestSlotsAreIndependent: two slots generate concurrently and give the same
// text for the same prompt; a request for any slot lands where its prefix is.
func TestSlotsAreIndependent(t *testing.T) {
	cfg := testConfig(t)
	cfg.NParallel = 2
	cfg.TokenDelay = 2 * time.Millisecond
	s := startSim(t, cfg)
	var wg sync.WaitGroup
	got := make([]completion, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() {
			b, _ := json.Marshal(map[string]any{"prompt": promptText, "n_predict": 10, "id_slot": i})
			resp, err := s.ts.Client().Post(s.ts.URL+"/completion", "application/json", bytesReader(b))
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			errs[i] = json.NewDecoder(resp.Body).Decode(&got[i])
		})
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil || got[i].IDSlot != i {
			t.Fatalf("slot %d: %v, id_slot %d", i, errs[i], got[i].IDSlot)
		}
	}
	if got[0].Content != got[1].Content || got[0].Content == "" {
		t.Errorf("slot texts differ: %q vs %q", got[0].Content, got[1].Content)
	}
	s.complete(map[string]any{"prompt": "something else entirely", "n_predict": 1, "id_slot": 0})
	c := s.complete(map[string]any{"prompt": promptText, "n_predict": 1})
	if c.IDSlot != 1 || c.Timings.PromptN != 1 {
		t.Errorf("id_slot -1 landed on slot %d with prompt_n %d, want slot 1 (longest prefix) and 1", c.IDSlot, c.Timings.PromptN)
	}
}

// TestBusySlotWaits: a save aimed at a busy slot waits and saves what the
// running completion left.
func TestBusySlotWaits(t *testing.T) {
	cfg := testConfig(t)
	cfg.TokenDelay = 5 * time.Millisecond
	s := startSim(t, cfg)
	done := make(chan completion, 1)
	go func() {
		b, _ := json.Marshal(map[string]any{"prompt": promptText, "n_predict": 20, "id_slot": 0})
		resp, err := s.ts.Client().Post(s.ts.URL+"/completion", "application/json", bytesReader(b))
		var c completion
		if err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&c)
			resp.Body.Close()
		}
		done <- c
	}()
	obtest.WaitFor(t, 5*time.Second, "slot 0 processing", func() bool { return s.srv.sched.isBusy(0) })
	save := s.post("/slots/0?action=save", map[string]string{"filename": "busy.bin"}).json(t)
	c := <-done
	if c.TokensCached == 0 || save["n_saved"] != float64(c.TokensCached) {
		t.Errorf("save during a completion saved %v tokens, the completion left %d", save["n_saved"], c.TokensCached)
	}
}

func TestSchedulerFIFO(t *testing.T) {
	sc := newScheduler(2, 16)
	ctx := context.Background()
	s0, _ := sc.acquire(ctx, 0, nil)
	s1, _ := sc.acquire(ctx, 1, nil)
	order := make(chan string, 3)
	var wg sync.WaitGroup
	start := func(name string, want int) {
		wg.Go(func() {
			s, err := sc.acquire(ctx, want, nil)
			if err != nil {
				t.Error(err)
				return
			}
			order <- fmt.Sprintf("%s:%d", name, s.id)
			sc.release(s)
		})
	}
	queued := func(n int) func() bool {
		return func() bool { sc.mu.Lock(); defer sc.mu.Unlock(); return sc.waiters.Len() == n }
	}
	start("a", 0)
	obtest.WaitFor(t, 5*time.Second, "a queued", queued(1))
	start("b", -1)
	obtest.WaitFor(t, 5*time.Second, "b queued", queued(2))

	// A cancelled waiter leaves the queue.
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { _, err := sc.acquire(cctx, 0, nil); errc <- err }()
	obtest.WaitFor(t, 5*time.Second, "c queued", queued(3))
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("cancelled acquire: %v", err)
	}
	obtest.WaitFor(t, 5*time.Second, "c gone", queued(2))

	sc.release(s0) // a (first, wants 0) gets it, then releases to b
	wg.Wait()
	close(order)
	var got []string
	for o := range order {
		got = append(got, o)
	}
	if fmt.Sprint(got) != "[a:0 b:0]" {
		t.Errorf("order %v, want [a:0 b:0]", got)
	}
	sc.release(s1)
	if sc.isBusy(0) || sc.isBusy(1) {
		t.Error("slots still busy after release")
	}
}

// mixed is a prompt of a string followed by token ids.
func mixed(text string, ids []int) []any {
	out := []any{text}
	for _, id := range ids {
		out = append(out, id)
	}
	return out
}

// slotBytes copies slot id's first n cells of every buffer.
func slotBytes(srv *Server, id, n int) []byte {
	var out []byte
	for b := range srv.kv.bufs {
		out = append(out, srv.kv.bufSlot(b, id, n)...)
	}
	return out
}

// TestPromptMsPerToken: --prompt-ms-per-token makes prompt evaluation take
// at least that long per evaluated token, reported in timings.prompt_ms; a
// handed-over prompt (prompt_n 1) pays for one token.
func TestPromptMsPerToken(t *testing.T) {
	cfg := testConfig(t)
	cfg.PromptMsPerToken = 2
	s := startSim(t, cfg)
	p := simkv.Tokenize(promptText, true)
	c := s.complete(map[string]any{"prompt": promptText, "n_predict": 1})
	if c.Timings.PromptN != len(p) || c.Timings.PromptMs < 2*float64(len(p)) {
		t.Errorf("prompt_n %d prompt_ms %.2f, want %d and at least %d", c.Timings.PromptN, c.Timings.PromptMs, len(p), 2*len(p))
	}
	c = s.complete(map[string]any{"prompt": promptText, "n_predict": 1})
	if c.Timings.PromptN != 1 || c.Timings.PromptMs < 2 || c.Timings.PromptMs > float64(len(p)) {
		t.Errorf("cached prompt: prompt_n %d prompt_ms %.2f, want 1 and about 2", c.Timings.PromptN, c.Timings.PromptMs)
	}
}
