package bus

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onebitd/onebitd/eventlog"
)

// AckedFile, in the state dir, remembers per boot which events of this node
// stream ONEBIT acknowledged, so that a catch-up after an outage or a
// restart republishes only the rest (issue 14 item 2).
const AckedFile = "nats-acked.json"

// Catch-up tuning.
const (
	// catchUpWindow bounds the catch-up's unacknowledged publishes, a
	// quarter of jsMaxPending: live events keep the rest of the window.
	catchUpWindow = jsMaxPending / 4
	// catchUpDelay lets a burst of drops or a reconnect settle before a
	// catch-up pass reads the log.
	catchUpDelay = time.Second
	// catchUpPoll is the wait while the window is full.
	catchUpPoll = time.Millisecond
	// catchUpTail is the wait of a pass that reached the end of the log
	// before the last event kept back was written there.
	catchUpTail = 2 * time.Millisecond
	// catchUpTailMax is how long a pass waits for a log that stopped
	// growing to show the last event kept back.
	catchUpTailMax = 5 * time.Second
	// ackFlushInterval bounds how often AckedFile is rewritten.
	ackFlushInterval = 250 * time.Millisecond
	// hdrCatchUp marks a republished event, so that its acknowledgement
	// counts as Stats.Republished (an event of an earlier boot) or, for an
	// event of this process kept back while behind, Published.
	hdrCatchUp = "Onebit-Catch-Up"
)

// acks tracks, per boot of this node, the seqs that the stream holds: every
// seq up to through, and those in above. A seq the log does not hold (lost
// before it was written) counts as held: nothing can bring it back.
type acks struct {
	mu    sync.Mutex
	node  string
	boots map[string]*bootAcks
	dirty bool
}

type bootAcks struct {
	through uint64
	above   map[uint64]struct{}
}

// ackFile is AckedFile's content.
type ackFile struct {
	V     int                     `json:"v"`
	Node  string                  `json:"node"`
	Boots map[string]ackFileEntry `json:"boots"`
}

type ackFileEntry struct {
	Through uint64   `json:"through"`
	Above   []uint64 `json:"above,omitempty"`
}

func newAcks(node string) *acks { return &acks{node: node, boots: map[string]*bootAcks{}} }

func (a *acks) boot(boot string) *bootAcks {
	ba := a.boots[boot]
	if ba == nil {
		ba = &bootAcks{above: map[uint64]struct{}{}}
		a.boots[boot] = ba
	}
	return ba
}

// add records that the stream holds boot's seq.
func (a *acks) add(boot string, seq uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.addLocked(boot, seq)
}

func (a *acks) addLocked(boot string, seq uint64) {
	ba := a.boot(boot)
	switch {
	case seq <= ba.through:
		return
	case seq == ba.through+1:
		ba.through++
		for {
			if _, ok := ba.above[ba.through+1]; !ok {
				break
			}
			delete(ba.above, ba.through+1)
			ba.through++
		}
	default:
		ba.above[seq] = struct{}{}
	}
	a.dirty = true
}

// addRange records seqs from..to (the log does not hold them).
func (a *acks) addRange(boot string, from, to uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ba := a.boot(boot)
	if from <= ba.through+1 && to > ba.through {
		ba.through = to
		for s := range ba.above {
			if s <= to {
				delete(ba.above, s)
			}
		}
		for {
			if _, ok := ba.above[ba.through+1]; !ok {
				break
			}
			delete(ba.above, ba.through+1)
			ba.through++
		}
		a.dirty = true
		return
	}
	for s := max(from, ba.through+1); s <= to; s++ {
		a.addLocked(boot, s)
	}
}

// has reports whether the stream holds boot's seq.
func (a *acks) has(boot string, seq uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	ba := a.boots[boot]
	if ba == nil {
		return false
	}
	if seq <= ba.through {
		return true
	}
	_, ok := ba.above[seq]
	return ok
}

// keepOnly forgets the boots not in keep (no longer in the log).
func (a *acks) keepOnly(keep map[string]bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for b := range a.boots {
		if !keep[b] {
			delete(a.boots, b)
			a.dirty = true
		}
	}
}

