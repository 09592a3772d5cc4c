package providersim

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/simkv"
)

func TestParseTokens(t *testing.T) {
	tests := []struct {
		name, in string
		want     []int
		errText  string
	}{
		{"ok", "[1, 1000, 3]", []int{1, 1000, 3}, ""},
		{"whitespace", " \n[1]\n", []int{1}, ""},
		{"empty file", "", nil, "not a JSON array"},
		{"object", `{"tokens":[1]}`, nil, "not a JSON array"},
		{"null", "null", nil, "not a JSON array"},
		{"empty array", "[]", nil, "no tokens"},
		{"string id", `["1"]`, nil, "not a JSON array"},
		{"float id", `[1.5]`, nil, "not a JSON array"},
		{"trailing data", `[1] [2]`, nil, "not a JSON array"},
		{"id past the vocabulary", `[1, 1100]`, nil, "token 1100 at index 1 is not in the vocabulary"},
		{"id without a piece", `[1, 999, 0]`, []int{1, 999, 0}, ""},
		{"negative id", `[-1]`, nil, "token -1 at index 0"},
		{"huge id", `[99999999999999999999]`, nil, "not a JSON array"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTokens([]byte(tc.in))
			if tc.errText != "" {
				if !errors.Is(err, ErrTokens) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("err = %v, want ErrTokens containing %q", err, tc.errText)
				}
				return
			}
			if err != nil || !equalInts(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestReadTokensFileErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := ReadTokensFile(filepath.Join(dir, "missing.tokens"))
	if !errors.Is(err, ErrTokens) || !strings.Contains(err.Error(), "cannot open it: no such file") {
		t.Fatalf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.tokens")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxTokensFileSize + 1); err != nil { // sparse
		t.Fatal(err)
	}
	f.Close()
	if _, err := ReadTokensFile(big); !errors.Is(err, ErrTokens) || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversized file: %v", err)
	}
}

func TestParseHeader(t *testing.T) {
	_, model := writeModel(t, t.TempDir(), "a")
	h, _ := makeShare(t, model, defaultGeometry)
	good := headerJSON(t, h)
	tests := []struct {
		name    string
		in      []byte
		nfds    int
		errText string
	}{
		{"ok", good, 4, ""},
		{"fewer fds than regions use", good, 3, "fd_index 3 is outside"},
		{"unused fd", good, 5, "fd 4 of 5 is used by no region"},
		{"not json", []byte("{"), 4, "not a share header"},
		{"unknown field", []byte(`{"version":1,"bogus":1}`), 4, `unknown key "bogus"`},
		{"folded key", bytes.Replace(good, []byte(`"fd_index"`), []byte(`"FD_INDEX"`), 1), 4, `unknown key "FD_INDEX"`},
		{"folded top-level key", bytes.Replace(good, []byte(`"n_layer"`), []byte(`"N_Layer"`), 1), 4, `unknown key "N_Layer"`},
		{"trailing object", append(append([]byte{}, good...), good...), 4, "data after the header"},
		{"version 2", bytes.Replace(good, []byte(`"version":1`), []byte(`"version":2`), 1), 4, "version"},
		{"too large", bytes.Repeat([]byte(" "), fdpass.MaxHeaderLen+1), 4, "at most"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseHeader(tc.in, tc.nfds)
			if tc.errText != "" {
				if !errors.Is(err, ErrHeader) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("err = %v, want ErrHeader containing %q", err, tc.errText)
				}
				return
			}
			if err != nil || got.LayoutHash != h.LayoutHash || len(got.Regions) != 4 {
				t.Fatalf("got %+v, %v", got, err)
			}
		})
	}
}

