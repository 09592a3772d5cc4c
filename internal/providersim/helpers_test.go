package providersim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/simkv"
)

// writeModel writes a fake model file and returns its path and hash.
func writeModel(t testing.TB, dir, content string) (string, uint64) {
	t.Helper()
	p := filepath.Join(dir, "model-"+content+".gguf")
	if err := os.WriteFile(p, []byte("GGUF sim model "+content), 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := simkv.ModelHash(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, h
}

// geometry describes the regions a decoder sim would share.
type geometry struct {
	nCtx, nLayer int
	stride       int64
	packed       bool // every region in one fd, else one fd per region
}

var defaultGeometry = geometry{nCtx: 64, nLayer: 2, stride: 2048}

// makeShare creates memfds and a header like the decoder sim: layers
// 0..nLayer-1, a k and a v region each, layer-major order.
func makeShare(t testing.TB, model uint64, g geometry) (fdpass.Header, []*os.File) {
	t.Helper()
	size := int64(g.nCtx) * g.stride
	if size%fdpass.RegionAlign != 0 {
		size += fdpass.RegionAlign - size%fdpass.RegionAlign
	}
	h := fdpass.Header{
		Version: fdpass.HeaderVersion, NCtx: g.nCtx, NLayer: g.nLayer,
		KVTypeK: "f16", KVTypeV: "f16", FlashAttn: true, NBatch: 2048, NUbatch: 512,
	}
	var files []*os.File
	newFD := func(n int64) {
		fd, err := unix.MemfdCreate("test-region", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "test-region")
		t.Cleanup(func() { f.Close() })
		if err := f.Truncate(n); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if g.packed {
		newFD(size * int64(2*g.nLayer))
	}
	for l := range g.nLayer {
		for _, kind := range []string{"k", "v"} {
			r := fdpass.Region{Kind: kind, Layer: l, Size: size, CellStride: g.stride}
			if g.packed {
				r.Offset = int64(len(h.Regions)) * size
			} else {
				newFD(size)
				r.FDIndex = len(files) - 1
			}
			h.Regions = append(h.Regions, r)
		}
	}
	h.LayoutHash = LayoutHash(model, &h)
	return h, files
}

func headerJSON(t testing.TB, h fdpass.Header) []byte {
	t.Helper()
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readAll returns the whole content of f.
func readAll(t testing.TB, f *os.File) []byte {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

// checkShared checks that the regions of h hold exactly the cells of tokens
// and every other byte of every fd is zero (tokens nil: all zero). With full
// every region's cells 0..n-1 hold simkv.Fill's bytes; else only layer 0's K
// and V records are written (--compact).
func checkShared(t testing.TB, h fdpass.Header, files []*os.File, model uint64, tokens []int, full bool) {
	t.Helper()
	mem := make([][]byte, len(files))
	for i, f := range files {
		mem[i] = readAll(t, f)
	}
	recs := simkv.Chain(model, tokens)
	for _, r := range h.Regions {
		if r.Layer != 0 && !full {
			continue
		}
		for i, rec := range recs {
			size := int64(simkv.RecordSize)
			if full {
				size = r.CellStride
			}
			want := make([]byte, size)
			switch {
			case full:
				simkv.Fill(want, rec, r.Layer, r.Kind)
			case r.Kind == "k":
				simkv.PutK(want, rec)
			default:
				simkv.PutV(want, rec)
			}
			at := r.Offset + int64(i)*r.CellStride
			got := mem[r.FDIndex][at : at+size]
			if string(got) != string(want) {
				t.Fatalf("layer %d %s cell %d: got %x, want %x", r.Layer, r.Kind, i, got[:min(len(got), 64)], want[:min(len(want), 64)])
			}
			clear(got) // so the all-zero check below covers the rest
		}
	}
	for i, m := range mem {
		for j, b := range m {
			if b != 0 {
				t.Fatalf("fd %d byte %d is %#x: the provider touched memory outside the cells", i, j, b)
			}
		}
	}
}
