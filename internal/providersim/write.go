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

// Prefill computes the K and V records of tokens under model, as a real
// prefill would evaluate the prompt.
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
func WriteStateFile(path string, model uint64, tokens []int) (err error) {
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
	if err := simkv.WriteState(f, model, Prefill(model, tokens)); err != nil {
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

// WriteShared writes the records of tokens under model into layer 0's K and V
// regions described by targets (see Plan), in the fds passed as files
// (indexed by fd_index). Only the RecordSize bytes at the start of each of
// the first len(tokens) cells are written; the rest of the regions is not
// touched. Each fd is mapped MAP_SHARED over exactly the page-aligned range
// that holds those records, and unmapped before return.
func WriteShared(files []*os.File, targets [2]Target, model uint64, tokens []int) error {
	n := len(tokens)
	if n == 0 {
		return nil
	}
	recs := simkv.Chain(model, tokens)
	page := int64(os.Getpagesize())
	for _, t := range targets {
		if t.FDIndex < 0 || t.FDIndex >= len(files) {
			return fmt.Errorf("%w: %s region names fd_index %d of %d fds", ErrRegion, t.Kind, t.FDIndex, len(files))
		}
		f := files[t.FDIndex]
		end := t.Offset + t.Span(n)
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return fmt.Errorf("%w: layer 0 %s region: fd %d: %v", ErrRegion, t.Kind, f.Fd(), os.NewSyscallError("fstat", err))
		}
		if st.Size < end {
			return fmt.Errorf("%w: layer 0 %s region needs bytes up to %d of fd %d, which holds %d",
				ErrRegion, t.Kind, end, f.Fd(), st.Size)
		}
		base := t.Offset &^ (page - 1)
		flags := unix.MAP_SHARED
		if t.Stride <= page {
			// Every page of the range gets a record: fault them in with
			// one call (about half the time of one fault per page). With
			// larger strides this would allocate pages never written.
			flags |= unix.MAP_POPULATE
		}
		mem, err := unix.Mmap(int(f.Fd()), base, int(end-base), unix.PROT_WRITE, flags)
		if err != nil {
			return fmt.Errorf("%w: map %d bytes at %d of fd %d: %v", ErrWrite, end-base, base, f.Fd(), os.NewSyscallError("mmap", err))
		}
		put := simkv.PutK
		if t.Kind == "v" {
			put = simkv.PutV
		}
		delta := t.Offset - base
		for i, r := range recs {
			put(mem[delta+int64(i)*t.Stride:], r)
		}
		if err := unix.Munmap(mem); err != nil {
			return fmt.Errorf("%w: %v", ErrWrite, os.NewSyscallError("munmap", err))
		}
	}
	return nil
}
