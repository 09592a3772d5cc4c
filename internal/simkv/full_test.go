package simkv

import (
	"bytes"
	"errors"
	"testing"
)

// fullBuffers builds the buffers of a full state of tokens: every (layer,
// kind) cell filled with Fill.
func fullBuffers(model uint64, tokens []int, nLayer, stride int) [][]byte {
	recs := Chain(model, tokens)
	out := make([][]byte, 2*nLayer)
	for b := range out {
		out[b] = make([]byte, len(tokens)*stride)
		for i, r := range recs {
			Fill(out[b][i*stride:(i+1)*stride], r, b/2, [2]string{"k", "v"}[b%2])
		}
	}
	return out
}

func TestFill(t *testing.T) {
	r := Chain(3, []int{1, 10})[1]
	k, v, k1 := make([]byte, 256), make([]byte, 256), make([]byte, 256)
	Fill(k, r, 0, "k")
	Fill(v, r, 0, "v")
	Fill(k1, r, 1, "k")
	want := make([]byte, RecordSize)
	PutK(want, r)
	if !bytes.Equal(k[:RecordSize], want) || GetK(k) != r {
		t.Fatal("layer 0 K must start with PutK's record")
	}
	PutV(want, r)
	if !bytes.Equal(v[:RecordSize], want) {
		t.Fatal("layer 0 V must start with PutV's record")
	}
	if bytes.Equal(k, k1) || bytes.Equal(k, v) {
		t.Fatal("layers and kinds must differ")
	}
	for i := RecordSize; i < len(k); i += RecordSize {
		if !bytes.Equal(k[i:i+RecordSize], k[:RecordSize]) {
			t.Fatalf("byte %d: the record is not repeated to the end of the stride", i)
		}
	}
}

func TestFullStateRoundTrip(t *testing.T) {
	tokens := Tokenize(" the cache of the decoder slot", true)
	const nLayer, stride = 3, 128
	bufs := fullBuffers(9, tokens, nLayer, stride)
	var buf bytes.Buffer
	n, err := WriteFullState(&buf, 9, tokens, nLayer, stride, func(b int) []byte { return bufs[b] })
	if err != nil || n != int64(buf.Len()) || n != int64(32+4*len(tokens)+2*nLayer*len(tokens)*stride+8) {
		t.Fatalf("WriteFullState: %d bytes (buffer %d), %v", n, buf.Len(), err)
	}
	raw := buf.Bytes()
	sr, err := NewStateReader(bytes.NewReader(raw), 9)
	if err != nil || sr.Version != 2 || sr.NLayer != nLayer || sr.Stride != stride || len(sr.Tokens) != len(tokens) {
		t.Fatalf("header: %+v %v", sr, err)
	}
	got := make([][]byte, 2*nLayer)
	if err := sr.Buffers(func(b int) []byte { got[b] = make([]byte, len(tokens)*stride); return got[b] }); err != nil {
		t.Fatal(err)
	}
	for b := range bufs {
		if !bytes.Equal(got[b], bufs[b]) {
			t.Fatalf("buffer %d differs", b)
		}
	}
	if sr.BytesRead() != n {
		t.Errorf("read %d of %d bytes", sr.BytesRead(), n)
	}
	if _, _, err := sr.Records(); !errors.Is(err, ErrStateVersion) {
		t.Errorf("Records of a full state: %v", err)
	}
	if _, _, err := ReadState(bytes.NewReader(raw), 9); !errors.Is(err, ErrStateVersion) {
		t.Errorf("ReadState of a full state: %v", err)
	}

	cases := []struct {
		name  string
		data  []byte
		model uint64
		want  error
	}{
		{"other model", raw, 10, ErrStateModel},
		{"truncated", raw[:len(raw)-3], 9, ErrStateChecksum},
		{"flipped data bit", flip(raw, 200), 9, ErrStateChecksum},
		{"bad version", flip(raw, 9), 9, ErrStateVersion},
		{"zero layers", zeroAt(raw, 24, 4), 9, ErrStateSize},
	}
	for _, c := range cases {
		sr, err := NewStateReader(bytes.NewReader(c.data), c.model)
		if err == nil {
			err = sr.Buffers(func(int) []byte { return make([]byte, len(sr.Tokens)*sr.Stride) })
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

func zeroAt(b []byte, at, n int) []byte {
	c := append([]byte(nil), b...)
	clear(c[at : at+n])
	return c
}

// FuzzReadFullState: a state file is outside bytes. The reader never
// panics, never allocates for tokens that do not arrive, and what it accepts
// writes back to the same bytes.
func FuzzReadFullState(f *testing.F) {
	tokens := Tokenize(" the cache", true)
	bufs := fullBuffers(9, tokens, 2, 64)
	var buf bytes.Buffer
	WriteFullState(&buf, 9, tokens, 2, 64, func(b int) []byte { return bufs[b] })
	f.Add(buf.Bytes())
	f.Add([]byte("OBKVSIM1\x02\x00\x00\x00\xff\xff\xff\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sr, err := NewStateReader(bytes.NewReader(data), 9)
		if err != nil || sr.Version != 2 {
			return
		}
		if len(sr.Tokens)*sr.Stride > 1<<20 || sr.NLayer > 64 {
			return // a decoder reads only into its own geometry
		}
		got := make([][]byte, 2*sr.NLayer)
		if err := sr.Buffers(func(b int) []byte { got[b] = make([]byte, len(sr.Tokens)*sr.Stride); return got[b] }); err != nil {
			return
		}
		var out bytes.Buffer
		if _, err := WriteFullState(&out, 9, sr.Tokens, sr.NLayer, sr.Stride, func(b int) []byte { return got[b] }); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), data[:sr.BytesRead()]) {
			t.Fatal("accepted state does not round-trip")
		}
	})
}
