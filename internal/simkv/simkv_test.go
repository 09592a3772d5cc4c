package simkv

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestTokenizeRoundTrip(t *testing.T) {
	cases := []struct {
		text       string
		addSpecial bool
		want       int // token count
	}{
		{"", false, 0},
		{"", true, 1},
		{" the cache", false, 2},
		{" the cache", true, 3},
		{" thecache", false, 9}, // not a word: bytes
		{"héllo wörld", false, len("héllo wörld")},
		{" the\n the", false, 3},
	}
	for _, c := range cases {
		ids := Tokenize(c.text, c.addSpecial)
		if len(ids) != c.want {
			t.Errorf("Tokenize(%q) = %v, want %d tokens", c.text, ids, c.want)
		}
		if got := Detokenize(ids); got != c.text {
			t.Errorf("Detokenize(Tokenize(%q)) = %q", c.text, got)
		}
		for _, id := range ids {
			if !ValidToken(id) {
				t.Errorf("invalid id %d", id)
			}
		}
	}
}

func TestChainDependsOnEveryToken(t *testing.T) {
	a := Chain(1, []int{1, 10, 20, 30})
	b := Chain(1, []int{1, 11, 20, 30})
	c := Chain(2, []int{1, 10, 20, 30})
	if a[0] != b[0] || a[1] == b[1] || a[3] == b[3] {
		t.Fatal("a cell must depend on its prefix and only on it")
	}
	if a[3] == c[3] {
		t.Fatal("the model must change the cells")
	}
	k := make([]byte, RecordSize)
	v := make([]byte, RecordSize)
	PutK(k, a[2])
	PutV(v, a[2])
	if GetK(k) != a[2] || bytes.Equal(k, v) {
		t.Fatal("record encoding")
	}
}

func TestNextDependsOnFold(t *testing.T) {
	seen := map[int]bool{}
	for h := uint64(0); h < 200; h++ {
		n := Next(7, h)
		if !ValidToken(n) {
			t.Fatalf("Next gave invalid %d", n)
		}
		seen[n] = true
	}
	if len(seen) < 20 {
		t.Fatalf("Next barely depends on the fold: %d distinct tokens", len(seen))
	}
}

func TestLayoutHash(t *testing.T) {
	base := Layout{ModelHash: 1, NCtx: 20480, NLayer: 28, CellSize: DefaultCellSize, KVTypeK: "f16", KVTypeV: "f16", FlashAttn: true, NBatch: 2048, NUbatch: 512}
	if again := base; again.Hash() != base.Hash() || len(base.Hash()) != 16 {
		t.Fatal("hash not stable")
	}
	for name, mod := range map[string]func(*Layout){
		"model": func(l *Layout) { l.ModelHash = 2 }, "ctx": func(l *Layout) { l.NCtx = 4096 },
		"fa": func(l *Layout) { l.FlashAttn = false }, "ub": func(l *Layout) { l.NUbatch = 256 },
		"ctk": func(l *Layout) { l.KVTypeK = "q8_0" }, "cell": func(l *Layout) { l.CellSize = 1 },
	} {
		l := base
		mod(&l)
		if l.Hash() == base.Hash() {
			t.Errorf("%s does not change the layout hash", name)
		}
	}
}

func testState(n int) State {
	toks := Tokenize(" the cache of the decoder slot", true)[:min(n, 7)]
	recs := Chain(9, toks)
	st := State{Tokens: toks}
	for _, r := range recs {
		k, v := make([]byte, RecordSize), make([]byte, RecordSize)
		PutK(k, r)
		PutV(v, r)
		st.K, st.V = append(st.K, k), append(st.V, v)
	}
	return st
}

func TestStateRoundTrip(t *testing.T) {
	st := testState(7)
	var buf bytes.Buffer
	if err := WriteState(&buf, 9, st); err != nil {
		t.Fatal(err)
	}
	raw := buf.Bytes()
	got, n, err := ReadState(bytes.NewReader(raw), 9)
	if err != nil || n != int64(len(raw)) {
		t.Fatalf("ReadState: %v (n %d of %d)", err, n, len(raw))
	}
	for i := range st.Tokens {
		if got.Tokens[i] != st.Tokens[i] || !bytes.Equal(got.K[i], st.K[i]) || !bytes.Equal(got.V[i], st.V[i]) {
			t.Fatalf("cell %d differs", i)
		}
	}
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"other model", raw, ErrStateModel},
		{"truncated", raw[:len(raw)-3], ErrStateChecksum},
		{"flipped bit", flip(raw, 30), ErrStateChecksum},
		{"bad magic", flip(raw, 0), ErrStateMagic},
		{"empty", nil, ErrStateChecksum},
	}
	for _, c := range cases {
		model := uint64(9)
		if c.name == "other model" {
			model = 10
		}
		if _, _, err := ReadState(bytes.NewReader(c.data), model); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

func flip(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 1
	return c
}

func TestModelHash(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, []byte("GGUF a"), 0o600)
	os.WriteFile(b, []byte("GGUF b"), 0o600)
	ha, err1 := ModelHash(a)
	hb, err2 := ModelHash(b)
	if err1 != nil || err2 != nil || ha == hb {
		t.Fatalf("%x %x %v %v", ha, hb, err1, err2)
	}
	if _, err := ModelHash(filepath.Join(dir, "none")); err == nil {
		t.Fatal("missing model accepted")
	}
}

// FuzzReadState: a state file is outside bytes (a provider wrote it). The
// reader never panics, never allocates beyond MaxStateCells, and whatever
// it accepts writes back to the same bytes.
func FuzzReadState(f *testing.F) {
	var buf bytes.Buffer
	WriteState(&buf, 9, testState(7))
	f.Add(buf.Bytes())
	f.Add([]byte("OBKVSIM1"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		st, n, err := ReadState(bytes.NewReader(data), 9)
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := WriteState(&out, 9, st); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), data[:n]) {
			t.Fatal("accepted state does not round-trip")
		}
	})
}

func FuzzTokenize(f *testing.F) {
	f.Add(" the cache of", true)
	f.Add("\xff\xfe", false)
	f.Fuzz(func(t *testing.T, s string, special bool) {
		if got := Detokenize(Tokenize(s, special)); got != s {
			t.Fatalf("round trip %q -> %q", s, got)
		}
	})
}