// snapshot returns the file content if something changed since the last
// snapshot.
func (a *acks) snapshot() ([]byte, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.dirty {
		return nil, false
	}
	f := ackFile{V: 1, Node: a.node, Boots: make(map[string]ackFileEntry, len(a.boots))}
	for b, ba := range a.boots {
		e := ackFileEntry{Through: ba.through}
		for s := range ba.above {
			e.Above = append(e.Above, s)
		}
		slices.Sort(e.Above)
		f.Boots[b] = e
	}
	data, err := json.Marshal(f)
	if err != nil {
		return nil, false // cannot happen: plain types
	}
	a.dirty = false
	return append(data, '\n'), true
}

// loadAcks reads path; a missing file is an empty record, a file of
// another node is ignored (its ids were not ours).
func loadAcks(path, node string) (*acks, error) {
	a := newAcks(node)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return a, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrAckedFile, err)
	}
	var f ackFile
	if err := json.Unmarshal(data, &f); err != nil || f.V != 1 {
		return nil, fmt.Errorf("%w: %s is not an acknowledgement record (v1): %v", ErrAckedFile, path, err)
	}
	if f.Node != node {
		return a, nil
	}
	for b, e := range f.Boots {
		ba := a.boot(b)
		ba.through = e.Through
		for _, s := range e.Above {
			if s > e.Through {
				ba.above[s] = struct{}{}
			}
		}
	}
	return a, nil
}

// writeFileAtomic replaces path with data: a temporary file in the same
// directory, fsynced, renamed over path, the directory fsynced.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename: ENOENT, ignored
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// parseMsgID splits "<node>/<boot>/<seq>" (the node may hold '/').
func parseMsgID(id string) (node, boot string, seq uint64, ok bool) {
	i := strings.LastIndexByte(id, '/')
	if i < 0 {
		return "", "", 0, false
	}
	seq, err := strconv.ParseUint(id[i+1:], 10, 64)
	if err != nil {
		return "", "", 0, false
	}
	j := strings.LastIndexByte(id[:i], '/')
	if j < 0 {
		return "", "", 0, false
	}
	return id[:j], id[j+1 : i], seq, true
}

// onAck records an acknowledged (or duplicate: already stored) event.
func (b *Bus) onAck(m *nats.Msg) {
	if b.acks == nil || m.Header == nil {
		return
	}
	node, boot, seq, ok := parseMsgID(m.Header.Get(nats.MsgIdHdr))
	if ok && node == b.cfg.Node {
		b.acks.add(boot, seq)
	}
}

// ofThisBoot reports whether m (a catch-up publish) is an event of this
// process (kept back while behind), not of an earlier boot.
func (b *Bus) ofThisBoot(m *nats.Msg) bool {
	_, boot, _, ok := parseMsgID(m.Header.Get(nats.MsgIdHdr))
	cur := b.curBoot.Load()
	return ok && cur != nil && *cur == boot
}

// kickCatchUp asks for a catch-up pass (coalesced).
func (b *Bus) kickCatchUp() {
	if b.catchUpKick == nil {
		return
	}
	select {
	case b.catchUpKick <- struct{}{}:
	default:
	}
}

// keepBack reports whether the live event it must wait for the catch-up
// (and records it as the last event kept back): while the bus is behind,
// or while the stream is not ready. Without catch-up, or for an event
// without an id, it never does.
func (b *Bus) keepBack(it item) bool {
	if b.acks == nil || it.node != b.cfg.Node {
		return false
	}
	if b.streamReady.Load() && !b.behind.Load() {
		return false
	}
	b.behindMu.Lock()
	defer b.behindMu.Unlock()
	if b.streamReady.Load() && !b.behind.Load() {
		return false // the catch-up handed back meanwhile
	}
	if !b.behind.Swap(true) {
		b.kickCatchUp()
	}
	b.noteSkippedLocked(it.boot, it.seq)
	b.deferred.Add(1)
	return true
}

// markBehind records that this node's event boot/seq missed the stream:
// live events wait for the catch-up until it has republished the log past
// it.
func (b *Bus) markBehind(boot string, seq uint64, node string) {
	if b.acks == nil || node != b.cfg.Node {
		return
	}
	b.behindMu.Lock()
	b.behind.Store(true)
	b.noteSkippedLocked(boot, seq)
	b.behindMu.Unlock()
	b.kickCatchUp()
}

