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
	"syscall"
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
	// SyncAlways: Emit returns once its line is written and fsynced; the
	// events appended meanwhile share the write and the fsync (group
	// commit).
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
	// ReserveBytes of disk space are kept allocated past the end of the log
	// (fallocate FALLOC_FL_KEEP_SIZE) for the loss marker and the shutdown
	// line: when the disk is full, events are dropped while this space is
	// still free, so the log can always say what it lost.
	ReserveBytes = 16 << 10
	// preallocStep is how far ahead of the log's end space is allocated at
	// once (one fallocate per MiB of log, not per write).
	preallocStep = 1 << 20
	// LossLogInterval: lost events are logged (and OnLoss called) at most
	// this often, each time with the running count.
	LossLogInterval = time.Second
	// chunkBytes is the unit of the pending buffer: Emit encodes into the
	// last chunk and starts a new one when less than chunkSlack is left, so
	// the pending lines are never copied to grow a buffer.
	chunkBytes = 256 << 10
	chunkSlack = 4 << 10
	// maxFreeChunks drained chunks (8 MiB) are kept for reuse.
	maxFreeChunks = 32
)

// chunk is a run of pending lines of one boot, with seq first..last.
type chunk struct {
	buf         []byte
	events      uint64
	boot, node  string
	first, last uint64
}

// Log attribute keys.
const (
	attrPath      = "path"
	attrError     = "error"
	attrOffset    = "offset"
	attrBytes     = "bytes"
	attrSavedTo   = "saved_to"
	attrEvents    = "events"
	attrReason    = "reason"
	attrLostTotal = "lost_total"
	attrLostNew   = "lost_new"
	attrBoot      = "boot"
	attrFirstSeq  = "first_seq"
	attrLastSeq   = "last_seq"
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
	// SaveError (Open only): the copy could not be made (a full disk); the
	// torn bytes were truncated in place and are gone.
	SaveError string `json:"save_error,omitempty"`
}

// IsZero reports whether there was no torn tail.
func (t TornTail) IsZero() bool { return t.Bytes == 0 }

// Stats counts a Writer's work since Open.
type Stats struct {
	Events      uint64 `json:"events"`       // events written to the file
	Bytes       uint64 `json:"bytes"`        // bytes written (markers included)
	Syncs       uint64 `json:"syncs"`        // successful fsyncs
	WriteErrors uint64 `json:"write_errors"` // failed writes, allocations, truncates and fsyncs
	// Lost counts the events that never reached the file: write errors, a
	// full disk, over MaxPendingBytes, after Close. Each is also named by
	// a loss marker in the file once the log can write again.
	Lost uint64 `json:"lost"`
	// Markers counts the loss marker lines written.
	Markers uint64 `json:"markers"`
	// Dropped is Lost under its former name, kept until
	// internal/benchharness reads Lost; new code reads Lost.
	Dropped uint64 `json:"-"`
}

