package providersim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/jsonexact"
	"github.com/onebitd/onebitd/internal/simkv"
)

// ParseHeader parses the layout file (the share header JSON, verbatim as the
// decoder sent it) and validates it against nfds passed fds with
// fdpass.Header.Validate. Keys match exactly; unknown keys and trailing data
// are refused, as onebitd's receiver refuses them.
func ParseHeader(data []byte, nfds int) (fdpass.Header, error) {
	h, err := parseHeader(data, nfds)
	if err != nil {
		return fdpass.Header{}, fmt.Errorf("%w: %v", ErrHeader, err)
	}
	return h, nil
}

func parseHeader(data []byte, nfds int) (fdpass.Header, error) {
	if len(data) > fdpass.MaxHeaderLen {
		return fdpass.Header{}, fmt.Errorf("%d bytes, at most %d accepted", len(data), fdpass.MaxHeaderLen)
	}
	var h fdpass.Header
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return fdpass.Header{}, fmt.Errorf("not a share header: %v", err)
	}
	if dec.More() {
		return fdpass.Header{}, errors.New("data after the header object")
	}
	// Exact keys, unknown ones refused: "FD_INDEX" is not fd_index.
	if err := jsonexact.UnmarshalStrict(raw, &h); err != nil {
		return fdpass.Header{}, fmt.Errorf("not a share header: %v", err)
	}
	if err := h.Validate(nfds); err != nil {
		return fdpass.Header{}, err
	}
	return h, nil
}

// ReadHeaderFile reads and parses the layout file at path.
func ReadHeaderFile(path string, nfds int) (fdpass.Header, error) {
	data, err := readBounded(path, fdpass.MaxHeaderLen)
	if err == nil {
		var h fdpass.Header
		if h, err = parseHeader(data, nfds); err == nil {
			return h, nil
		}
	}
	return fdpass.Header{}, fmt.Errorf("%w %s: %v", ErrHeader, path, err)
}

// LayoutHash is the layout hash a provider running model computes for h:
// the header's geometry with its own model hash, the cell size being the sum
// of every region's cell stride.
func LayoutHash(model uint64, h *fdpass.Header) string {
	var cell int64
	for _, r := range h.Regions {
		cell += r.CellStride
	}
	return simkv.Layout{
		ModelHash: model,
		NCtx:      h.NCtx,
		NLayer:    h.NLayer,
		CellSize:  int(cell),
		KVTypeK:   h.KVTypeK,
		KVTypeV:   h.KVTypeV,
		FlashAttn: h.FlashAttn,
		NBatch:    h.NBatch,
		NUbatch:   h.NUbatch,
	}.Hash()
}

// CheckLayout reports ErrLayoutMismatch when h was not made for model.
func CheckLayout(model uint64, h *fdpass.Header) error {
	if own := LayoutHash(model, h); own != h.LayoutHash {
		return fmt.Errorf("%w: decoder %s, provider model %s", ErrLayoutMismatch, h.LayoutHash, own)
	}
	return nil
}

// Target is one region the provider writes: cell i at Offset + i*Stride in
// the fd at FDIndex. A full target gets every byte of each cell's stride
// (simkv.Fill); a compact one only the RecordSize bytes of layer 0's record.
type Target struct {
	Kind    string
	Layer   int
	FDIndex int
	Offset  int64
	Stride  int64
	Full    bool
}

// Span is the byte range [Offset, Offset+Span(n)) that n cells occupy.
func (t Target) Span(n int) int64 {
	if t.Full {
		return int64(n) * t.Stride
	}
	return int64(n-1)*t.Stride + simkv.RecordSize
}

// Plan checks that h has exactly one layer 0 K and one layer 0 V region and
// that n cells fit every region it returns: with full, every region of h
// (layer 0's K first, then V, then the others in header order), each to be
// written whole; else layer 0's K and V only, records only (--compact).
func Plan(h *fdpass.Header, n int, full bool) ([]Target, error) {
	var out []Target
	for _, kind := range [2]string{"k", "v"} {
		idx := -1
		for j, r := range h.Regions {
			if r.Layer != 0 || r.Kind != kind {
				continue
			}
			if idx >= 0 {
				return nil, fmt.Errorf("%w: regions %d and %d are both layer 0 %s", ErrRegion, idx, j, kind)
			}
			idx = j
		}
		if idx < 0 {
			return nil, fmt.Errorf("%w: the header has no layer 0 %s region", ErrRegion, kind)
		}
		t, err := target(h, idx, n, full)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	if full {
		for j, r := range h.Regions {
			if r.Layer == 0 {
				continue
			}
			t, err := target(h, j, n, full)
			if err != nil {
				return nil, err
			}
			out = append(out, t)
		}
	}
	return out, nil
}

func target(h *fdpass.Header, idx, n int, full bool) (Target, error) {
	r := h.Regions[idx]
	if r.CellStride < simkv.RecordSize {
		return Target{}, fmt.Errorf("%w: layer %d %s region %d has cell_stride %d, less than a %d-byte record",
			ErrRegion, r.Layer, r.Kind, idx, r.CellStride, simkv.RecordSize)
	}
	if cells := r.Size / r.CellStride; int64(n) > cells {
		return Target{}, fmt.Errorf("%w: %d tokens, layer %d %s region %d holds %d cells",
			ErrRegion, n, r.Layer, r.Kind, idx, cells)
	}
	return Target{Kind: r.Kind, Layer: r.Layer, FDIndex: r.FDIndex, Offset: r.Offset, Stride: r.CellStride, Full: full}, nil
}
