package fdpass

import (
	"fmt"
	"math"
	"sort"
)

// RegionAlign is the alignment of every region's offset and size (one page on
// the machines the decoder runs on; providers mmap regions directly).
const RegionAlign = 4096

// maxLayoutHashLen bounds the layout hash (a hex digest; sim uses 16 digits).
const maxLayoutHashLen = 128

// Validate checks h against the nfds fds that arrived with it:
//
//   - version == HeaderVersion (else ErrVersion);
//   - layout_hash is non-empty hex of at most 128 digits; n_ctx, n_layer,
//     n_batch, n_ubatch are >= 0 (else ErrBadHeader);
//   - there is at least one region, and for every region: fd_index in
//     [0,nfds), offset >= 0, size > 0, offset and size multiples of
//     RegionAlign, offset+size does not overflow, kind "k" or "v",
//     layer >= 0 and < n_layer when n_layer > 0, cell_stride > 0 and
//     size % cell_stride == 0; regions in the same fd do not overlap; every
//     fd is used by at least one region (else ErrRegion).
//
// Region count and fd count need not be equal: a decoder may pack many
// per-layer regions into a few fds.
func (h *Header) Validate(nfds int) error {
	if h.Version != HeaderVersion {
		return fmt.Errorf("%w: got version %d, want %d", ErrVersion, h.Version, HeaderVersion)
	}
	if err := checkHex(h.LayoutHash); err != nil {
		return fmt.Errorf("%w: layout_hash %w", ErrBadHeader, err)
	}
	for _, f := range [...]struct {
		name string
		v    int
	}{{"n_ctx", h.NCtx}, {"n_layer", h.NLayer}, {"n_batch", h.NBatch}, {"n_ubatch", h.NUbatch}} {
		if f.v < 0 {
			return fmt.Errorf("%w: %s is negative (%d)", ErrBadHeader, f.name, f.v)
		}
	}
	if len(h.Regions) == 0 {
		return fmt.Errorf("%w: the header lists no region (%d fds passed)", ErrRegion, nfds)
	}
	used := make([]bool, nfds)
	for i, r := range h.Regions {
		if err := r.check(h.NLayer, nfds); err != nil {
			return fmt.Errorf("%w: region %d: %s", ErrRegion, i, err)
		}
		used[r.FDIndex] = true
	}
	for fd, u := range used {
		if !u {
			return fmt.Errorf("%w: fd %d of %d is used by no region", ErrRegion, fd, nfds)
		}
	}
	return checkOverlap(h.Regions)
}

// check returns a plain description of the first problem of r, or nil.
func (r *Region) check(nLayer, nfds int) error {
	switch {
	case r.FDIndex < 0 || r.FDIndex >= nfds:
		return fmt.Errorf("fd_index %d is outside the %d passed fds", r.FDIndex, nfds)
	case r.Offset < 0:
		return fmt.Errorf("offset %d is negative", r.Offset)
	case r.Size <= 0:
		return fmt.Errorf("size %d is not positive", r.Size)
	case r.Offset%RegionAlign != 0:
		return fmt.Errorf("offset %d is not a multiple of %d", r.Offset, RegionAlign)
	case r.Size%RegionAlign != 0:
		return fmt.Errorf("size %d is not a multiple of %d", r.Size, RegionAlign)
	case r.Offset > math.MaxInt64-r.Size:
		return fmt.Errorf("offset %d + size %d overflows", r.Offset, r.Size)
	case r.Kind != "k" && r.Kind != "v":
		return fmt.Errorf("kind %q is neither \"k\" nor \"v\"", r.Kind)
	case r.Layer < 0 || (nLayer > 0 && r.Layer >= nLayer):
		return fmt.Errorf("layer %d is outside [0,%d)", r.Layer, nLayer)
	case r.CellStride <= 0:
		return fmt.Errorf("cell_stride %d is not positive", r.CellStride)
	case r.Size%r.CellStride != 0:
		return fmt.Errorf("size %d is not a multiple of cell_stride %d", r.Size, r.CellStride)
	}
	return nil
}

// checkOverlap reports two regions of one fd that share a byte. Regions must
// already be individually valid.
func checkOverlap(rs []Region) error {
	idx := make([]int, len(rs))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool {
		ra, rb := &rs[idx[a]], &rs[idx[b]]
		if ra.FDIndex != rb.FDIndex {
			return ra.FDIndex < rb.FDIndex
		}
		return ra.Offset < rb.Offset
	})
	for k := 1; k < len(idx); k++ {
		prev, cur := &rs[idx[k-1]], &rs[idx[k]]
		if prev.FDIndex == cur.FDIndex && cur.Offset < prev.Offset+prev.Size {
			return fmt.Errorf("%w: regions %d and %d overlap in fd %d", ErrRegion, idx[k-1], idx[k], cur.FDIndex)
		}
	}
	return nil
}

func checkHex(s string) error {
	if s == "" {
		return fmt.Errorf("is empty")
	}
	if len(s) > maxLayoutHashLen {
		return fmt.Errorf("is %d characters long, more than %d", len(s), maxLayoutHashLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return fmt.Errorf("%q is not hex (byte %d)", s, i)
		}
	}
	return nil
}
