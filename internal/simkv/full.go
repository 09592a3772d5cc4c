package simkv

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc32"
	"hash/fnv"
	"io"
)

// Full cells. A real decoder keeps every layer's K and V of every cell; the
// records that the model reads live in layer 0 only, but an honest
// simulator writes, saves and restores all of it, so that the file route
// costs what llama-server's does (n_cells x cell size bytes). Fill gives
// every (layer, kind) buffer's cell real bytes derived from the record;
// --compact switches keep only layer 0's records (the old, small behaviour).

// Fill writes cell r's bytes of the (layer, kind) buffer into b, one cell
// stride (len(b) >= RecordSize): r's record as PutK/PutV encode it (salted
// per layer above 0), repeated to the end of b. Layer 0's first RecordSize
// bytes are exactly PutK/PutV's, so the model reads them unchanged.
func Fill(b []byte, r Record, layer int, kind string) {
	salt := uint64(layer) * 0x9e3779b97f4a7c15
	if kind == "v" {
		salt ^= vSalt
	}
	put(b, r, salt)
	for n := RecordSize; n < len(b); {
		n += copy(b[n:], b[:n])
	}
}

// Full state file format (little endian), version 2:
//
//	magic   [8]byte "OBKVSIM1"
//	version u32 (2)
//	n       u32 number of cells
//	hash    u64 StateHash(model)
//	n_layer u32
//	stride  u32 bytes of one cell in one (layer, kind) buffer
//	tokens  n x i32
//	buffers 2 n_layer x (n x stride bytes): layer-major, K then V; each is
//	        cells 0..n-1 of that buffer, as in KV memory
//	sum     u64 CRC-32C (Castagnoli) of everything above
//
// It is what llama-server's slot files are: every layer's K and V rows of
// every cell. Version 1 (WriteState) holds layer 0's records only.

const fullVersion = 2

// MaxFullStateBytes bounds the cell bytes of a full state (n x n_layer x 2 x stride).
const MaxFullStateBytes = 1 << 40

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crcHash is a hash.Hash64 over CRC-32C (the sum is the CRC widened).
type crcHash struct{ c uint32 }

func (h *crcHash) Write(p []byte) (int, error) {
	h.c = crc32.Update(h.c, castagnoli, p)
	return len(p), nil
}
func (h *crcHash) Sum(b []byte) []byte { return binary.LittleEndian.AppendUint64(b, h.Sum64()) }
func (h *crcHash) Reset()              { h.c = 0 }
func (h *crcHash) Size() int           { return 8 }
func (h *crcHash) BlockSize() int      { return 1 }
func (h *crcHash) Sum64() uint64       { return uint64(h.c) }

// WriteFullState writes a version 2 state of tokens: buf(b) returns the
// len(tokens) x stride bytes of buffer b (0 <= b < 2 nLayer, layer-major, K
// then V), which are written as they are (a decoder passes slices of its KV
// memory; a provider fills a scratch buffer per call). It returns the bytes
// written.
func WriteFullState(w io.Writer, model uint64, tokens []int, nLayer, stride int, buf func(b int) []byte) (int64, error) {
	n := len(tokens)
	h := &crcHash{}
	cw := &countingWriter{w: io.MultiWriter(w, h)}
	bw := bufio.NewWriterSize(cw, 1<<16)
	var hdr [32]byte
	copy(hdr[:8], stateMagic[:])
	binary.LittleEndian.PutUint32(hdr[8:], fullVersion)
	binary.LittleEndian.PutUint32(hdr[12:], uint32(n))
	binary.LittleEndian.PutUint64(hdr[16:], StateHash(model))
	binary.LittleEndian.PutUint32(hdr[24:], uint32(nLayer))
	binary.LittleEndian.PutUint32(hdr[28:], uint32(stride))
	bw.Write(hdr[:])
	var b4 [4]byte
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b4[:], uint32(int32(t)))
		bw.Write(b4[:])
	}
	if err := bw.Flush(); err != nil {
		return cw.n, fmt.Errorf("simkv: write state: %w", err)
	}
	want := n * stride
	for b := range 2 * nLayer {
		p := buf(b)
		if len(p) != want {
			return cw.n, fmt.Errorf("simkv: write state: buffer %d has %d bytes, want %d", b, len(p), want)
		}
		if _, err := cw.Write(p); err != nil {
			return cw.n, fmt.Errorf("simkv: write state: %w", err)
		}
	}
	var sum [8]byte
	binary.LittleEndian.PutUint64(sum[:], h.Sum64())
	if _, err := w.Write(sum[:]); err != nil {
		return cw.n, fmt.Errorf("simkv: write state: %w", err)
	}
	return cw.n + 8, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// StateReader reads a state file of either version: NewStateReader checks
// magic, version and model and reads the tokens; then Records (version 1)
// or Buffers (version 2) reads the cells and checks the sum.
type StateReader struct {
	Version int   // 1: layer 0 records only; 2: full cells
	Tokens  []int // the cells' tokens
	NLayer  int   // version 2
	Stride  int   // version 2

	br *bufio.Reader
	h  hash.Hash64
	tr io.Reader
	n  int64
}

