package fdpass

import (
	"errors"
	"math"
	"testing"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		nfds   int
		mutate func(h *Header)
		want   error
	}{
		{"valid", 2, func(h *Header) {}, nil},
		{"56 regions in 3 fds", 3, func(h *Header) { *h = testHeader(3, 56) }, nil},
		{"uppercase hex hash", 2, func(h *Header) { h.LayoutHash = "ABCDEF0123" }, nil},
		{"n_layer 0 leaves layer unchecked", 2, func(h *Header) { h.NLayer = 0; h.Regions[0].Layer = 99 }, nil},
		{"adjacent regions", 1, func(h *Header) { *h = testHeader(1, 4) }, nil},
		{"version 0", 2, func(h *Header) { h.Version = 0 }, ErrVersion},
		{"version 2", 2, func(h *Header) { h.Version = 2 }, ErrVersion},
		{"empty layout hash", 2, func(h *Header) { h.LayoutHash = "" }, ErrBadHeader},
		{"non-hex layout hash", 2, func(h *Header) { h.LayoutHash = "xyz" }, ErrBadHeader},
		{"long layout hash", 2, func(h *Header) { h.LayoutHash = string(make([]byte, 129)) }, ErrBadHeader},
		{"negative n_ctx", 2, func(h *Header) { h.NCtx = -1 }, ErrBadHeader},
		{"negative n_ubatch", 2, func(h *Header) { h.NUbatch = -1 }, ErrBadHeader},
		{"no regions", 0, func(h *Header) { h.Regions = nil }, ErrRegion},
		{"no regions but fds", 2, func(h *Header) { h.Regions = nil }, ErrRegion},
		{"fd_index negative", 2, func(h *Header) { h.Regions[0].FDIndex = -1 }, ErrRegion},
		{"fd_index = nfds", 2, func(h *Header) { h.Regions[0].FDIndex = 2 }, ErrRegion},
		{"unreferenced fd", 3, func(h *Header) {}, ErrRegion},
		{"negative offset", 2, func(h *Header) { h.Regions[0].Offset = -4096 }, ErrRegion},
		{"zero size", 2, func(h *Header) { h.Regions[0].Size = 0 }, ErrRegion},
		{"negative size", 2, func(h *Header) { h.Regions[0].Size = -4096 }, ErrRegion},
		{"unaligned offset", 2, func(h *Header) { h.Regions[0].Offset = 100 }, ErrRegion},
		{"unaligned size", 2, func(h *Header) { h.Regions[0].Size = 4000; h.Regions[0].CellStride = 40 }, ErrRegion},
		{"offset+size overflows", 2, func(h *Header) { h.Regions[0].Offset = math.MaxInt64 &^ 4095 }, ErrRegion},
		{"kind K", 2, func(h *Header) { h.Regions[0].Kind = "K" }, ErrRegion},
		{"kind empty", 2, func(h *Header) { h.Regions[0].Kind = "" }, ErrRegion},
		{"negative layer", 2, func(h *Header) { h.Regions[0].Layer = -1 }, ErrRegion},
		{"layer = n_layer", 2, func(h *Header) { h.Regions[0].Layer = h.NLayer }, ErrRegion},
		{"zero cell_stride", 2, func(h *Header) { h.Regions[0].CellStride = 0 }, ErrRegion},
		{"size not a multiple of cell_stride", 2, func(h *Header) { h.Regions[0].CellStride = 3000 }, ErrRegion},
		{"overlap", 1, func(h *Header) {
			*h = testHeader(1, 3)
			h.Regions[2].Offset = 0
		}, ErrRegion},
		{"contained overlap, not adjacent in order", 1, func(h *Header) {
			*h = testHeader(1, 3)
			h.Regions[0].Size = 3 * 4096
			h.Regions[1].Offset = 3 * 4096 // now free; region 2 (8192) is inside region 0
		}, ErrRegion},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := testHeader(2, 4)
			tc.mutate(&h)
			err := h.Validate(tc.nfds)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate = %v", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Validate = %v, want %v", err, tc.want)
			}
		})
	}
}