func TestCheckLayout(t *testing.T) {
	dir := t.TempDir()
	_, a := writeModel(t, dir, "a")
	_, b := writeModel(t, dir, "b")
	h, _ := makeShare(t, a, defaultGeometry)
	if err := CheckLayout(a, &h); err != nil {
		t.Fatalf("same model: %v", err)
	}
	err := CheckLayout(b, &h)
	if !errors.Is(err, ErrLayoutMismatch) {
		t.Fatalf("other model: %v", err)
	}
	want := "layout hash mismatch: decoder " + h.LayoutHash + ", provider model " + LayoutHash(b, &h)
	if got := Reason(err); got != want {
		t.Fatalf("reason %q, want %q", got, want)
	}
	// Every geometry field is part of the hash.
	for name, mut := range map[string]func(*fdpass.Header){
		"n_ctx":       func(h *fdpass.Header) { h.NCtx++ },
		"n_layer":     func(h *fdpass.Header) { h.NLayer++ },
		"kv_type_k":   func(h *fdpass.Header) { h.KVTypeK = "q8_0" },
		"kv_type_v":   func(h *fdpass.Header) { h.KVTypeV = "q8_0" },
		"flash_attn":  func(h *fdpass.Header) { h.FlashAttn = !h.FlashAttn },
		"n_batch":     func(h *fdpass.Header) { h.NBatch++ },
		"n_ubatch":    func(h *fdpass.Header) { h.NUbatch++ },
		"cell_stride": func(h *fdpass.Header) { h.Regions[3].CellStride *= 2 },
	} {
		c := h
		c.Regions = append([]fdpass.Region(nil), h.Regions...)
		mut(&c)
		if err := CheckLayout(a, &c); !errors.Is(err, ErrLayoutMismatch) {
			t.Errorf("%s changed: CheckLayout = %v, want a mismatch", name, err)
		}
	}
}

