package fdpass

// Header is the JSON header of a share message (see doc.go). Field names are
// the wire contract; schemas/share-header.json is its schema.
type Header struct {
	Version    int      `json:"version"`
	LayoutHash string   `json:"layout_hash"`
	NCtx       int      `json:"n_ctx"`
	NLayer     int      `json:"n_layer"`
	KVTypeK    string   `json:"kv_type_k"`
	KVTypeV    string   `json:"kv_type_v"`
	FlashAttn  bool     `json:"flash_attn"`
	NBatch     int      `json:"n_batch"`
	NUbatch    int      `json:"n_ubatch"`
	Regions    []Region `json:"regions"`
}

// Region is one KV buffer (or a slot's part of it) inside a passed fd.
type Region struct {
	FDIndex    int    `json:"fd_index"`
	Offset     int64  `json:"offset"`
	Size       int64  `json:"size"`
	Kind       string `json:"kind"` // "k" or "v"
	Layer      int    `json:"layer"`
	CellStride int64  `json:"cell_stride"`
}

// HeaderVersion is the only header version this package speaks.
const HeaderVersion = 1
