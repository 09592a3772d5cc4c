package simkv

import (
	"bufio"
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

// ReadState reads a version 1 state file and checks magic, version, model
// and checksum. nRead is the number of bytes consumed.
func ReadState(r io.Reader, model uint64) (st State, nRead int64, err error) {
	sr, err := NewStateReader(r, model)
	if err != nil {
		return st, 0, err
	}
	k, v, err := sr.Records()
	if err != nil {
		return st, 0, err
	}
	return State{Tokens: sr.Tokens, K: k, V: v}, sr.BytesRead(), nil
}
