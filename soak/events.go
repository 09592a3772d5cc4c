package soak

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"sync"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/machine"
)

// reqState is what the event log says of one request so far.
type reqState struct {
	last   string // the last event's to-state
	route  string
	step   string // the failed step of a fallback
	reason string
}

func (r *reqState) terminal() bool {
	return r != nil && (r.last == string(machine.Done) || r.last == string(machine.Failed))
}

// logTail follows one event log: it reads the lines appended since the last
// call and keeps each request's state.
type logTail struct {
	path string

	mu      sync.Mutex
	off     int64
	partial []byte
	reqs    map[string]*reqState
	bad     int // lines that are not events
}

func newLogTail(path string) *logTail { return &logTail{path: path, reqs: make(map[string]*reqState)} }

// update reads what was appended.
func (l *logTail) update() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, err := os.Open(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(l.off, io.SeekStart); err != nil {
		return err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	l.off += int64(len(b))
	b = append(l.partial, b...)
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		l.line(b[:i])
		b = b[i+1:]
	}
	l.partial = append([]byte(nil), b...)
	return nil
}

func (l *logTail) line(b []byte) {
	var ev event.Event
	if err := json.Unmarshal(b, &ev); err != nil {
		l.bad++
		return
	}
	if ev.RequestID == "" {
		return // lifecycle, shutdown and loss lines
	}
	r := l.reqs[ev.RequestID]
	if r == nil {
		r = &reqState{}
		l.reqs[ev.RequestID] = r
	}
	r.last, r.route = ev.To, ev.Route
	if ev.To == string(machine.Fallback) {
		r.step, r.reason = ev.Step, ev.Reason
	}
}

// get returns a copy of id's state (nil when the log has none).
func (l *logTail) get(id string) *reqState {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.reqs[id]
	if !ok {
		return nil
	}
	c := *r
	return &c
}

// open lists the requests of the log that are not terminal.
func (l *logTail) open() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id, r := range l.reqs {
		if !r.terminal() {
			out = append(out, id)
		}
	}
	return out
}

func (l *logTail) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.reqs)
}
