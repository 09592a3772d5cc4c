package simkv

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
)

// State file format (little endian):
//
//	magic   [8]byte "OBKVSIM1"
//	version u32 (1)
//	n       u32 number of cells
//	hash    u64 StateHash(model)
//	tokens  n x i32
//	cells   n x (K record, V record), RecordSize bytes each
//	sum     u64 FNV-1a 64 of everything above
//
// A short or corrupt file fails to load: a restore never half-applies.

var stateMagic = [8]byte{'O', 'B', 'K', 'V', 'S', 'I', 'M', '1'}

const stateVersion = 1

// MaxStateCells bounds n when reading a state file.
const MaxStateCells = 1 << 24

// Errors of the state file format.
var (
	ErrStateMagic    = errors.New("simkv: not a sim state file (bad magic)")
	ErrStateVersion  = errors.New("simkv: unsupported state file version")
	ErrStateModel    = errors.New("simkv: state file was made for another model")
	ErrStateChecksum = errors.New("simkv: state file checksum mismatch (truncated or corrupt)")
	ErrStateSize     = errors.New("simkv: state file too large")
)

// State is a slot's saved KV: tokens and the K/V records of each cell.
type State struct {
	Tokens []int
	K, V   [][]byte // RecordSize each
}

// WriteState writes st in the state file format.
func WriteState(w io.Writer, model uint64, st State) error {
	h := fnv.New64a()
	bw := bufio.NewWriterSize(io.MultiWriter(w, h), 1<<16)
	var hdr [24]byte
	copy(hdr[:8], stateMagic[:])
	binary.LittleEndian.PutUint32(hdr[8:], stateVersion)
	binary.LittleEndian.PutUint32(hdr[12:], uint32(len(st.Tokens)))
	binary.LittleEndian.PutUint64(hdr[16:], StateHash(model))
	bw.Write(hdr[:])
	var b [4]byte
	for _, t := range st.Tokens {
		binary.LittleEndian.PutUint32(b[:], uint32(int32(t)))
		bw.Write(b[:])
	}
	for i := range st.Tokens {
		bw.Write(st.K[i][:RecordSize])
		bw.Write(st.V[i][:RecordSize])
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("simkv: write state: %w", err)
	}
	var sum [8]byte
	binary.LittleEndian.PutUint64(sum[:], h.Sum64())
	if _, err := w.Write(sum[:]); err != nil {
		return fmt.Errorf("simkv: write state: %w", err)
	}
	return nil
}

// ReadState reads a state file and checks magic, version, model and checksum.
// nRead is the number of bytes consumed.
func ReadState(r io.Reader, model uint64) (st State, nRead int64, err error) {
	h := fnv.New64a()
	br := bufio.NewReaderSize(r, 1<<16)
	tr := io.TeeReader(br, h)
	var hdr [24]byte
	if _, err := io.ReadFull(tr, hdr[:]); err != nil {
		return st, 0, fmt.Errorf("%w: %v", ErrStateChecksum, err)
	}
	if [8]byte(hdr[:8]) != stateMagic {
		return st, 0, ErrStateMagic
	}
	if v := binary.LittleEndian.Uint32(hdr[8:]); v != stateVersion {
		return st, 0, fmt.Errorf("%w: %d", ErrStateVersion, v)
	}
	n := int(binary.LittleEndian.Uint32(hdr[12:]))
	if n > MaxStateCells {
		return st, 0, fmt.Errorf("%w: %d cells", ErrStateSize, n)
	}
	if binary.LittleEndian.Uint64(hdr[16:]) != StateHash(model) {
		return st, 0, ErrStateModel
	}
	// Grow with the bytes that actually arrive: a header claiming many
	// cells does not make a short file allocate for them.
	size := int64(n*4 + n*2*RecordSize)
	var bodyBuf bytes.Buffer
	if got, err := io.CopyN(&bodyBuf, tr, size); err != nil {
		return st, 0, fmt.Errorf("%w: %d of %d bytes: %v", ErrStateChecksum, got, size, err)
	}
	body := bodyBuf.Bytes()
	want := h.Sum64()
	var sum [8]byte
	if _, err := io.ReadFull(br, sum[:]); err != nil || binary.LittleEndian.Uint64(sum[:]) != want {
		return st, 0, ErrStateChecksum
	}
	st.Tokens = make([]int, n)
	for i := range n {
		st.Tokens[i] = int(int32(binary.LittleEndian.Uint32(body[i*4:])))
	}
	cells := body[n*4:]
	st.K = make([][]byte, n)
	st.V = make([][]byte, n)
	for i := range n {
		st.K[i] = cells[i*2*RecordSize : i*2*RecordSize+RecordSize]
		st.V[i] = cells[i*2*RecordSize+RecordSize : (i+1)*2*RecordSize]
	}
	return st, int64(len(hdr) + len(body) + 8), nil
}
