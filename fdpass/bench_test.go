package fdpass

import (
	"testing"
	"time"
)

// BenchmarkReceive is one share message per op: Send of a 56-region header
// with 3 memfds, Receive, Message.Close, over a socketpair.
func BenchmarkReceive(b *testing.B) {
	r, s := socketPair(b)
	fds := memfds(b, 3)
	h := testHeader(3, 56)
	hdr, err := Encode(&h)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(hdr)))
	b.ReportAllocs()
	for b.Loop() {
		if err := Send(s, hdr, fds); err != nil {
			b.Fatal(err)
		}
		msg, err := r.Receive(time.Now().Add(10*time.Second), 8)
		if err != nil {
			b.Fatal(err)
		}
		if n := msg.Close(); n != 3 {
			b.Fatalf("Close = %d", n)
		}
	}
}

// BenchmarkParseFrame is the pure parse of the same message.
func BenchmarkParseFrame(b *testing.B) {
	h := testHeader(3, 56)
	stream := frame(mustJSON(b, h))
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := parseFrame(stream, 3); err != nil {
			b.Fatal(err)
		}
	}
}