func (b *Bus) noteSkippedLocked(boot string, seq uint64) {
	if boot != b.skipBoot {
		b.skipBoot, b.skipSeq = boot, seq // a new boot: its events follow the old one's
		return
	}
	b.skipSeq = max(b.skipSeq, seq)
}

// catchUp runs catch-up passes when kicked (at start, after a reconnect,
// after drops or unacknowledged publishes), and writes AckedFile.
func (b *Bus) catchUp() {
	defer b.wg.Done()
	flush := time.NewTicker(ackFlushInterval)
	defer flush.Stop()
	first := true
	for {
		select {
		case <-b.done:
			return
		case <-flush.C:
			b.flushAcks()
			continue
		case <-b.catchUpKick:
		}
		// Let the burst settle; keep the record current meanwhile. The
		// first pass (at start, live events kept back) runs at once.
		delay := catchUpDelay
		if first {
			delay, first = 0, false
		}
		settle := time.NewTimer(delay)
	wait:
		for {
			select {
			case <-b.done:
				settle.Stop()
				return
			case <-flush.C:
				b.flushAcks()
			case <-settle.C:
				break wait
			}
		}
		if !b.streamReady.Load() || !b.nc.IsConnected() {
			continue // the next reconnect or stream setup kicks again
		}
		n, err := b.catchUpPass()
		b.flushAcks()
		switch {
		case err != nil && errors.Is(err, ErrClosed):
			return
		case err != nil:
			b.log.Warn("jetstream catch-up stopped", logKeyError, err, "republished", n)
			b.catchUpRuns.Add(1)
		default:
			b.catchUpRuns.Add(1)
			if n > 0 {
				b.log.Info("jetstream catch-up done", "republished", n, logKeyStream, StreamName)
			}
		}
	}
}

// flushAcks writes AckedFile if the record changed.
func (b *Bus) flushAcks() {
	data, changed := b.acks.snapshot()
	if !changed {
		return
	}
	if err := writeFileAtomic(b.ackedPath, data); err != nil {
		b.acks.mu.Lock()
		b.acks.dirty = true
		b.acks.mu.Unlock()
		b.log.Warn("cannot write the jetstream acknowledgement record", logKeyError, err, "path", b.ackedPath)
	}
}

