package eventlog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/event"
)

// Errors of the event log. Each is wrapped with the path, line or offset.
var (
	// ErrLocked: another process (or another Writer) holds the log open.
	ErrLocked = errors.New("eventlog: the log is open in another writer")
	// ErrClosed: the Writer was closed.
	ErrClosed = errors.New("eventlog: writer closed")
	// ErrBadLine: a line in the middle of a log is not an event.
	ErrBadLine = errors.New("eventlog: bad line")
	// ErrLineTooLong: a line is longer than MaxLineBytes.
	ErrLineTooLong = errors.New("eventlog: line too long")
	// ErrSyncPolicy: an unknown --event-log-sync value.
	ErrSyncPolicy = errors.New("eventlog: unknown sync policy")
)

// SyncPolicy says when appended events are written and fsynced (doc.go
// states what each guarantees).
type SyncPolicy int

// Sync policies.
const (
	// SyncBatch (the default): a background flusher writes and fsyncs the
	// pending events at most every FlushInterval, sooner when BatchBytes
	// are pending. Emit never waits for the disk.
	SyncBatch SyncPolicy = iota
	// SyncAlways: Emit writes and fsyncs its line before returning.
	SyncAlways
	// SyncOff: like SyncBatch without the fsync; only Sync and Close fsync.
	SyncOff
)

// ParseSyncPolicy reads "always", "batch" or "off".
func ParseSyncPolicy(s string) (SyncPolicy, error) {
	switch s {
	case "always":
		return SyncAlways, nil
	case "batch":
		return SyncBatch, nil
	case "off":
		return SyncOff, nil
	}
	return 0, fmt.Errorf("%w %q (want always, batch or off)", ErrSyncPolicy, s)
}

// String is the flag spelling of p.
func (p SyncPolicy) String() string {
	switch p {
	case SyncAlways:
		return "always"
	case SyncBatch:
		return "batch"
	case SyncOff:
		return "off"
	}
	return "SyncPolicy(" + strconv.Itoa(int(p)) + ")"
}

// Group commit parameters.
const (
	// FlushInterval is the longest an event waits in memory under SyncBatch
	// and SyncOff (plus the time of the write itself).
	FlushInterval = 10 * time.Millisecond
	// BatchBytes pending bytes wake the flusher before FlushInterval.
	BatchBytes = 256 << 10
	// MaxPendingBytes caps the memory of a stalled disk: past it, Emit drops
	// events (counted and logged) instead of growing or blocking.
	MaxPendingBytes = 64 << 20
	// chunkBytes is the unit of the pending buffer: Emit encodes into the
	// last chunk and starts a new one when less than chunkSlack is left, so
	// the pending lines are never copied to grow a buffer.
	chunkBytes = 256 << 10
	chunkSlack = 4 << 10
	// maxFreeChunks drained chunks (8 MiB) are kept for reuse.
	maxFreeChunks = 32
)

// chunk is a run of pending lines.
type chunk struct {
	buf    []byte
	events uint64
}

// Log attribute keys.
const (
	attrPath    = "path"
	attrError   = "error"
	attrOffset  = "offset"
	attrBytes   = "bytes"
	attrSavedTo = "saved_to"
	attrEvents  = "events"
	attrReason  = "reason"
)

// TornTail describes a last line that a crash left incomplete: no final
// '\n', or not an event. Open saves it aside and truncates it away; a Reader
// reports it and stops before it. The zero TornTail means none.
type TornTail struct {
	Path    string `json:"path,omitempty"`
	Line    int    `json:"line,omitempty"` // 1-based; 0 when Open did not count lines
	Offset  int64  `json:"offset"`         // where the torn line starts
	Bytes   int64  `json:"bytes"`          // its length, through the end of the file
	Reason  string `json:"reason"`
	SavedTo string `json:"saved_to,omitempty"` // Open only: the copy of the torn bytes
}

// IsZero reports whether there was no torn tail.
func (t TornTail) IsZero() bool { return t.Bytes == 0 }

// Stats counts a Writer's work since Open.
type Stats struct {
	Events      uint64 `json:"events"`       // events written to the file
	Bytes       uint64 `json:"bytes"`        // bytes written
	Syncs       uint64 `json:"syncs"`        // successful fsyncs
	WriteErrors uint64 `json:"write_errors"` // failed writes, truncates and fsyncs
	Dropped     uint64 `json:"dropped"`      // events lost: write errors, over MaxPendingBytes, after Close
}