// Loss is what OnLoss receives and what the log says of lost events: at
// most once per LossLogInterval while events are being lost, once when a
// loss marker was written (Recovered), and once at Close if any was lost.
// It is JSON-ready for the onebit.<node>.eventlog.lost subject.
type Loss struct {
	Node string `json:"node"`
	Boot string `json:"boot"`
	// Events of the current episode (since the last marker), seq FirstSeq
	// to LastSeq.
	Events   uint64 `json:"events"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	Total    uint64 `json:"total"` // events lost since Open
	Error    string `json:"error,omitempty"`
	// Recovered: the log writes again and its marker names this episode.
	Recovered bool `json:"recovered"`
}

// loss is an episode of lost events of one boot, not yet named by a marker
// in the file.
type loss struct {
	boot, node  string
	first, last uint64 // seq range (0 when the events had no seq)
	events      uint64
	cause       string
	sealed      bool // being written as a marker: new losses start a new episode
}

// file is what the Writer needs of its log file; tests inject failures.
type file interface {
	Write(p []byte) (int, error)
	Sync() error
	Truncate(size int64) error
	Close() error
	// Allocate reserves [off, off+n) without changing the file size.
	Allocate(off, n int64) error
}

// osFile is the log file.
type osFile struct{ *os.File }

func (f osFile) Allocate(off, n int64) error {
	for {
		err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, off, n)
		if err != unix.EINTR {
			return os.NewSyscallError("fallocate", err)
		}
	}
}

// Writer appends events to a log file, one JSON line each, with group
// commit. It implements event.Committer (and so event.Sink). Its methods are
// safe for concurrent use. No lock that Emit or the Recorder takes is held
// across a write or an fsync: one flusher at a time does the I/O while
// others append.
type Writer struct {
	path   string
	policy SyncPolicy
	log    *slog.Logger
	f      file
	now    func() time.Time

	// mu guards everything below it up to the counters; cond (on mu)
	// signals the end of a flush.
	mu           sync.Mutex
	cond         sync.Cond
	chunks       []chunk  // pending lines; Emit appends to the last chunk
	spare        []chunk  // the other chunk list, swapped in by take
	pendingBytes int      // bytes in chunks
	free         [][]byte // drained chunk buffers, for reuse
	closed       bool     // Close began: appends are dropped
	fileClosed   bool
	flushing     bool   // a flusher does I/O (at most one)
	appended     uint64 // tickets handed out by AppendLine (SyncAlways)
	durable      uint64 // tickets written and fsynced, or lost
	losses       []loss // episodes not yet named by a marker in the file
	final        []byte // the Shutdown line, written last by Close
	unreported   bool   // losses since the last report
	closedLogged bool   // an event lost after Close was logged
	recovered    []Loss // markers written, to report
	lossReported uint64 // Lost at the last report

	// Owned by the flusher (flushing set).
	size     int64 // file size after the last good write
	allocEnd int64 // end of the space allocated for the file
	prealloc bool  // the file system supports Allocate
	failing  bool  // the last write failed

	kick     chan struct{} // pending became non-empty
	full     chan struct{} // pending passed BatchBytes
	lossKick chan struct{} // something to report
	stop     chan struct{}
	wg       sync.WaitGroup // run and reporter

	onLoss atomic.Pointer[func(Loss)]

	events, bytes, syncs, writeErrors, lost, markers atomic.Uint64
}

var _ event.Committer = (*Writer)(nil)

// Open opens (creating it 0600, and its directory 0700) the log at path for
// appending. If the last line is torn (see TornTail) it is copied to
// path+".torn-<unix seconds>", the file is truncated to the end of the last
// good line, a warning is logged and the torn tail is returned; appends go
// on after it; if the copy cannot be made (a full disk) the torn bytes are
// truncated in place, logged at Error, and TornTail.SaveError says why. The
// file is locked (flock) against a second writer. A nil logger discards.
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
	w := newWriter(path, policy, logger, osFile{f}, size)
	if err := w.ensureSpace(0); err != nil {
		w.log.Warn("no room for the event log's reserve: until space is freed, a loss may go unnamed in the log",
			attrError, err, attrBytes, ReserveBytes)
	}
	return w, torn, nil
}

func newWriter(path string, policy SyncPolicy, logger *slog.Logger, f file, size int64) *Writer {
	w := &Writer{
		path: path, policy: policy, log: logger.With(attrPath, path), f: f, now: time.Now,
		size: size, allocEnd: size, prealloc: true,
		kick: make(chan struct{}, 1), full: make(chan struct{}, 1), lossKick: make(chan struct{}, 1),
		stop: make(chan struct{}),
	}
	w.cond.L = &w.mu
	w.wg.Add(1)
	go w.reporter()
	if policy != SyncAlways {
		w.wg.Add(1)
		go w.run()
	}
	return w
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
		// A full disk cannot take the copy. Starting matters more than the
		// torn bytes (an incomplete line): drop them, loudly.
		torn.SaveError = err.Error()
		logger.Error("event log had a torn tail that could not be saved aside; truncated in place, its bytes are gone",
			attrPath, path, attrOffset, torn.Offset, attrBytes, torn.Bytes, attrReason, torn.Reason, attrError, err)
	}
	torn.SavedTo = saved
	if err := f.Truncate(torn.Offset); err != nil {
		return TornTail{}, 0, fmt.Errorf("eventlog: truncate %s to %d: %w", path, torn.Offset, err)
	}
	if err := f.Sync(); err != nil {
		return TornTail{}, 0, fmt.Errorf("eventlog: fsync %s: %w", path, err)
	}
	if saved != "" {
		logger.Warn("event log had a torn tail; saved it aside and truncated",
			attrPath, path, attrOffset, torn.Offset, attrBytes, torn.Bytes, attrSavedTo, saved, attrReason, torn.Reason)
	}
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

// SetOnLoss installs fn, called (from the Writer's goroutine or Close, never
// under a lock, never on the request path) with each report of lost events:
// at most once per LossLogInterval with the running count, once per loss
// marker written (Recovered), and once at Close if any event was lost. fn
// must not block (bus.Publish does not). Nil removes it.
func (w *Writer) SetOnLoss(fn func(Loss)) {
	if fn == nil {
		w.onLoss.Store(nil)
		return
	}
	w.onLoss.Store(&fn)
}

// Emit appends e's line. Under SyncAlways it returns once the line is
// written and fsynced (or lost, counted); otherwise it only encodes into the
// pending buffer. Failures are counted in Stats and logged; Emit never
// panics and never returns an error (the request goes on).
func (w *Writer) Emit(e *event.Event) { w.Commit(w.AppendLine(e, nil)) }

// EmitLine is Emit with the line already encoded (e.AppendJSON plus '\n').
func (w *Writer) EmitLine(e *event.Event, line []byte) { w.Commit(w.AppendLine(e, line)) }

// AppendLine queues e's line (line, or e encoded when line is nil) and
// returns the ticket to Commit under SyncAlways, 0 under the other
// policies. It does no I/O. A Shutdown event is kept aside and written last
// by Close, from the reserve if the disk is full.
func (w *Writer) AppendLine(e *event.Event, line []byte) uint64 {
	w.mu.Lock()
	if w.closed || w.pendingBytes >= MaxPendingBytes {
		cause := "the event log's disk is not keeping up (" + strconv.Itoa(MaxPendingBytes>>20) + " MiB pending)"
		if w.closed {
			cause = "the event log is closed"
		}
		w.loseLocked(e.Boot, e.Node, e.Seq, e.Seq, 1, cause)
		t := w.ticketLocked(false)
		logClosed := w.fileClosed && !w.closedLogged
		w.closedLogged = w.closedLogged || w.fileClosed
		w.mu.Unlock()
		if logClosed {
			// No reporter runs any more: say it here, once.
			w.log.Error("event lost: the event log is closed", attrLostTotal, w.lost.Load())
		}
		return t
	}
	if e.Event == event.Shutdown {
		if line == nil {
			line = append(e.AppendJSON(nil), '\n')
		}
		w.final = line
		t := w.ticketLocked(false)
		w.mu.Unlock()
		return t
	}
	n := len(w.chunks)
	if n == 0 || cap(w.chunks[n-1].buf)-len(w.chunks[n-1].buf) < max(chunkSlack, len(line)) ||
		w.chunks[n-1].boot != e.Boot {
		w.chunks = append(w.chunks, chunk{buf: w.newChunkLocked(), boot: e.Boot, node: e.Node, first: e.Seq})
		n++
	}
	c := &w.chunks[n-1]
	before := len(c.buf)
	if line != nil {
		c.buf = append(c.buf, line...)
	} else {
		c.buf = append(e.AppendJSON(c.buf), '\n')
	}
	c.events++
	c.last = e.Seq
	wasEmpty := w.pendingBytes == 0
	w.pendingBytes += len(c.buf) - before
	pending := w.pendingBytes
	t := w.ticketLocked(true)
	w.mu.Unlock()
	if w.policy == SyncAlways {
		return t
	}
	if wasEmpty {
		signal(w.kick)
	}
	if pending >= BatchBytes {
		signal(w.full)
	}
	return t
}

// ticketLocked returns the ticket of a line just appended (next), or of the
// last line appended (a dropped or held line waits for those before it).
// Under SyncBatch and SyncOff there is nothing to wait for: 0.
func (w *Writer) ticketLocked(next bool) uint64 {
	if w.policy != SyncAlways {
		return 0
	}
	if next {
		w.appended++
	}
	return w.appended
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Commit returns once every line up to ticket is written and fsynced, or
// lost (counted). The first waiter that finds no flush running writes and
// fsyncs everything appended so far, for all waiters at once; the others
// wait for it without holding any lock.
func (w *Writer) Commit(ticket uint64) {
	if ticket == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.durable < ticket && !w.fileClosed {
		if w.flushing {
			w.cond.Wait()
			continue
		}
		_ = w.flushLocked(true, false)
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

// loseLocked counts n lost events of boot with seq first..last into the
// current loss episode (a new one if the boot changed or the last one is
// being written as a marker). Call with mu held.
func (w *Writer) loseLocked(boot, node string, first, last, n uint64, cause string) {
	if n == 0 {
		return
	}
	w.lost.Add(n)
	k := len(w.losses) - 1
	if k < 0 || w.losses[k].sealed || w.losses[k].boot != boot {
		w.losses = append(w.losses, loss{boot: boot, node: node, first: first, last: last})
		k++
	}
	l := &w.losses[k]
	if first != 0 && (l.first == 0 || first < l.first) {
		l.first = first
	}
	l.last = max(l.last, last)
	l.events += n
	l.cause = cause
	w.unreported = true
	signal(w.lossKick)
}

// flushLocked writes what is pending (and fsyncs if asked). Call with mu
// held and no flush running; it releases mu for the I/O, so appends go on
// meanwhile. closing: Close's last flush, which writes the Shutdown line
// and, on a full disk, uses the reserve for it and the loss marker.
func (w *Writer) flushLocked(fsync, closing bool) error {
	if w.fileClosed {
		return ErrClosed
	}
	w.flushing = true
	chunks := w.chunks
	w.chunks, w.spare = w.spare[:0], nil
	w.pendingBytes = 0
	upTo := w.appended
	var final []byte
	if closing {
		final, w.final = w.final, nil
	}
	w.mu.Unlock()
	err := w.write(chunks, final, fsync)
	w.mu.Lock()
	w.durable = max(w.durable, upTo)
	for i := range chunks {
		if len(w.free) < maxFreeChunks && cap(chunks[i].buf) <= 2*chunkBytes {
			w.free = append(w.free, chunks[i].buf[:0])
		}
		chunks[i] = chunk{}
	}
	w.spare = chunks[:0]
	w.flushing = false
	w.cond.Broadcast()
	return err
}

// sealLosses encodes a loss marker per episode not yet named in the file and
// marks them being written.
func (w *Writer) sealLosses() (markers []byte, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	for i := range w.losses {
		l := &w.losses[i]
		l.sealed = true
		m := event.Event{V: event.Version, Boot: l.boot, Time: now, Node: l.node, Event: event.LostEvent,
			Reason: l.cause, Lost: &event.Lost{Events: l.events, FirstSeq: l.first, LastSeq: l.last}}
		markers = append(m.AppendJSON(markers), '\n')
	}
	return markers, len(w.losses)
}

// markersDone drops the first n episodes (written, ok) or unseals them.
func (w *Writer) markersDone(n int, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !ok {
		// Unseal, and merge what the failure split: one episode per run of
		// the same boot.
		merged := w.losses[:0]
		for _, l := range w.losses {
			l.sealed = false
			if k := len(merged) - 1; k >= 0 && merged[k].boot == l.boot {
				m := &merged[k]
				if l.first != 0 && (m.first == 0 || l.first < m.first) {
					m.first = l.first
				}
				m.last = max(m.last, l.last)
				m.events += l.events
				m.cause = l.cause
				continue
			}
			merged = append(merged, l)
		}
		clear(w.losses[len(merged):])
		w.losses = merged
		return
	}
	total := w.lost.Load()
	for _, l := range w.losses[:n] {
		w.recovered = append(w.recovered, Loss{Node: l.node, Boot: l.boot, Events: l.events, FirstSeq: l.first,
			LastSeq: l.last, Total: total, Error: l.cause, Recovered: true})
	}
	w.losses = append(w.losses[:0], w.losses[n:]...)
	w.markers.Add(uint64(n))
	signal(w.lossKick)
}

// loseChunks counts the events of chunks as lost because of err.
func (w *Writer) loseChunks(chunks []chunk, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range chunks {
		w.loseLocked(c.boot, c.node, c.first, c.last, c.events, err.Error())
	}
}

// loseFinal counts the Shutdown line as lost.
func (w *Writer) loseFinal(final []byte, err error) {
	e, perr := event.Parse(final)
	if perr != nil {
		return
	}
	w.mu.Lock()
	w.loseLocked(e.Boot, e.Node, e.Seq, e.Seq, 1, err.Error())
	w.mu.Unlock()
}

// write appends the loss markers, chunks and final line, and fsyncs if
// asked; the flusher runs it without holding mu. When the disk has no room
// for the events, they are lost (counted) and nothing is written, which
// keeps the reserve for the marker; Close's last write (final set) then
// writes the marker and the Shutdown line into the reserve. A failed write
// is truncated away so that the file stays a sequence of whole lines.
func (w *Writer) write(chunks []chunk, final []byte, fsync bool) error {
	markers, nm := w.sealLosses()
	var n int64
	for _, c := range chunks {
		n += int64(len(c.buf))
	}
	if n > 0 || (len(markers) > 0 && final == nil) {
		// Only Close's last write may use the reserve.
		if err := w.ensureSpace(int64(len(markers)) + n + int64(len(final))); err != nil {
			w.writeErrors.Add(1)
			w.markersDone(nm, false)
			w.loseChunks(chunks, err)
			chunks = nil
			if final == nil {
				w.fail("", err)
				return err
			}
			markers, nm = w.sealLosses() // name the chunks just lost too
		}
	}
	if len(markers) > 0 {
		if err := w.writeAll(markers); err != nil {
			w.markersDone(nm, false)
			w.loseChunks(chunks, err)
			if final != nil {
				w.loseFinal(final, err)
			}
			w.fail("", err)
			return err
		}
		w.markersDone(nm, true)
	}
	for i := range chunks {
		c := &chunks[i]
		if err := w.writeAll(c.buf); err != nil {
			w.loseChunks(chunks[i:], err)
			if final != nil {
				w.loseFinal(final, err)
			}
			w.fail("", err)
			return err
		}
		w.events.Add(c.events)
	}
	if final != nil {
		if err := w.writeAll(final); err != nil {
			w.loseFinal(final, err)
			w.fail("", err)
			return err
		}
		w.events.Add(1)
	}
	if fsync {
		if err := w.f.Sync(); err != nil {
			w.writeErrors.Add(1)
			err = fmt.Errorf("eventlog: fsync %s: %w", w.path, err)
			w.fail("event log fsync failed: recent events may be lost", err)
			return err
		}
		w.syncs.Add(1)
	}
	if w.failing {
		w.failing = false
		w.log.Info("event log writes recovered")
	}
	return nil
}

// writeAll appends b, or nothing: a partial write is truncated away.
func (w *Writer) writeAll(b []byte) error {
	n, err := w.f.Write(b)
	if err == nil {
		w.size += int64(n)
		w.bytes.Add(uint64(n))
		return nil
	}
	w.writeErrors.Add(1)
	err = fmt.Errorf("eventlog: write %d bytes to %s (%d written): %w", len(b), w.path, n, err)
	if n > 0 {
		if terr := w.f.Truncate(w.size); terr != nil {
			w.writeErrors.Add(1)
			err = fmt.Errorf("%w; truncating the partial line failed: %w", err, terr)
		}
	}
	return err
}

// ensureSpace allocates room for need more bytes plus ReserveBytes past the
// end of the file, a preallocStep at a time. An error (ENOSPC) means the
// need does not fit outside the reserve. A file system without fallocate
// gets no reserve: writes then fail only when the disk does.
func (w *Writer) ensureSpace(need int64) error {
	want := w.size + need + ReserveBytes
	if !w.prealloc || want <= w.allocEnd {
		return nil
	}
	end := want + preallocStep
	err := w.f.Allocate(w.allocEnd, end-w.allocEnd)
	if errors.Is(err, syscall.ENOSPC) {
		end = want
		err = w.f.Allocate(w.allocEnd, end-w.allocEnd)
	}
	switch {
	case err == nil:
		w.allocEnd = end
		return nil
	case errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS):
		w.prealloc = false
		w.log.Info("the event log's file system cannot reserve space (no fallocate): a full disk may leave a loss unnamed in the log", attrError, err)
		return nil
	}
	return fmt.Errorf("eventlog: reserve %d bytes at offset %d of %s: %w", end-w.allocEnd, w.allocEnd, w.path, err)
}

// fail marks a failure episode. A lost event is logged by the Writer's
// goroutine (at most once per LossLogInterval, with the running count and
// the error); other failures (fsync) are logged here, once per episode.
func (w *Writer) fail(msg string, err error) {
	if !w.failing {
		w.failing = true
		if msg != "" {
			w.log.Error(msg, attrError, err, attrLostTotal, w.lost.Load())
		}
	}
}

// run is the group-commit flusher of SyncBatch and SyncOff.
func (w *Writer) run() {
	defer w.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	var last time.Time
	armed := false
	flush := func() {
		armed = false
		last = time.Now()
		_ = w.flush(w.policy == SyncBatch)
	}
	for {
		select {
		case <-w.kick:
			if !armed {
				if d := FlushInterval - time.Since(last); d > 0 {
					t.Reset(d)
					armed = true
				} else {
					flush()
				}
			}
		case <-w.full:
			t.Stop()
			flush()
		case <-t.C:
			flush()
		case <-w.stop:
			return
		}
	}
}

// reporter logs lost events (and calls OnLoss) at most once per
// LossLogInterval; it is its own goroutine so that a hung disk, which holds
// the flusher, does not silence it.
func (w *Writer) reporter() {
	defer w.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	var last time.Time
	armed := false
	for {
		select {
		case <-w.lossKick:
			if !armed {
				if d := LossLogInterval - time.Since(last); d > 0 {
					t.Reset(d)
					armed = true
					continue
				}
				last = time.Now()
				w.report(false)
			}
		case <-t.C:
			armed = false
			last = time.Now()
			w.report(false)
		case <-w.stop:
			return
		}
	}
}

// report logs what was lost since the last report and the markers written,
// and calls OnLoss for each; final (Close) also logs the total if anything
// was ever lost.
func (w *Writer) report(final bool) {
	w.mu.Lock()
	recovered := w.recovered
	w.recovered = nil
	var cur *Loss
	total := w.lost.Load()
	if w.unreported && len(w.losses) > 0 {
		l := w.losses[len(w.losses)-1]
		cur = &Loss{Node: l.node, Boot: l.boot, Events: l.events, FirstSeq: l.first, LastSeq: l.last,
			Total: total, Error: l.cause}
	}
	w.unreported = false
	newLost := total - w.lossReported
	w.lossReported = total
	w.mu.Unlock()
	var fn func(Loss)
	if p := w.onLoss.Load(); p != nil {
		fn = *p
	}
	if cur != nil {
		w.log.Error("event log losing events", attrLostTotal, total, attrLostNew, newLost, attrBoot, cur.Boot,
			attrFirstSeq, cur.FirstSeq, attrLastSeq, cur.LastSeq, attrError, cur.Error)
		if fn != nil {
			fn(*cur)
		}
	}
	for _, l := range recovered {
		w.log.Warn("event log writing again; its loss marker names the lost events", attrEvents, l.Events,
			attrBoot, l.Boot, attrFirstSeq, l.FirstSeq, attrLastSeq, l.LastSeq, attrLostTotal, l.Total)
		if fn != nil {
			fn(l)
		}
	}
	if final && total > 0 {
		w.log.Error("event log closed after losing events", attrLostTotal, total, "markers", w.markers.Load())
	}
}

// flush writes what is pending and fsyncs if asked, after any flush already
// running.
func (w *Writer) flush(fsync bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.flushing {
		w.cond.Wait()
	}
	if w.fileClosed {
		return ErrClosed
	}
	if len(w.chunks) == 0 && len(w.losses) == 0 && !fsync {
		return nil
	}
	return w.flushLocked(fsync, false)
}

// Sync writes every pending event and fsyncs the file, whatever the policy.
func (w *Writer) Sync() error { return w.flush(true) }

// Close stops the flusher, writes what is pending, the loss marker if events
// were lost and the Shutdown line if one was emitted (both from the reserve
// on a full disk), fsyncs and closes the file. Events emitted after Close
// are lost (counted). A second Close returns ErrClosed.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	w.closed = true
	w.mu.Unlock()
	close(w.stop)
	w.wg.Wait()
	w.mu.Lock()
	for w.flushing {
		w.cond.Wait()
	}
	err := w.flushLocked(true, true)
	w.fileClosed = true
	w.cond.Broadcast()
	w.mu.Unlock()
	if cerr := w.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("eventlog: close %s: %w", w.path, cerr)
	}
	w.report(true)
	return err
}

// Stats returns the counters.
func (w *Writer) Stats() Stats {
	lost := w.lost.Load()
	return Stats{
		Events: w.events.Load(), Bytes: w.bytes.Load(), Syncs: w.syncs.Load(),
		WriteErrors: w.writeErrors.Load(), Lost: lost, Markers: w.markers.Load(), Dropped: lost,
	}
}

// Lost is Stats().Lost: the events that never reached the file.
func (w *Writer) Lost() uint64 { return w.lost.Load() }