// NewStateReader reads the header and tokens of a state file.
func NewStateReader(r io.Reader, model uint64) (*StateReader, error) {
	s := &StateReader{br: bufio.NewReaderSize(r, 1<<16)}
	var hdr [24]byte
	if _, err := io.ReadFull(s.br, hdr[:]); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrStateChecksum, err)
	}
	if [8]byte(hdr[:8]) != stateMagic {
		return nil, ErrStateMagic
	}
	switch v := binary.LittleEndian.Uint32(hdr[8:]); v {
	case stateVersion:
		s.h = fnv.New64a()
	case fullVersion:
		s.h = &crcHash{}
	default:
		return nil, fmt.Errorf("%w: %d", ErrStateVersion, v)
	}
	s.Version = int(binary.LittleEndian.Uint32(hdr[8:]))
	s.h.Write(hdr[:])
	s.tr = io.TeeReader(s.br, s.h)
	s.n = int64(len(hdr))
	n := int(binary.LittleEndian.Uint32(hdr[12:]))
	if n > MaxStateCells {
		return nil, fmt.Errorf("%w: %d cells", ErrStateSize, n)
	}
	if binary.LittleEndian.Uint64(hdr[16:]) != StateHash(model) {
		return nil, ErrStateModel
	}
	if s.Version == fullVersion {
		var g [8]byte
		if _, err := io.ReadFull(s.tr, g[:]); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrStateChecksum, err)
		}
		s.n += 8
		s.NLayer = int(binary.LittleEndian.Uint32(g[0:]))
		s.Stride = int(binary.LittleEndian.Uint32(g[4:]))
		if s.NLayer < 1 || s.Stride < RecordSize || uint64(n)*uint64(s.NLayer)*2*uint64(s.Stride) > MaxFullStateBytes {
			return nil, fmt.Errorf("%w: %d cells of %d layers x %d bytes", ErrStateSize, n, s.NLayer, s.Stride)
		}
	}
	// Read the tokens in pieces: a header claiming many cells does not make
	// a short file allocate for them.
	const piece = 1 << 14
	var b [4 * piece]byte
	s.Tokens = make([]int, 0, min(n, piece))
	for len(s.Tokens) < n {
		k := min(n-len(s.Tokens), piece)
		if _, err := io.ReadFull(s.tr, b[:4*k]); err != nil {
			return nil, fmt.Errorf("%w: tokens: %v", ErrStateChecksum, err)
		}
		for i := range k {
			s.Tokens = append(s.Tokens, int(int32(binary.LittleEndian.Uint32(b[4*i:]))))
		}
	}
	s.n += 4 * int64(n)
	return s, nil
}

// BytesRead is the bytes consumed so far (the whole file after Records or Buffers).
func (s *StateReader) BytesRead() int64 { return s.n }

// checkSum reads the trailing sum and compares it with the hash so far.
func (s *StateReader) checkSum() error {
	want := s.h.Sum64()
	var sum [8]byte
	if _, err := io.ReadFull(s.br, sum[:]); err != nil || binary.LittleEndian.Uint64(sum[:]) != want {
		return ErrStateChecksum
	}
	s.n += 8
	return nil
}

// Records reads a version 1 state's K and V records (RecordSize bytes each).
func (s *StateReader) Records() (k, v [][]byte, err error) {
	if s.Version != stateVersion {
		return nil, nil, fmt.Errorf("%w: version %d has no records section", ErrStateVersion, s.Version)
	}
	n := len(s.Tokens)
	size := int64(n * 2 * RecordSize)
	var body []byte
	for int64(len(body)) < size { // grow with the bytes that arrive
		k := min(size-int64(len(body)), 1<<20)
		start := len(body)
		body = append(body, make([]byte, k)...)
		if _, err := io.ReadFull(s.tr, body[start:]); err != nil {
			return nil, nil, fmt.Errorf("%w: %d of %d bytes: %v", ErrStateChecksum, start, size, err)
		}
	}
	s.n += size
	if err := s.checkSum(); err != nil {
		return nil, nil, err
	}
	k, v = make([][]byte, n), make([][]byte, n)
	for i := range n {
		k[i] = body[i*2*RecordSize : i*2*RecordSize+RecordSize]
		v[i] = body[i*2*RecordSize+RecordSize : (i+1)*2*RecordSize]
	}
	return k, v, nil
}

// Buffers reads a version 2 state's buffers: dst(b) is where buffer b's
// len(Tokens) x Stride bytes go (read straight into it: a decoder passes
// its KV memory). On a sum mismatch the bytes are already in dst: the
// caller must treat dst as garbage (a decoder clears the slot).
func (s *StateReader) Buffers(dst func(b int) []byte) error {
	if s.Version != fullVersion {
		return fmt.Errorf("%w: version %d has no buffers section", ErrStateVersion, s.Version)
	}
	want := len(s.Tokens) * s.Stride
	for b := range 2 * s.NLayer {
		p := dst(b)
		if len(p) != want {
			return fmt.Errorf("simkv: read state: buffer %d is %d bytes, want %d", b, len(p), want)
		}
		if _, err := io.ReadFull(s.tr, p); err != nil {
			return fmt.Errorf("%w: buffer %d of %d: %v", ErrStateChecksum, b, 2*s.NLayer, err)
		}
		s.n += int64(want)
	}
	return s.checkSum()
}
