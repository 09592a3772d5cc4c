package eventlog

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/onebitd/onebitd/event"
)

// MaxLineBytes bounds one line of the log (an event is a few hundred bytes;
// a reason is bounded by its producer).
const MaxLineBytes = 1 << 20

// readBufferBytes is the Reader's buffer: big reads, and room for the
// longest line.
const readBufferBytes = MaxLineBytes + 4096

// Reader streams the events of a log. A torn last line (see TornTail) ends
// the stream like io.EOF and is reported by Torn; a bad line anywhere else
// is an ErrBadLine error naming the line.
type Reader struct {
	br     *bufio.Reader
	dec    event.Decoder
	name   string
	line   int
	offset int64 // bytes consumed
	torn   TornTail
	err    error
}

// NewReader reads events from r; name (a path, or "" ) labels errors.
func NewReader(r io.Reader, name string) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, readBufferBytes), name: name}
}

// Next returns the next event, or io.EOF at the end of the log (also after
// a torn last line), or an error that ends the stream.
func (r *Reader) Next() (event.Event, error) {
	if r.err != nil {
		return event.Event{}, r.err
	}
	line, err := r.br.ReadSlice('\n')
	if len(line) > MaxLineBytes+1 {
		err = bufio.ErrBufferFull
	}
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		if len(line) == 0 {
			r.err = io.EOF
			return event.Event{}, r.err
		}
		r.tornAt(len(line), "last line has no final newline")
		return event.Event{}, r.err
	case errors.Is(err, bufio.ErrBufferFull):
		r.line++
		r.err = fmt.Errorf("%w: %s line %d (offset %d) exceeds %d bytes", ErrLineTooLong, r.label(), r.line, r.offset, MaxLineBytes)
		return event.Event{}, r.err
	default:
		r.err = fmt.Errorf("eventlog: read %s after line %d: %w", r.label(), r.line, err)
		return event.Event{}, r.err
	}
	e, perr := r.dec.Parse(line)
	if perr != nil {
		if _, err := r.br.Peek(1); errors.Is(err, io.EOF) {
			r.tornAt(len(line), "last line is not an event: "+perr.Error())
			return event.Event{}, r.err
		}
		r.line++
		r.err = fmt.Errorf("%w: %s line %d (offset %d): %w", ErrBadLine, r.label(), r.line, r.offset, perr)
		return event.Event{}, r.err
	}
	r.line++
	r.offset += int64(len(line))
	return e, nil
}

func (r *Reader) tornAt(n int, reason string) {
	r.torn = TornTail{Path: r.name, Line: r.line + 1, Offset: r.offset, Bytes: int64(n), Reason: reason}
	r.offset += int64(n)
	r.err = io.EOF
}

func (r *Reader) label() string {
	if r.name == "" {
		return "log"
	}
	return r.name
}

// Line is the 1-based line number of the event Next returned last.
func (r *Reader) Line() int { return r.line }

// Offset is the number of bytes consumed so far.
func (r *Reader) Offset() int64 { return r.offset }

// Torn reports the torn last line, once Next has returned io.EOF.
func (r *Reader) Torn() TornTail { return r.torn }

// ReadFile streams the events of the log at path to fn with their line
// numbers. A torn last line is returned as a TornTail (a warning), not an
// error; a bad line in the middle, a read error or fn's error ends the read
// and is returned.
func ReadFile(path string, fn func(lineNo int, e event.Event) error) (TornTail, error) {
	f, err := os.Open(path)
	if err != nil {
		return TornTail{}, fmt.Errorf("eventlog: %w", err)
	}
	defer f.Close()
	r := NewReader(f, path)
	for {
		e, err := r.Next()
		if errors.Is(err, io.EOF) {
			return r.Torn(), nil
		}
		if err != nil {
			return TornTail{}, err
		}
		if err := fn(r.Line(), e); err != nil {
			return TornTail{}, err
		}
	}
}
