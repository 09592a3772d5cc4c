package decodersim

import (
	"slices"
	"testing"
	"time"
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

// TestShareFlatInCtx prints the share cost ratio 20480/512 (medians of the
// decoder's share_ms and of the round trip), measured side by side. It
// asserts nothing about time (these machines are noisy): that a share
// copies and touches nothing is asserted by the mincore/fstat test, and the
// numbers come from here and from BenchmarkShareFlatInCtx.
func TestShareFlatInCtx(t *testing.T) {
	if testing.Short() {
		t.Skip("timing test")
	}
	const rounds = 40
	var shareMs, rtt [2]float64
	for i, c := range shareCtxs {
		s := shareServer(t, c.nCtx)
		l := listen(t)
		defer l.Close()
		for range 5 { // warm up connections and caches
			sh := shareOn(t, s, 0, l)
			sh.msg.Close()
		}
		var ms, rt []float64
		for range rounds {
			t0 := time.Now()
			sh := shareOn(t, s, 0, l)
			rt = append(rt, float64(time.Since(t0).Microseconds())/1e3)
			sh.msg.Close()
			ms = append(ms, sh.reply.Timings.ShareMs)
		}
		shareMs[i], rtt[i] = median(ms), median(rt)
		t.Logf("%s: share_ms median %.3f, round trip median %.3f ms", c.name, shareMs[i], rtt[i])
	}
	ratio := shareMs[1] / shareMs[0]
	t.Logf("share_ms ratio ctx20480/ctx512 = %.2f, round trip ratio = %.2f", ratio, rtt[1]/rtt[0])
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
