package providersim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/internal/simkv"
)

// Geometry is the model's KV shape: layers, and bytes of one cell in one
// (layer, kind) buffer. The file route takes it from --n-layer and
// --cell-size (the decoder's own flags, same defaults); the shared route
// reads it from the share header.
type Geometry struct {
	NLayer int
	Stride int
}

// DefaultGeometry is the decoder simulator's default (simkv's Qwen3-0.6B).
var DefaultGeometry = Geometry{NLayer: simkv.DefaultNLayer, Stride: simkv.DefaultCellSize / (2 * simkv.DefaultNLayer)}

// Prefill computes the K and V records of tokens under model, as a real
// prefill would evaluate the prompt (layer 0's records: a compact state).
func Prefill(model uint64, tokens []int) simkv.State {
	recs := simkv.Chain(model, tokens)
	st := simkv.State{Tokens: tokens, K: make([][]byte, len(recs)), V: make([][]byte, len(recs))}
	buf := make([]byte, 2*simkv.RecordSize*len(recs))
	for i, r := range recs {
		k := buf[2*i*simkv.RecordSize:][:simkv.RecordSize]
		v := buf[(2*i+1)*simkv.RecordSize:][:simkv.RecordSize]
		simkv.PutK(k, r)
		simkv.PutV(v, r)
		st.K[i], st.V[i] = k, v
	}
	return st
}

// WriteStateFile writes the state of tokens under model to path atomically:
// the data goes to path+".tmp" (created anew, mode 0600), which is fsynced
// and renamed over path, and the directory is fsynced. path therefore holds a
// complete state or does not exist; on error the temporary file is removed.
//
// The state is full (simkv.WriteFullState: every layer's K and V of every
// cell, n x 2 x g.NLayer x g.Stride bytes, as llama-server writes) unless
// compact (layer 0's records, simkv.WriteState).
func WriteStateFile(path string, model uint64, tokens []int, g Geometry, compact bool) (err error) {
	tmp := path + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: remove stale %s: %v", ErrWrite, tmp, err)
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrWrite, err)
	}
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if compact {
		err = simkv.WriteState(f, model, Prefill(model, tokens))
	} else {
		recs := simkv.Chain(model, tokens)
		scratch := make([]byte, len(tokens)*g.Stride)
		_, err = simkv.WriteFullState(f, model, tokens, g.NLayer, g.Stride, func(b int) []byte {
			layer, kind := b/2, [2]string{"k", "v"}[b%2]
			for i, r := range recs {
				simkv.Fill(scratch[i*g.Stride:(i+1)*g.Stride], r, layer, kind)
			}
			return scratch
		})
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrWrite, tmp, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("%w: %v", ErrWrite, err)
	}
	cerr := f.Close()
	f = nil
	if cerr != nil {
		return fmt.Errorf("%w: %v", ErrWrite, cerr)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("%w: %v", ErrWrite, err)
	}
	if d, derr := os.Open(filepath.Dir(path)); derr == nil {
		derr = d.Sync()
		d.Close()
		if derr != nil && !errors.Is(derr, unix.EINVAL) {
			return fmt.Errorf("%w: sync directory of %s: %v", ErrWrite, path, derr)
		}
	}
	return nil
}

// mapping is one target's cells start..n-1 (and cell start-1, to read the
// prefix) mapped MAP_SHARED.
type mapping struct {
	t     Target
	mem   []byte
	delta int64 // offset of cell 0 relative to mem (may be negative)
}

// cell is the bytes of cell i (a full stride, or the record when compact).
func (m *mapping) cell(i int) []byte {
	at := m.delta + int64(i)*m.t.Stride
	if m.t.Full {
		return m.mem[at : at+m.t.Stride]
	}
	return m.mem[at : at+simkv.RecordSize]
}

// mapTarget maps the page-aligned range of t that holds cells from..n-1.
func mapTarget(files []*os.File, t Target, from, n int) (*mapping, error) {
	if err := checkTarget(files, t, n); err != nil {
		return nil, err
	}
	f := files[t.FDIndex]
	end := t.Offset + t.Span(n)
	page := int64(os.Getpagesize())
	first := t.Offset + int64(from)*t.Stride
	base := first &^ (page - 1)
	flags := unix.MAP_SHARED
	if t.Full || t.Stride <= page {
		// Every page of the range is written: fault them in with one call
		// (about half the time of one fault per page). A compact write with
		// larger strides would allocate pages never written.
		flags |= unix.MAP_POPULATE
	}
	mem, err := unix.Mmap(int(f.Fd()), base, int(end-base), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, fmt.Errorf("%w: map %d bytes at %d of fd %d: %v", ErrWrite, end-base, base, f.Fd(), os.NewSyscallError("mmap", err))
	}
	return &mapping{t: t, mem: mem, delta: t.Offset - base}, nil
}

