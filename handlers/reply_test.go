package handlers

import (
	"reflect"
	"testing"
)

func tapOf(stream bool, chunks ...string) replyStats {
	t := &replyTap{stream: stream}
	for _, c := range chunks {
		t.Write([]byte(c))
	}
	return t.stats()
}

func TestReplyTap(t *testing.T) {
	native := `{"content":"x","tokens":[4,5,6],"tokens_cached":12,"timings":{"prompt_n":1,"cache_n":9,"prompt_ms":0.5,"predicted_n":3}}`
	chat := `{"choices":[],"timings":{"prompt_n":10,"cache_n":0,"prompt_ms":12.5,"predicted_n":4}}`
	stream := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"choices\":[],\"timings\":{\"prompt_n\":1,\"cache_n\":99,\"prompt_ms\":0.2,\"predicted_n\":5}}\n\ndata: [DONE]\n\n"
	tests := []struct {
		name   string
		stream bool
		chunks []string
		want   replyStats
	}{
		{"native", false, []string{native}, replyStats{ok: true, promptN: 1, cacheN: 9, promptMs: 0.5, predictedN: 3, tokensCached: 12, generated: []int{4, 5, 6}}},
		{"chat", false, []string{chat[:7], chat[7:]}, replyStats{ok: true, promptN: 10, promptMs: 12.5, predictedN: 4, tokensCached: -1}},
		{"stream", true, []string{stream[:30], stream[30:75], stream[75:]}, replyStats{ok: true, promptN: 1, cacheN: 99, promptMs: 0.2, predictedN: 5, tokensCached: -1}},
		{"stream without newline at the end", true, []string{"data: " + native}, replyStats{ok: true, promptN: 1, cacheN: 9, promptMs: 0.5, predictedN: 3, tokensCached: 12}},
		{"no timings", false, []string{`{"content":"x"}`}, replyStats{}},
		{"timings without prompt_ms", false, []string{`{"timings":{"prompt_n":1,"cache_n":2}}`}, replyStats{}},
		{"not JSON", false, []string{`<html>`}, replyStats{}},
		{"error event", true, []string{"data: {\"error\":{\"code\":500}}\n\n"}, replyStats{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tapOf(tc.stream, tc.chunks...); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReplyHolds(t *testing.T) {
	tests := []struct {
		name         string
		st           replyStats
		n, minCache  int
		want         bool
		heldOfPrompt int
	}{
		{"handed over", replyStats{ok: true, promptN: 1, cacheN: 9, predictedN: 3, tokensCached: 12}, 10, 9, true, 10},
		{"handed over, chat", replyStats{ok: true, promptN: 1, cacheN: 9, predictedN: 3, tokensCached: -1}, 10, 9, true, 10},
		{"decoder reused less than trusted", replyStats{ok: true, promptN: 5, cacheN: 5, predictedN: 3, tokensCached: -1}, 10, 8, false, 10},
		{"other prompt length", replyStats{ok: true, promptN: 1, cacheN: 10, predictedN: 3, tokensCached: -1}, 10, 0, false, 10},
		{"tokens_cached inconsistent", replyStats{ok: true, promptN: 10, cacheN: 0, predictedN: 3, tokensCached: 5}, 10, 0, false, 10},
		{"nothing generated", replyStats{ok: true, promptN: 10, cacheN: 0, predictedN: 0, tokensCached: 10}, 10, 0, true, 9},
		{"not reported", replyStats{}, 10, 0, false, 9},
	}
	toks := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.st.holds(tc.n, tc.minCache); got != tc.want {
				t.Fatalf("holds = %v", got)
			}
			if got := len(tc.st.held(toks)); got != tc.heldOfPrompt {
				t.Fatalf("held %d tokens", got)
			}
		})
	}
}

// FuzzReplyTap: a decoder's answer is outside bytes. No panic, and a
// stream gives the same stats however it is cut into reads.
func FuzzReplyTap(f *testing.F) {
	f.Add([]byte("data: {\"timings\":{\"prompt_n\":1,\"cache_n\":9,\"prompt_ms\":0.5}}\n\n"), uint8(7), true)
	f.Add([]byte(`{"tokens_cached":3,"timings":{"prompt_n":1,"cache_n":2,"prompt_ms":1e3,"predicted_n":1}}`), uint8(3), false)
	f.Fuzz(func(t *testing.T, body []byte, cut uint8, stream bool) {
		whole := tapOf(stream, string(body))
		c := int(cut) % (len(body) + 1)
		split := tapOf(stream, string(body[:c]), string(body[c:]))
		if !reflect.DeepEqual(whole, split) {
			t.Fatalf("whole %+v, cut at %d %+v", whole, c, split)
		}
		whole.holds(10, 9)
	})
}
