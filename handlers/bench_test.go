package handlers

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/slots"
)

// BenchmarkCompletion is one plain-route /completion per op through the
// front (body read and rewrite, machine, events to a Recorder, forward, copy)
// to a fake decoder that drains the body and answers a fixed reply; the
// client is in-process (httptest.ResponseRecorder), so the numbers are the
// front's own work plus one loopback round trip to the fake decoder.
func BenchmarkCompletion(b *testing.B) {
	reply := []byte(`{"content":" the cache","tokens":[],"stop":true,"timings":{"prompt_n":1,"cache_n":15}}`)
	dec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(reply)
	}))
	b.Cleanup(dec.Close)
	for _, n := range []int{16, 12722} {
		b.Run("prompt="+strconv.Itoa(n), func(b *testing.B) {
			client, err := decoder.New(dec.URL, nil)
			if err != nil {
				b.Fatal(err)
			}
			s, err := New(Config{Decoder: client, Pool: slots.New(1, 1), Sink: event.NewRecorder("bench")})
			if err != nil {
				b.Fatal(err)
			}
			body, _ := json.Marshal(map[string]any{"prompt": strings.Repeat(" the", n-1), "n_predict": 4, "temperature": 0})
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				r := httptest.NewRequest(http.MethodPost, "/completion", bytes.NewReader(body))
				s.ServeHTTP(w, r)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}
