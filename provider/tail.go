package provider

import (
	"bytes"
	"strings"
	"sync"
	"unicode/utf8"
)

// tail is the provider's stderr: it keeps the last size bytes and hands
// every complete line (cut to maxLine bytes) to onLine when logging is on.
// '\r' ends a line too, so progress output counts as lines.
type tail struct {
	mu      sync.Mutex
	size    int
	maxLine int
	buf     []byte // the last size bytes are buf[len(buf)-size:]
	onLine  func(string)
	logOn   bool
	line    []byte // current line for logging, at most maxLine bytes
}

func newTail(size, maxLine int, onLine func(string), logOn bool) *tail {
	return &tail{size: size, maxLine: maxLine, onLine: onLine, logOn: logOn}
}

// Write never fails: a provider must not block or die on a full stderr.
func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) > t.size {
		if t.logOn {
			t.logLines(p[:len(p)-t.size])
		}
		p = p[len(p)-t.size:]
	}
	if t.logOn {
		t.logLines(p)
	}
	if len(t.buf)+len(p) > 2*t.size {
		keep := t.size - len(p)
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-keep:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

func (t *tail) logLines(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			t.addToLine(p)
			return
		}
		t.addToLine(p[:i])
		t.emit()
		p = p[i+1:]
	}
}

func (t *tail) addToLine(p []byte) {
	if room := t.maxLine - len(t.line); room > 0 {
		t.line = append(t.line, p[:min(room, len(p))]...)
	}
}

func (t *tail) emit() {
	if s := clean(t.line, t.maxLine); s != "" {
		t.onLine(s)
	}
	t.line = t.line[:0]
}

// flush logs the last line when it did not end in a newline.
func (t *tail) flush() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.logOn {
		t.emit()
	}
}

// lastLine is the last non-empty line of the kept bytes, cleaned and cut to
// maxLine bytes ("" if there is none).
func (t *tail) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if len(b) > t.size {
		b = b[len(b)-t.size:]
	}
	for len(b) > 0 {
		i := bytes.LastIndexAny(b, "\r\n")
		if s := clean(b[i+1:], t.maxLine); s != "" {
			return s
		}
		if i < 0 {
			break
		}
		b = b[:i]
	}
	return ""
}

// clean makes b one printable line: invalid UTF-8 and control characters
// become spaces, surrounding space is trimmed, and the result is cut to at
// most max bytes on a character boundary.
func clean(b []byte, max int) string {
	s := strings.Map(func(r rune) rune {
		if r == utf8.RuneError || r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, string(b))
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
