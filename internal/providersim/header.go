package providersim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/simkv"
)

// ParseHeader parses the layout file (the share header JSON, verbatim as the
// decoder sent it) and validates it against nfds passed fds with
// fdpass.Header.Validate. Unknown fields and trailing data are refused, as
// onebitd's receiver refuses them.
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
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return fdpass.Header{}, fmt.Errorf("not a share header: %v", err)
	}
	if dec.More() {
		return fdpass.Header{}, errors.New("data after the header object")
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

// Target is one region the provider writes: records 0..n-1 at
// Offset + i*Stride in the fd at FDIndex.
type Target struct {
	Kind    string
	FDIndex int
	Offset  int64
	Stride  int64
}

// Span is the byte range [Offset, Offset+Span(n)) that n records occupy.
func (t Target) Span(n int) int64 { return int64(n-1)*t.Stride + simkv.RecordSize }

// Plan finds layer 0's K and V regions of h and checks that n records fit
// each of them. It returns the K target, then the V target.
func Plan(h *fdpass.Header, n int) ([2]Target, error) {
	var out [2]Target
	for i, kind := range [2]string{"k", "v"} {
		idx := -1
		for j, r := range h.Regions {
			if r.Layer != 0 || r.Kind != kind {
				continue
			}
			if idx >= 0 {
				return out, fmt.Errorf("%w: regions %d and %d are both layer 0 %s", ErrRegion, idx, j, kind)
			}
			idx = j
		}
		if idx < 0 {
			return out, fmt.Errorf("%w: the header has no layer 0 %s region", ErrRegion, kind)
		}
		r := h.Regions[idx]
		if r.CellStride < simkv.RecordSize {
			return out, fmt.Errorf("%w: layer 0 %s region %d has cell_stride %d, less than a %d-byte record",
				ErrRegion, kind, idx, r.CellStride, simkv.RecordSize)
		}
		if cells := r.Size / r.CellStride; int64(n) > cells {
			return out, fmt.Errorf("%w: %d tokens, layer 0 %s region %d holds %d cells",
				ErrRegion, n, kind, idx, cells)
		}
		out[i] = Target{Kind: kind, FDIndex: r.FDIndex, Offset: r.Offset, Stride: r.CellStride}
	}
	return out, nil
}