func TestPlan(t *testing.T) {
	_, model := writeModel(t, t.TempDir(), "a")
	base, _ := makeShare(t, model, geometry{nCtx: 64, nLayer: 2, stride: 2048, packed: true})
	mod := func(f func(h *fdpass.Header)) fdpass.Header {
		c := base
		c.Regions = append([]fdpass.Region(nil), base.Regions...)
		f(&c)
		return c
	}
	tests := []struct {
		name    string
		h       fdpass.Header
		n       int
		errText string
	}{
		{"one token", base, 1, ""},
		{"full", base, 64, ""},
		{"too many", base, 65, "65 tokens, layer 0 k region 0 holds 64 cells"},
		{"no v", mod(func(h *fdpass.Header) { h.Regions[1].Layer = 1 }), 1, "no layer 0 v region"},
		{"two k", mod(func(h *fdpass.Header) { h.Regions[2].Layer = 0 }), 1, "regions 0 and 2 are both layer 0 k"},
		{"stride below record", mod(func(h *fdpass.Header) { h.Regions[0].CellStride = 16 }), 1, "less than a 32-byte record"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Plan(&tc.h, tc.n, false)
			if tc.errText != "" {
				if !errors.Is(err, ErrRegion) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("err = %v, want ErrRegion containing %q", err, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 || got[0].Kind != "k" || got[1].Kind != "v" || got[1].Offset != tc.h.Regions[1].Offset || got[0].Full {
				t.Fatalf("targets %+v", got)
			}
			full, err := Plan(&tc.h, tc.n, true)
			if err != nil || len(full) != len(tc.h.Regions) || full[0] != (Target{Kind: "k", FDIndex: got[0].FDIndex, Offset: got[0].Offset, Stride: got[0].Stride, Full: true}) {
				t.Fatalf("full plan %+v %v", full, err)
			}
		})
	}
}

func TestWriteStateFile(t *testing.T) {
	dir := t.TempDir()
	_, model := writeModel(t, dir, "a")
	tokens := simkv.Tokenize("hello the cache of the slot", true)
	out := filepath.Join(dir, "s.bin")
	if err := os.WriteFile(out+".tmp", []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	small := Geometry{NLayer: 3, Stride: 64}
	if err := WriteStateFile(out, model, tokens, small, false); err != nil {
		t.Fatal(err)
	}
	checkStateFile(t, out, model, tokens, &small)
	if err := WriteStateFile(out, model, tokens, small, true); err != nil {
		t.Fatal(err)
	}
	checkStateFile(t, out, model, tokens, nil)
	if _, err := os.Stat(out + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file left behind: %v", err)
	}
	// A directory that does not exist: an error, nothing left behind.
	err := WriteStateFile(filepath.Join(dir, "nope", "s.bin"), model, tokens, small, false)
	if !errors.Is(err, ErrWrite) {
		t.Fatalf("missing dir: %v", err)
	}
}

// checkStateFile checks the state file at path: a full state of geometry g
// (every buffer's cells filled with simkv.Fill), or with g nil a compact one
// (layer 0's records).
func checkStateFile(t testing.TB, path string, model uint64, tokens []int, g *Geometry) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode %v, want 0600", fi.Mode().Perm())
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sr, err := simkv.NewStateReader(f, model)
	if err != nil {
		t.Fatal(err)
	}
	if !equalInts(sr.Tokens, tokens) {
		t.Fatalf("tokens %v, want %v", sr.Tokens, tokens)
	}
	recs := simkv.Chain(model, tokens)
	if g == nil {
		k, v, err := sr.Records()
		if err != nil {
			t.Fatal(err)
		}
		for i, rec := range recs {
			wk, wv := make([]byte, simkv.RecordSize), make([]byte, simkv.RecordSize)
			simkv.PutK(wk, rec)
			simkv.PutV(wv, rec)
			if !bytes.Equal(k[i], wk) || !bytes.Equal(v[i], wv) {
				t.Fatalf("cell %d differs from simkv.Chain", i)
			}
		}
	} else {
		if sr.Version != 2 || sr.NLayer != g.NLayer || sr.Stride != g.Stride {
			t.Fatalf("state version %d, %d layers x %d bytes; want a full state of %+v", sr.Version, sr.NLayer, sr.Stride, *g)
		}
		bufs := make([][]byte, 2*g.NLayer)
		if err := sr.Buffers(func(b int) []byte { bufs[b] = make([]byte, len(tokens)*g.Stride); return bufs[b] }); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, g.Stride)
		for b, buf := range bufs {
			for i, rec := range recs {
				simkv.Fill(want, rec, b/2, [2]string{"k", "v"}[b%2])
				if !bytes.Equal(buf[i*g.Stride:(i+1)*g.Stride], want) {
					t.Fatalf("buffer %d cell %d differs from simkv.Fill", b, i)
				}
			}
		}
	}
	if sr.BytesRead() != fi.Size() {
		t.Errorf("state read %d of %d bytes", sr.BytesRead(), fi.Size())
	}
}

func TestWriteShared(t *testing.T) {
	_, model := writeModel(t, t.TempDir(), "a")
	for _, g := range []geometry{
		defaultGeometry,
		{nCtx: 64, nLayer: 2, stride: 2048, packed: true},
		{nCtx: 100, nLayer: 3, stride: 96},
	} {
		for _, n := range []int{1, 7, g.nCtx} {
			for _, full := range []bool{false, true} {
				h, files := makeShare(t, model, g)
				tokens := make([]int, n)
				for i := range tokens {
					tokens[i] = simkv.WordBase + i%50
				}
				targets, err := Plan(&h, n, full)
				if err != nil {
					t.Fatal(err)
				}
				if err := WriteShared(files, targets, model, tokens, 0); err != nil {
					t.Fatalf("%+v n=%d full=%v: %v", g, n, full, err)
				}
				checkShared(t, h, files, model, tokens, full)
			}
		}
	}
}

