package decodersim

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/simkv"
)

// shareCtxs are the two contexts compared: 56 MiB in one chunk and 2240 MiB
// in three.
var shareCtxs = []struct {
	name string
	nCtx int
}{{"ctx512", 512}, {"ctx20480", 20480}}

func shareServer(tb testing.TB, nCtx int) *simServer {
	cfg := testConfig(tb)
	cfg.NCtx = nCtx
	return startSim(tb, cfg)
}

// BenchmarkShareFlatInCtx measures one share of slot 0 (HTTP request,
// connect, sendmsg of header + chunk fds, receive) at both contexts. The
// decoder's own share_ms median is reported as share-ms.
func BenchmarkShareFlatInCtx(b *testing.B) {
	for _, c := range shareCtxs {
		b.Run(c.name, func(b *testing.B) {
			s := shareServer(b, c.nCtx)
			l := listen(b)
			defer l.Close()
			var ms []float64
			for b.Loop() {
				sh := shareOn(b, s, 0, l)
				sh.msg.Close()
				ms = append(ms, sh.reply.Timings.ShareMs)
			}
			b.ReportMetric(median(ms), "share-ms")
		})
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// tinyModel is the geometry of the real tiny model the figures of
// ../shared/LLAMA_SERVER.md come from: 2 KiB per cell (4 layers, K and V,
// 256 bytes each).
func tinyModel(tb testing.TB) Config {
	cfg := testConfig(tb)
	cfg.NCtx, cfg.CellSize, cfg.NLayer = 16384, 2048, 4
	return cfg
}

// saveRestoreSizes are the prompt lengths of llama-server's restore figures
// (0.8 / 3.3 / 12 ms on its reference box).
var saveRestoreSizes = []struct {
	tokens      int
	llamaRestMs float64
}{{250, 0.8}, {3200, 3.3}, {12700, 12}}

// BenchmarkSaveRestore saves and restores a slot of n cells of 2 KiB (full
// cells, the default) through the HTTP API. It reports the decoder's own
// save_ms and restore_ms medians and the restore round trip; llama-server's
// restore figure for the same length is reported as llama-restore-ms.
func BenchmarkSaveRestore(b *testing.B) {
	for _, sz := range saveRestoreSizes {
		b.Run(fmt.Sprintf("tokens=%d", sz.tokens), func(b *testing.B) {
			s := startSim(b, tinyModel(b))
			prompt := make([]int, sz.tokens)
			for i := range prompt {
				prompt[i] = simkv.WordBase + i%50
			}
			s.complete(map[string]any{"prompt": prompt, "n_predict": 0})
			var saveMs, restMs, rtt []float64
			for b.Loop() {
				var sv saveReply
				if err := json.Unmarshal(s.post("/slots/0?action=save", map[string]string{"filename": "b.bin"}).body, &sv); err != nil || sv.NSaved != sz.tokens {
					b.Fatalf("save: %+v %v", sv, err)
				}
				t0 := time.Now()
				var rs restoreReply
				if err := json.Unmarshal(s.post("/slots/0?action=restore", map[string]string{"filename": "b.bin"}).body, &rs); err != nil || rs.NRestored != sz.tokens {
					b.Fatalf("restore: %+v %v", rs, err)
				}
				rtt = append(rtt, float64(time.Since(t0).Nanoseconds())/1e6)
				saveMs, restMs = append(saveMs, sv.Timings.SaveMs), append(restMs, rs.Timings.RestoreMs)
			}
			b.ReportMetric(median(saveMs), "save-ms")
			b.ReportMetric(median(restMs), "restore-ms")
			b.ReportMetric(median(rtt), "restore-rtt-ms")
			b.ReportMetric(sz.llamaRestMs, "llama-restore-ms")
		})
	}
}

// adoptRequest is an adopt request body of n tokens as onebitd sends it.
func adoptRequest(n int, shareID int64) []byte {
	toks := make([]int, n)
	for i := range toks {
		toks[i] = simkv.WordBase + i%100
	}
	b, _ := json.Marshal(map[string]any{"tokens": toks, "share_id": shareID})
	return b
}

// BenchmarkAdopt is one adopt of 12 722 tokens through the HTTP API (with
// --lax-share-id, so that one share serves every round): the round trip
// onebitd waits for, and the decoder's reported adopt_ms.
func BenchmarkAdopt(b *testing.B) {
	for _, n := range []int{251, 12722} {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			cfg := testConfig(b)
			cfg.NCtx, cfg.LaxShareID = 16384, true
			s := startSim(b, cfg)
			body := adoptRequest(n, 1)
			var ms []float64
			for b.Loop() {
				r := s.post("/slots/0?action=adopt", body)
				var rep struct {
					NAdopted int `json:"n_adopted"`
					Timings  struct {
						AdoptMs float64 `json:"adopt_ms"`
					} `json:"timings"`
				}
				if err := json.Unmarshal(r.body, &rep); err != nil || rep.NAdopted != n {
					b.Fatalf("adopt: %d %s", r.status, r.body)
				}
				ms = append(ms, rep.Timings.AdoptMs)
			}
			b.ReportMetric(median(ms), "adopt-ms")
		})
	}
}
