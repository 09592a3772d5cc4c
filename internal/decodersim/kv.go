package decodersim

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/simkv"
)

// pageSize is the alignment of every buffer and every shared region.
const pageSize = fdpass.RegionAlign

// maxChunks is the most fds one share message can carry (SCM_MAX_FD).
const maxChunks = 253

// chunk is one memfd, mapped MAP_SHARED for the server's lifetime.
type chunk struct {
	fd   int
	size int64
	mem  []byte
}

// buffer is the KV buffer of one (layer, kind): nCtx cells of stride bytes,
// at off inside chunk ci.
type buffer struct {
	layer int
	kind  string // "k" or "v"
	ci    int
	off   int64
}

// kvMem is the simulated KV cache: 2*nLayer buffers packed greedily into
// memfd chunks of at most chunkSize bytes. A cell is written in every
// buffer (simkv.Fill) when evaluated, saved or restored; with --compact only
// layer 0's records are, and the rest stays sparse (never faulted in).
type kvMem struct {
	nCtx      int   // cells per buffer (-c)
	slotCells int   // cells per slot (see Config.slotCells)
	stride    int64 // bytes per cell per buffer
	chunks    []chunk
	bufs      []buffer // layer-major: (0,k) (0,v) (1,k) …
	k0, v0    []byte   // layer 0's buffers, the only ones that carry records
}

// geometry is the arithmetic of a kvMem, computed without allocating.
type geometry struct {
	bufSize    int64   // nCtx * stride
	chunkSizes []int64 // bytes of each chunk
	offsets    []int64 // per buffer, offset in its chunk
	chunkOf    []int   // per buffer, chunk index
}

// planKV packs 2*nLayer buffers of nCtx*stride bytes into chunks.
func planKV(nCtx, nLayer int, stride, chunkSize int64) (geometry, error) {
	g := geometry{bufSize: int64(nCtx) * stride}
	aligned := alignUp(g.bufSize, pageSize)
	if aligned > chunkSize {
		return g, fmt.Errorf("%w: one KV buffer is %d bytes (-c %d x %d bytes per cell), more than --chunk-size %d",
			ErrConfig, g.bufSize, nCtx, stride, chunkSize)
	}
	var cur int64
	for range 2 * nLayer {
		if len(g.chunkSizes) == 0 || cur+aligned > chunkSize {
			if len(g.chunkSizes) > 0 {
				g.chunkSizes[len(g.chunkSizes)-1] = cur
			}
			g.chunkSizes = append(g.chunkSizes, 0)
			cur = 0
		}
		g.offsets = append(g.offsets, cur)
		g.chunkOf = append(g.chunkOf, len(g.chunkSizes)-1)
		cur += aligned
	}
	g.chunkSizes[len(g.chunkSizes)-1] = cur
	if len(g.chunkSizes) > maxChunks {
		return g, fmt.Errorf("%w: the KV needs %d chunks of --chunk-size %d; one share message carries at most %d fds",
			ErrConfig, len(g.chunkSizes), chunkSize, maxChunks)
	}
	return g, nil
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// newKV creates and maps the chunks. Nothing is written: the memory stays
// unpopulated until a cell is evaluated.
func newKV(nCtx, slotCells, nLayer int, stride, chunkSize int64) (kv *kvMem, err error) {
	g, err := planKV(nCtx, nLayer, stride, chunkSize)
	if err != nil {
		return nil, err
	}
	kv = &kvMem{nCtx: nCtx, slotCells: slotCells, stride: stride}
	defer func() {
		if err != nil {
			kv.close()
		}
	}()
	for i, size := range g.chunkSizes {
		fd, err := unix.MemfdCreate(fmt.Sprintf("onebit-sim-kv-%d", i), unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrKV, os.NewSyscallError("memfd_create", err))
		}
		kv.chunks = append(kv.chunks, chunk{fd: fd, size: size})
		if err := unix.Ftruncate(fd, size); err != nil {
			return nil, fmt.Errorf("%w: chunk %d of %d bytes: %w", ErrKV, i, size, os.NewSyscallError("ftruncate", err))
		}
		mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("%w: chunk %d of %d bytes: %w", ErrKV, i, size, os.NewSyscallError("mmap", err))
		}
		kv.chunks[i].mem = mem
	}
	for b := range g.offsets {
		kind := "k"
		if b%2 == 1 {
			kind = "v"
		}
		kv.bufs = append(kv.bufs, buffer{layer: b / 2, kind: kind, ci: g.chunkOf[b], off: g.offsets[b]})
	}
	kv.k0 = kv.bufMem(0, g.bufSize)
	kv.v0 = kv.bufMem(1, g.bufSize)
	return kv, nil
}

func (kv *kvMem) bufMem(b int, size int64) []byte {
	bf := kv.bufs[b]
	return kv.chunks[bf.ci].mem[bf.off : bf.off+size : bf.off+size]
}

// bufSlot is slot s's cells 0..n-1 in buffer b (n*stride bytes).
func (kv *kvMem) bufSlot(b, s, n int) []byte {
	bf := kv.bufs[b]
	off := bf.off + int64(s*kv.slotCells)*kv.stride
	end := off + int64(n)*kv.stride
	return kv.chunks[bf.ci].mem[off:end:end]
}

// cellK and cellV are the record bytes of cell i of slot s.
func (kv *kvMem) cellK(s, i int) []byte { return kv.record(kv.k0, s, i) }
func (kv *kvMem) cellV(s, i int) []byte { return kv.record(kv.v0, s, i) }

func (kv *kvMem) record(buf []byte, s, i int) []byte {
	off := int64(s*kv.slotCells+i) * kv.stride
	return buf[off : off+simkv.RecordSize : off+simkv.RecordSize]
}

// regions describes slot s's cells in every buffer, for a share header.
// fd_index is the chunk index: the message carries every chunk, in order.
func (kv *kvMem) regions(s int) []fdpass.Region {
	size := int64(kv.slotCells) * kv.stride
	out := make([]fdpass.Region, len(kv.bufs))
	for i, b := range kv.bufs {
		out[i] = fdpass.Region{
			FDIndex:    b.ci,
			Offset:     b.off + int64(s)*size,
			Size:       size,
			Kind:       b.kind,
			Layer:      b.layer,
			CellStride: kv.stride,
		}
	}
	return out
}

// fds are the chunk fds in fd_index order.
func (kv *kvMem) fds() []int {
	out := make([]int, len(kv.chunks))
	for i, c := range kv.chunks {
		out[i] = c.fd
	}
	return out
}

// totalBytes is the size of all chunks.
func (kv *kvMem) totalBytes() int64 {
	var n int64
	for _, c := range kv.chunks {
		n += c.size
	}
	return n
}

// close unmaps and closes every chunk. It is idempotent.
func (kv *kvMem) close() {
	for i := range kv.chunks {
		c := &kv.chunks[i]
		if c.mem != nil {
			_ = unix.Munmap(c.mem)
			c.mem = nil
		}
		if c.fd >= 0 {
			_ = unix.Close(c.fd)
			c.fd = -1
		}
	}
	kv.k0, kv.v0 = nil, nil
}
