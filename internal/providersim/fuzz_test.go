package providersim

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/simkv"
)

func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{
		"[1,1000,3]", "[]", "null", "[1.0]", `["1"]`, "[1]x", " [2] ", "[-5]", "[1e3]",
		"[99999999999999999999]", "[1,[2]]", "{}", "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tokens, err := ParseTokens(data)
		if err != nil {
			if !errors.Is(err, ErrTokens) {
				t.Fatalf("error %v does not wrap ErrTokens", err)
			}
			return
		}
		if len(tokens) == 0 || len(tokens) > simkv.MaxStateCells {
			t.Fatalf("accepted %d tokens", len(tokens))
		}
		for _, tok := range tokens {
			if !simkv.ValidToken(tok) {
				t.Fatalf("accepted invalid token %d", tok)
			}
		}
	})
}

func FuzzParseHeader(f *testing.F) {
	_, model := writeModel(f, f.TempDir(), "a")
	for _, g := range []geometry{defaultGeometry, {nCtx: 64, nLayer: 2, stride: 2048, packed: true}} {
		h, files := makeShare(f, model, g)
		f.Add(headerJSON(f, h), len(files), 10)
	}
	for _, s := range []string{
		`{}`, `{"version":1}`, `{"version":1,"layout_hash":"ab","regions":[{"fd_index":0,"size":4096,"kind":"k","cell_stride":4096}]}`,
		`{"version":1,"layout_hash":"ab","regions":[{"fd_index":0,"offset":-4096,"size":4096,"kind":"k","cell_stride":1}]}`,
		`{"version":1,"layout_hash":"ab","regions":[{"fd_index":0,"size":4096,"kind":"k","cell_stride":8}]}`,
		`[]`, `null`, `{"version":1} {}`,
	} {
		f.Add([]byte(s), 1, 1)
	}
	f.Fuzz(func(t *testing.T, data []byte, nfds, n int) {
		if nfds < 0 || nfds > 64 {
			return
		}
		h, err := ParseHeader(data, nfds)
		if err != nil {
			if !errors.Is(err, ErrHeader) {
				t.Fatalf("error %v does not wrap ErrHeader", err)
			}
			return
		}
		if err := h.Validate(nfds); err != nil {
			t.Fatalf("accepted header fails Validate: %v", err)
		}
		b, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseHeader(b, nfds); err != nil {
			t.Fatalf("re-encoded header refused: %v", err)
		}
		_ = LayoutHash(model, &h)
		for _, full := range []bool{false, true} {
			targets, err := Plan(&h, n, full)
			if err != nil {
				if !errors.Is(err, ErrRegion) {
					t.Fatalf("Plan error %v does not wrap ErrRegion", err)
				}
				return
			}
			for _, tg := range targets {
				var r *fdpass.Region
				for i, x := range h.Regions {
					if x.Layer == tg.Layer && x.Kind == tg.Kind && x.Offset == tg.Offset && x.FDIndex == tg.FDIndex {
						r = &h.Regions[i]
					}
				}
				if r == nil {
					t.Fatalf("target %+v is no region of the header", tg)
				}
				if n > 0 && tg.Offset+tg.Span(n) > r.Offset+r.Size {
					t.Fatalf("target %+v for %d tokens overruns region %+v", tg, n, r)
				}
			}
		}
	})
}
