// Package tailbuf keeps the end of what a child process writes (its stderr):
// the last lines, bounded in count and in bytes, each cut to a maximum
// length, for the error message that explains why the child failed. It also
// hands every complete line to a callback, which is how a supervisor logs a
// child's output line by line.
//
// A line ends at '\n' or '\r' (so progress output such as "10%\r50%\r" is
// lines too). Each line is cleaned before it is kept or handed on: invalid
// UTF-8 and control characters become spaces, surrounding space is trimmed,
// and the result is cut to MaxLine bytes on a character boundary. Only the
// first 2×MaxLine bytes of a line are read; the rest is dropped unread, so a
// child that writes one endless line costs bounded memory. Blank lines are
// neither kept nor handed on.
//
// A Buffer is an io.Writer whose Write never fails (a child must not block or
// die because its stderr is full) and is safe for concurrent use.
package tailbuf

import (
	"bytes"
	"strings"
	"sync"
	"unicode/utf8"
)

// Defaults of Options.
const (
	DefaultMaxBytes = 4 << 10 // bytes of kept lines, all together
	DefaultMaxLines = 20      // kept lines
	DefaultMaxLine  = 512     // bytes of one line
)

// Options bound a Buffer. Zero fields take the defaults above.
type Options struct {
	MaxBytes int // most bytes of all kept lines together
	MaxLines int // most kept lines
	MaxLine  int // most bytes of one line (at most MaxBytes); longer lines are cut
	// OnLine, when set, is called with every complete non-blank line, in
	// order, under the Buffer's lock: it must not call the Buffer.
	OnLine func(line string)
}

// Buffer keeps the last lines written to it. The zero value is not usable:
// call New.
type Buffer struct {
	mu     sync.Mutex
	o      Options
	lines  []string // kept lines, oldest first
	nbytes int      // sum of len(lines[i])
	cur    []byte   // raw bytes of the current line, at most 2*MaxLine
}

// New returns an empty Buffer bounded by o.
func New(o Options) *Buffer {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxLines <= 0 {
		o.MaxLines = DefaultMaxLines
	}
	if o.MaxLine <= 0 {
		o.MaxLine = DefaultMaxLine
	}
	o.MaxLine = min(o.MaxLine, o.MaxBytes)
	return &Buffer{o: o}
}

// Write splits p into lines; it always returns len(p), nil.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			b.add(p)
			break
		}
		b.add(p[:i])
		b.end()
		p = p[i+1:]
	}
	return n, nil
}

// add appends raw bytes to the current line, up to its read limit.
func (b *Buffer) add(p []byte) {
	if room := 2*b.o.MaxLine - len(b.cur); room > 0 {
		b.cur = append(b.cur, p[:min(room, len(p))]...)
	}
}

// end completes the current line.
func (b *Buffer) end() {
	s := Clean(b.cur, b.o.MaxLine)
	b.cur = b.cur[:0]
	if s == "" {
		return
	}
	if b.o.OnLine != nil {
		b.o.OnLine(s)
	}
	b.lines = append(b.lines, s)
	b.nbytes += len(s)
	for len(b.lines) > b.o.MaxLines || b.nbytes > b.o.MaxBytes {
		b.nbytes -= len(b.lines[0])
		b.lines[0] = ""
		b.lines = b.lines[1:]
	}
}

// Flush completes a last line that has no line end yet (call it once the
// child has exited).
func (b *Buffer) Flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.cur) > 0 {
		b.end()
	}
}

// Lines returns the kept lines, oldest first, with the line being written
// (not yet ended) last, all within the bounds.
func (b *Buffer) Lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	ls := append([]string(nil), b.lines...)
	if s := Clean(b.cur, b.o.MaxLine); s != "" {
		ls = append(ls, s)
		n := b.nbytes + len(s)
		for len(ls) > b.o.MaxLines || n > b.o.MaxBytes {
			n -= len(ls[0])
			ls = ls[1:]
		}
	}
	return ls
}

// Last is the last line (see Lines), "" if there is none.
func (b *Buffer) Last() string {
	ls := b.Lines()
	if len(ls) == 0 {
		return ""
	}
	return ls[len(ls)-1]
}

// String is Lines joined with newlines.
func (b *Buffer) String() string { return strings.Join(b.Lines(), "\n") }

// Clean makes raw one printable line of at most max bytes: invalid UTF-8 and
// control characters become spaces, surrounding space is trimmed, and the
// result is cut on a character boundary.
func Clean(raw []byte, max int) string {
	s := strings.Map(func(r rune) rune {
		if r == utf8.RuneError || r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, string(raw))
	s = strings.TrimSpace(s)
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = strings.TrimSpace(s[:cut])
	}
	return s
}