// Writer appends events to a log file, one JSON line each, with group
// commit. It implements event.Sink. Its methods are safe for concurrent use.
type Writer struct {
	path   string
	policy SyncPolicy
	log    *slog.Logger
	f      *os.File

	// mu guards the pending chunks; writeMu serialises file writes and
	// guards size, spare and failing. Lock order: writeMu, then mu.
	mu           sync.Mutex
	chunks       []chunk  // pending lines; Emit appends to the last chunk
	pendingBytes int      // bytes in chunks
	free         [][]byte // drained chunk buffers, for reuse
	closed       bool

	writeMu    sync.Mutex
	spare      []chunk // the other chunk list, swapped in by take
	size       int64   // file size after the last good write
	failing    bool    // the last write or fsync failed (log once per episode)
	fileClosed bool

	kick    chan struct{} // pending became non-empty
	full    chan struct{} // pending passed BatchBytes
	stop    chan struct{}
	stopped chan struct{}

	events, bytes, syncs, writeErrors, dropped atomic.Uint64
	dropLogged                                 atomic.Bool
}

var _ event.Sink = (*Writer)(nil)

// Open opens (creating it 0600, and its directory 0700) the log at path for
// appending. If the last line is torn (see TornTail) it is copied to
// path+".torn-<unix seconds>", the file is truncated to the end of the last
// good line, a warning is logged and the torn tail is returned; appends go
// on after it. The file is locked (flock) against a second writer. A nil
// logger discards.
func Open(path string, policy SyncPolicy, logger *slog.Logger) (*Writer, TornTail, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if policy < SyncBatch || policy > SyncOff {
		return nil, TornTail{}, fmt.Errorf("%w %d", ErrSyncPolicy, policy)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, TornTail{}, fmt.Errorf("eventlog: create directory of %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, TornTail{}, fmt.Errorf("eventlog: open: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, TornTail{}, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return nil, TornTail{}, fmt.Errorf("eventlog: lock %s: %w", path, os.NewSyscallError("flock", err))
	}
	torn, size, err := repairTail(f, path, logger)
	if err != nil {
		f.Close()
		return nil, TornTail{}, err
	}
	w := &Writer{
		path: path, policy: policy, log: logger.With(attrPath, path), f: f, size: size,
		kick: make(chan struct{}, 1), full: make(chan struct{}, 1),
		stop: make(chan struct{}), stopped: make(chan struct{}),
	}
	if policy == SyncAlways {
		close(w.stopped)
	} else {
		go w.run()
	}
	return w, torn, nil
}

// repairTail finds a torn last line of f, saves it aside and truncates it.
// It returns the torn tail (zero if none) and the resulting file size.
func repairTail(f *os.File, path string, logger *slog.Logger) (TornTail, int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return TornTail{}, 0, fmt.Errorf("eventlog: stat %s: %w", path, err)
	}
	size := fi.Size()
	if size == 0 {
		return TornTail{}, 0, nil
	}
	lastNL, err := lastNewline(f, size)
	if err != nil {
		return TornTail{}, 0, fmt.Errorf("eventlog: scan tail of %s: %w", path, err)
	}
	torn := TornTail{Path: path}
	switch {
	case lastNL < size-1: // bytes after the last '\n'
		torn.Offset = lastNL + 1
		torn.Reason = "last line has no final newline"
	default: // ends with '\n': is the last line an event?
		prevNL, err := lastNewline(f, lastNL)
		if err != nil {
			return TornTail{}, 0, fmt.Errorf("eventlog: scan tail of %s: %w", path, err)
		}
		start := prevNL + 1
		if lastNL-start > MaxLineBytes {
			torn.Offset, torn.Reason = start, "last line is longer than MaxLineBytes"
			break
		}
		line := make([]byte, lastNL-start)
		if _, err := f.ReadAt(line, start); err != nil {
			return TornTail{}, 0, fmt.Errorf("eventlog: read last line of %s: %w", path, err)
		}
		if _, perr := event.Parse(line); perr == nil {
			return TornTail{}, size, nil
		} else {
			torn.Offset, torn.Reason = start, "last line is not an event: "+perr.Error()
		}
	}
	torn.Bytes = size - torn.Offset
	saved, err := saveAside(f, path, torn.Offset, torn.Bytes)
	if err != nil {
		return TornTail{}, 0, err
	}
	torn.SavedTo = saved
	if err := f.Truncate(torn.Offset); err != nil {
		return TornTail{}, 0, fmt.Errorf("eventlog: truncate %s to %d: %w", path, torn.Offset, err)
	}
	if err := f.Sync(); err != nil {
		return TornTail{}, 0, fmt.Errorf("eventlog: fsync %s: %w", path, err)
	}
	logger.Warn("event log had a torn tail; saved it aside and truncated",
		attrPath, path, attrOffset, torn.Offset, attrBytes, torn.Bytes, attrSavedTo, saved, attrReason, torn.Reason)
	return torn, torn.Offset, nil
}