// WriteShared prefills cells start..len(tokens)-1 under model into the
// targets (see Plan), in the fds passed as files (indexed by fd_index). With
// start > 0 the chain continues from the digest held in cell start-1 of
// layer 0's K region, as a real prefill attends to the cells already there;
// a cell start-1 that holds no record for position start-1 is ErrStart.
//
// A full target's cells are contiguous: they are filled in a scratch buffer
// and copied into the fd with one pwrite (a copy into the decoder's pages,
// without the page-table work of mapping 1.4 GB for a 12 722-token prompt). A
// compact target gets only its records, through a MAP_SHARED mapping of
// exactly the page-aligned range that holds them, unmapped before return.
// Nothing else is touched.
func WriteShared(files []*os.File, targets []Target, model uint64, tokens []int, start int) error {
	n := len(tokens)
	if start < 0 || start > n {
		return fmt.Errorf("%w: --start %d outside 0..%d", ErrStart, start, n)
	}
	if start == n {
		return nil
	}
	for _, t := range targets {
		if err := checkTarget(files, t, n); err != nil {
			return err
		}
	}
	var prev uint64
	if start > 0 {
		var k0 *Target
		for i, t := range targets {
			if t.Layer == 0 && t.Kind == "k" {
				k0 = &targets[i]
			}
		}
		if k0 == nil {
			return fmt.Errorf("%w: no layer 0 k region to read the prefix from", ErrRegion)
		}
		var b [simkv.RecordSize]byte
		if _, err := files[k0.FDIndex].ReadAt(b[:], k0.Offset+int64(start-1)*k0.Stride); err != nil {
			return fmt.Errorf("%w: read cell %d: %v", ErrRegion, start-1, err)
		}
		r := simkv.GetK(b[:])
		if int(r.Pos) != start-1 || !simkv.Valid(r) {
			return fmt.Errorf("%w: cell %d of the region holds no KV for position %d; --start %d needs the prompt's first %d cells there",
				ErrStart, start-1, start-1, start, start)
		}
		prev = r.Digest
	}
	recs := make([]simkv.Record, n-start)
	for i := range recs {
		recs[i] = simkv.Cell(model, prev, tokens[start+i], start+i)
		prev = recs[i].Digest
	}
	var scratch []byte
	for _, t := range targets { // region by region: sequential writes
		if !t.Full {
			if err := writeRecords(files, t, recs, start, n); err != nil {
				return err
			}
			continue
		}
		size := int(t.Stride) * len(recs)
		if cap(scratch) < size {
			scratch = make([]byte, size)
		}
		buf := scratch[:size]
		for i, r := range recs {
			simkv.Fill(buf[i*int(t.Stride):(i+1)*int(t.Stride)], r, t.Layer, t.Kind)
		}
		if _, err := files[t.FDIndex].WriteAt(buf, t.Offset+int64(start)*t.Stride); err != nil {
			return fmt.Errorf("%w: layer %d %s region: %v", ErrWrite, t.Layer, t.Kind, err)
		}
	}
	return nil
}

// checkTarget checks that t names a passed fd that holds its n cells.
func checkTarget(files []*os.File, t Target, n int) error {
	if t.FDIndex < 0 || t.FDIndex >= len(files) {
		return fmt.Errorf("%w: layer %d %s region names fd_index %d of %d fds", ErrRegion, t.Layer, t.Kind, t.FDIndex, len(files))
	}
	f := files[t.FDIndex]
	end := t.Offset + t.Span(n)
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("%w: layer %d %s region: fd %d: %v", ErrRegion, t.Layer, t.Kind, f.Fd(), os.NewSyscallError("fstat", err))
	}
	if st.Size < end {
		return fmt.Errorf("%w: layer %d %s region needs bytes up to %d of fd %d, which holds %d",
			ErrRegion, t.Layer, t.Kind, end, f.Fd(), st.Size)
	}
	return nil
}

// writeRecords writes the records of cells start..n-1 into a compact
// target through a mapping of exactly their pages.
func writeRecords(files []*os.File, t Target, recs []simkv.Record, start, n int) (err error) {
	m, err := mapTarget(files, t, start, n)
	if err != nil {
		return err
	}
	defer func() {
		if uerr := unix.Munmap(m.mem); uerr != nil && err == nil {
			err = fmt.Errorf("%w: %v", ErrWrite, os.NewSyscallError("munmap", uerr))
		}
	}()
	for i, r := range recs {
		if t.Kind == "v" {
			simkv.PutV(m.cell(start+i), r)
		} else {
			simkv.PutK(m.cell(start+i), r)
		}
	}
	return nil
}