// catchUpPass reads the event log (from where the last pass found the
// first event not held yet) and republishes, in log order, every
// event of this node that the stream does not hold, except those of the
// live boot that the publisher has not handed to nats.go yet (they are on
// their way). The window of unacknowledged catch-up publishes is bounded
// (catchUpWindow) so live events keep flowing. When the bus is behind
// (live events kept back), the pass goes on reading the log as it grows
// until it has republished the last event kept back, then hands back to
// the publisher. It returns how many events it republished.
func (b *Bus) catchUpPass() (int, error) {
	f, err := os.Open(b.cfg.EventLog)
	for waited := time.Duration(0); errors.Is(err, fs.ErrNotExist); waited += catchUpTail {
		// No log yet: nothing to republish; events kept back will be in
		// it once it is written.
		if !b.behind.Load() || b.handBack(nil) {
			return 0, nil
		}
		if waited > catchUpTailMax {
			b.forceHandBack()
			return 0, nil
		}
		if err := b.pause(catchUpTail); err != nil {
			return 0, err
		}
		f, err = os.Open(b.cfg.EventLog)
	}
	if err != nil {
		return 0, fmt.Errorf("bus: catch-up: %w", err)
	}
	defer f.Close()
	// Resume where the last pass met the first event the stream did not
	// hold yet: everything before it is held. A shorter file is another
	// log: read it all.
	base := b.resumeAt
	if fi, err := f.Stat(); err != nil || fi.Size() < base {
		base = 0
	}
	full := base == 0
	fullPass := full
	behind := b.behind.Load()
	lastGrowth := time.Now()
	liveBoot, _ := b.liveBoot.Load().(string)
	liveSeq := b.liveSeq.Load()
	next := map[string]uint64{} // per boot: the seq expected next in the log
	sent := map[string]uint64{} // per boot: the last seq this pass republished or found held
	firstPending := int64(-1)
	n := 0
	var buf []byte
	for {
		if _, err := f.Seek(base, io.SeekStart); err != nil {
			return n, fmt.Errorf("bus: catch-up: %w", err)
		}
		r := eventlog.NewReader(f, b.cfg.EventLog)
		for {
			lineStart := base + r.Offset()
			e, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return n, fmt.Errorf("bus: catch-up: %w", err)
			}
			if e.Seq == 0 || e.Boot == "" || (e.Node != "" && e.Node != b.cfg.Node) {
				continue // log-local lines (loss markers), another node's events
			}
			exp, seen := next[e.Boot]
			switch {
			case seen:
			case full:
				exp = 1
			default:
				exp = e.Seq // resumed: what came before is held
			}
			if e.Seq > exp {
				b.acks.addRange(e.Boot, exp, e.Seq-1) // not in the log: lost for good
			}
			next[e.Boot] = e.Seq + 1
			if b.acks.has(e.Boot, e.Seq) {
				sent[e.Boot] = e.Seq
				continue
			}
			if firstPending < 0 {
				firstPending = lineStart
			}
			if !behind && e.Boot == liveBoot && e.Seq > liveSeq {
				continue // on its way through the publisher
			}
			if err := b.waitWindow(); err != nil {
				return n, err
			}
			buf = e.AppendJSON(buf[:0])
			m := &nats.Msg{Subject: b.subjectOf(&e), Data: append([]byte(nil), buf...), Header: nats.Header{}}
			m.Header.Set(hdrCatchUp, "1")
			it := item{node: b.cfg.Node, boot: e.Boot, seq: e.Seq}
			if _, err := b.js.PublishMsgAsync(m, jetstream.WithMsgID(msgID(it)), jetstream.WithStallWait(jsStallWait)); err != nil {
				return n, fmt.Errorf("bus: catch-up publish: %w", err)
			}
			sent[e.Boot] = e.Seq
			n++
		}
		end := base + r.Offset()
		if t := r.Torn(); t.Bytes > 0 {
			end = base + t.Offset // a line still being written
		}
		if firstPending < 0 {
			firstPending = end
		}
		if !behind || b.handBack(sent) {
			break
		}
		// Behind, and the last event kept back is not in the log yet (the
		// log flushes in batches): read on from here shortly. A log that
		// stopped growing (a full disk) will not bring it: hand back.
		if end > base {
			lastGrowth = time.Now()
		} else if time.Since(lastGrowth) > catchUpTailMax {
			b.forceHandBack()
			break
		}
		base, full = end, false
		if err := b.pause(catchUpTail); err != nil {
			return n, err
		}
	}
	b.resumeAt = firstPending
	if !fullPass {
		return n, nil
	}
	keep := map[string]bool{}
	for boot := range next {
		keep[boot] = true
	}
	if liveBoot != "" {
		keep[liveBoot] = true
	}
	b.acks.keepOnly(keep)
	return n, nil
}

// handBack ends the behind state if this pass republished (or found held)
// the last event kept back; the publisher then publishes live again, after
// everything the pass handed to nats.go.
func (b *Bus) handBack(sent map[string]uint64) bool {
	b.behindMu.Lock()
	defer b.behindMu.Unlock()
	if b.skipBoot != "" && sent[b.skipBoot] < b.skipSeq && !b.acks.has(b.skipBoot, b.skipSeq) {
		return false
	}
	b.behind.Store(false)
	b.skipBoot, b.skipSeq = "", 0
	return true
}

// forceHandBack ends the behind state although the log never showed the
// last event kept back.
func (b *Bus) forceHandBack() {
	b.behindMu.Lock()
	boot, seq := b.skipBoot, b.skipSeq
	b.behind.Store(false)
	b.skipBoot, b.skipSeq = "", 0
	b.behindMu.Unlock()
	b.log.Warn("jetstream catch-up: the event log stopped growing before it held the events kept back; publishing live again",
		"boot", boot, "seq", seq)
}

// pause waits d, or returns ErrClosed when the bus closes.
func (b *Bus) pause(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-b.done:
		return ErrClosed
	case <-t.C:
		return nil
	}
}

// waitWindow waits until the catch-up may publish again.
func (b *Bus) waitWindow() error {
	for b.js.PublishAsyncPending() >= catchUpWindow {
		t := time.NewTimer(catchUpPoll)
		select {
		case <-b.done:
			t.Stop()
			return ErrClosed
		case <-t.C:
		}
	}
	select {
	case <-b.done:
		return ErrClosed
	default:
		return nil
	}
}