// lastNewline returns the offset of the last '\n' in f[0:end), or -1.
func lastNewline(f *os.File, end int64) (int64, error) {
	const chunk = 64 << 10
	buf := make([]byte, chunk)
	for end > 0 {
		n := int64(chunk)
		if end < n {
			n = end
		}
		if _, err := f.ReadAt(buf[:n], end-n); err != nil {
			return 0, err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			return end - n + int64(i), nil
		}
		end -= n
	}
	return -1, nil
}

// saveAside copies f[off:off+n] to a new path+".torn-<unix>[-k]" file,
// fsynced, and returns its name.
func saveAside(f *os.File, path string, off, n int64) (string, error) {
	base := path + ".torn-" + strconv.FormatInt(time.Now().Unix(), 10)
	name := base
	var out *os.File
	for k := 1; ; k++ {
		var err error
		out, err = os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) || k > 100 {
			return "", fmt.Errorf("eventlog: save torn tail: %w", err)
		}
		name = base + "-" + strconv.Itoa(k)
	}
	_, err := io.Copy(out, io.NewSectionReader(f, off, n))
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
		return "", fmt.Errorf("eventlog: save torn tail to %s: %w", name, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync() // make the new name durable; best effort
		d.Close()
	}
	return name, nil
}

// Path is the log's file name.
func (w *Writer) Path() string { return w.path }

// Policy is the sync policy the Writer was opened with.
func (w *Writer) Policy() SyncPolicy { return w.policy }