// A region with strides larger than a page stays sparse: only the pages that
// hold records are allocated.
func TestWriteSharedStaysSparse(t *testing.T) {
	_, model := writeModel(t, t.TempDir(), "a")
	h, files := makeShare(t, model, geometry{nCtx: 256, nLayer: 2, stride: 16384, packed: true})
	const n = 10
	targets, err := Plan(&h, n, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteShared(files, targets, model, make([]int, n), 0); err != nil {
		t.Fatal(err)
	}
	fi, err := files[0].Stat()
	if err != nil {
		t.Fatal(err)
	}
	allocated := fi.Sys().(*syscall.Stat_t).Blocks * 512
	if limit := int64(2 * n * os.Getpagesize()); allocated > limit {
		t.Fatalf("%d bytes allocated for %d records per region, want at most %d", allocated, n, limit)
	}
}

func TestWriteSharedShortFD(t *testing.T) {
	_, model := writeModel(t, t.TempDir(), "a")
	h, files := makeShare(t, model, defaultGeometry)
	if err := files[1].Truncate(4096); err != nil { // v region fd shorter than the header says
		t.Fatal(err)
	}
	targets, err := Plan(&h, 10, true)
	if err != nil {
		t.Fatal(err)
	}
	err = WriteShared(files, targets, model, make([]int, 10), 0)
	if !errors.Is(err, ErrRegion) || !strings.Contains(err.Error(), "which holds 4096") {
		t.Fatalf("err = %v", err)
	}
}

func TestMainUsage(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		code    int
		errText string
	}{
		{"no args", nil, 2, "bad command line: --tokens and --model are required"},
		{"unknown flag", []string{"--bogus"}, 2, "flag provided but not defined"},
		{"no route", []string{"--tokens", "t", "--model", "m"}, 2, "give --state"},
		{"both routes", []string{"--tokens", "t", "--model", "m", "--state", "s", "--fds", "3"}, 2, "excludes"},
		{"extra arg", []string{"--tokens", "t", "--model", "m", "--state", "s", "x"}, 2, `unexpected argument "x"`},
		{"fail", []string{"--fail", "--tokens", "t", "--model", "m", "--state", "s"}, 1, "simulated failure"},
		{"fail code", []string{"--fail", "--exit-code", "7", "--tokens", "t", "--model", "m", "--state", "s"}, 7, "simulated failure"},
		{"bad fds", []string{"--tokens", "t", "--model", "m", "--layout", "l", "--fds", "3,x"}, 2, `bad fd "x" in --fds`},
		{"closed fd", []string{"--tokens", "t", "--model", "m", "--layout", "l", "--fds", "1000"}, 2, "fd 1000 of --fds is not open"},
		{"serve without socket", []string{"--serve"}, 2, "--serve takes --socket and no job flags"},
		{"serve with a job", []string{"--serve", "--socket", "/tmp/x.sock", "--tokens", "t"}, 2, "--serve takes --socket and no job flags"},
		{"socket without serve", []string{"--socket", "/tmp/x.sock"}, 2, "--socket needs --serve"},
		{"bad cell size", []string{"--tokens", "t", "--model", "m", "--state", "s", "--cell-size", "100"}, 2, "--cell-size 100"},
		{"negative start", []string{"--tokens", "t", "--model", "m", "--layout", "l", "--fds", "3", "--start", "-1"}, 2, "--start -1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := Main(context.Background(), tc.args, &stderr)
			lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
			if code != tc.code || len(lines) != 1 || !strings.Contains(lines[0], tc.errText) {
				t.Fatalf("code %d stderr %q; want %d and one line containing %q", code, stderr.String(), tc.code, tc.errText)
			}
		})
	}
}

func TestReason(t *testing.T) {
	err := errors.New("providersim: a\nb\tc")
	if got := Reason(err); got != "a b c" {
		t.Fatalf("got %q", got)
	}
	long := Reason(errors.New(strings.Repeat("é", 1000)))
	if len(long) > maxReasonLen+len("…") || !strings.HasSuffix(long, "…") {
		t.Fatalf("long reason %d bytes", len(long))
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