// Emit appends e's line. Under SyncAlways it returns once the line is
// written and fsynced; otherwise it only encodes into the pending buffer.
// Failures are counted in Stats and logged at Error level; Emit never
// panics and never returns an error (the request goes on).
func (w *Writer) Emit(e *event.Event) {
	if w.policy == SyncAlways {
		w.writeMu.Lock()
		defer w.writeMu.Unlock()
	}
	w.mu.Lock()
	if w.closed || w.pendingBytes >= MaxPendingBytes {
		closed := w.closed
		w.mu.Unlock()
		w.drop(closed)
		return
	}
	n := len(w.chunks)
	if n == 0 || cap(w.chunks[n-1].buf)-len(w.chunks[n-1].buf) < chunkSlack {
		w.chunks = append(w.chunks, chunk{buf: w.newChunkLocked()})
		n++
	}
	c := &w.chunks[n-1]
	before := len(c.buf)
	c.buf = e.AppendJSON(c.buf)
	c.buf = append(c.buf, '\n')
	c.events++
	wasEmpty := w.pendingBytes == 0
	w.pendingBytes += len(c.buf) - before
	pending := w.pendingBytes
	if w.policy == SyncAlways {
		chunks := w.takeLocked()
		w.mu.Unlock()
		w.writeLocked(chunks, true)
		return
	}
	w.mu.Unlock()
	if wasEmpty {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	if pending >= BatchBytes {
		select {
		case w.full <- struct{}{}:
		default:
		}
	}
}

// newChunkLocked returns an empty chunk buffer. Call with mu held.
func (w *Writer) newChunkLocked() []byte {
	if n := len(w.free); n > 0 {
		b := w.free[n-1]
		w.free = w.free[:n-1]
		return b
	}
	return make([]byte, 0, chunkBytes)
}

// drop counts an event that will never reach the file.
func (w *Writer) drop(closed bool) {
	w.dropped.Add(1)
	if w.dropLogged.CompareAndSwap(false, true) {
		if closed {
			w.log.Error("event dropped: the event log is closed")
		} else {
			w.log.Error("events dropped: the event log's disk is not keeping up",
				attrBytes, MaxPendingBytes)
		}
	}
}

// takeLocked swaps the pending chunks for the spare list. Call with writeMu
// and mu held.
func (w *Writer) takeLocked() []chunk {
	chunks := w.chunks
	w.chunks, w.spare = w.spare[:0], nil
	w.pendingBytes = 0
	return chunks
}

// writeLocked appends chunks to the file and fsyncs if asked, then recycles
// the chunks. Call with writeMu held. A failed write is truncated away so
// that the file stays a sequence of whole lines; the events of the failed
// chunk and of the chunks after it are lost (counted).
func (w *Writer) writeLocked(chunks []chunk, fsync bool) error {
	defer w.recycle(chunks)
	var written int
	for i := range chunks {
		c := &chunks[i]
		n, err := w.f.Write(c.buf)
		if err != nil {
			var lost uint64
			for _, c := range chunks[i:] {
				lost += c.events
			}
			w.writeErrors.Add(1)
			w.dropped.Add(lost)
			err = fmt.Errorf("eventlog: write %d events (%d of %d bytes of a batch written) to %s: %w",
				lost, n, len(c.buf), w.path, err)
			if n > 0 {
				if terr := w.f.Truncate(w.size); terr != nil {
					w.writeErrors.Add(1)
					err = fmt.Errorf("%w; truncating the partial line failed: %w", err, terr)
				}
			}
			w.fail("event log write failed: events lost", err, lost)
			return err
		}
		w.size += int64(n)
		written += n
		w.events.Add(c.events)
		w.bytes.Add(uint64(n))
	}
	if fsync {
		if err := w.f.Sync(); err != nil {
			w.writeErrors.Add(1)
			err = fmt.Errorf("eventlog: fsync %s: %w", w.path, err)
			w.fail("event log fsync failed: recent events may be lost", err, 0)
			return err
		}
		w.syncs.Add(1)
	}
	if w.failing {
		w.failing = false
		w.log.Info("event log writes recovered")
	}
	if written > 0 && w.dropLogged.Load() {
		w.mu.Lock()
		closed := w.closed
		w.mu.Unlock()
		if !closed && w.dropLogged.CompareAndSwap(true, false) {
			w.log.Info("event log caught up after dropping events", "dropped_total", w.dropped.Load())
		}
	}
	return nil
}

// recycle keeps drained chunk buffers for Emit and the list for take. Call
// with writeMu held.
func (w *Writer) recycle(chunks []chunk) {
	w.mu.Lock()
	for i := range chunks {
		if len(w.free) < maxFreeChunks && cap(chunks[i].buf) <= 2*chunkBytes {
			w.free = append(w.free, chunks[i].buf[:0])
		}
		chunks[i] = chunk{}
	}
	w.mu.Unlock()
	w.spare = chunks[:0]
}

// fail logs the first failure of an episode at Error level (data lost).
func (w *Writer) fail(msg string, err error, count uint64) {
	if !w.failing {
		w.failing = true
		w.log.Error(msg, attrError, err, attrEvents, count)
	}
}

// run is the group-commit flusher of SyncBatch and SyncOff.
func (w *Writer) run() {
	defer close(w.stopped)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var last time.Time
	for {
		select {
		case <-w.kick:
		case <-w.full:
		case <-w.stop:
			return
		}
		if wait := FlushInterval - time.Since(last); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-w.full:
				timer.Stop()
			case <-w.stop:
				timer.Stop()
				return
			}
		}
		last = time.Now()
		_ = w.flush(w.policy == SyncBatch)
	}
}

// flush writes what is pending and fsyncs if asked.
func (w *Writer) flush(fsync bool) error {
	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	return w.flushLocked(fsync)
}

// flushLocked is flush with writeMu held.
func (w *Writer) flushLocked(fsync bool) error {
	if w.fileClosed {
		return ErrClosed
	}
	w.mu.Lock()
	chunks := w.takeLocked()
	w.mu.Unlock()
	if len(chunks) == 0 && !fsync {
		w.spare = chunks
		return nil
	}
	return w.writeLocked(chunks, fsync)
}

// Sync writes every pending event and fsyncs the file, whatever the policy.
func (w *Writer) Sync() error { return w.flush(true) }

// Close stops the flusher, writes and fsyncs what is pending and closes the
// file. Events emitted after Close are dropped (counted). A second Close
// returns ErrClosed.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	w.closed = true
	w.mu.Unlock()
	if w.policy != SyncAlways {
		close(w.stop)
	}
	<-w.stopped
	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	err := w.flushLocked(true)
	if cerr := w.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("eventlog: close %s: %w", w.path, cerr)
	}
	w.fileClosed = true
	return err
}

// Stats returns the counters.
func (w *Writer) Stats() Stats {
	return Stats{
		Events: w.events.Load(), Bytes: w.bytes.Load(), Syncs: w.syncs.Load(),
		WriteErrors: w.writeErrors.Load(), Dropped: w.dropped.Load(),
	}
}
