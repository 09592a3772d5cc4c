package watch

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/onebitd/onebitd/event"
)

// Table is the terminal view of `onebitd watch` on a TTY: one row per
// request, in the order they arrived, updated in place as the request moves
// through its states; the phase durations (the elapsed_us between an event
// and the request's previous one), the total, and the step and reason of a
// fallback or a failure in red. Rows that scroll off the top are counted in
// a summary line; the last decoder or provider lifecycle event of each node
// is shown under it. Render redraws the whole frame over the previous one.
type Table struct {
	Rows  int            // request rows shown; 0: DefaultTableRows
	Width int            // terminal columns; lines are cut to it (0: DefaultTableWidth)
	Loc   *time.Location // lifecycle time zone; nil: UTC

	rows      []*tableRow // oldest first, at most Rows
	byKey     map[tableKey]*tableRow
	drawn     int // lines of the last frame
	scrolled  int // requests that scrolled off
	offDone   int
	offFailed int
	offFB     int
	lifecycle []lifecycleLine // per node, first-seen order
}

// Table defaults.
const (
	DefaultTableRows  = 20
	DefaultTableWidth = 160
)

type tableKey struct{ node, boot, id string }

type tableRow struct {
	key    tableKey
	route  string
	state  string
	last   int64 // elapsed_us of the previous event; -1: unknown (first seen mid-way)
	phases [len(tableCols)]int64
	has    [len(tableCols)]bool
	total  int64
	step   string
	reason string
}

type lifecycleLine struct {
	node string
	e    event.Event
}

// tableCols are the phase columns; colOf maps an event to one.
var tableCols = [...]string{"LISTEN", "SHARE", "PREFILL", "HANDOFF", "FORWARD", "FINISH"}

func colOf(ev string) int {
	switch ev {
	case "listen":
		return 0
	case "share":
		return 1
	case "prefill":
		return 2
	case "adopt", "restore", "fallback":
		return 3
	case "forward":
		return 4
	case "finish", "fail":
		return 5
	}
	return -1
}

// has reports whether e's request has a row.
func (t *Table) has(e *event.Event) bool {
	_, ok := t.byKey[tableKey{e.Node, e.Boot, e.RequestID}]
	return ok
}

// Add takes one event.
func (t *Table) Add(e *event.Event) {
	if t.byKey == nil {
		t.byKey = make(map[tableKey]*tableRow)
	}
	if e.RequestID == "" {
		for i := range t.lifecycle {
			if t.lifecycle[i].node == e.Node {
				t.lifecycle[i].e = *e
				return
			}
		}
		if len(t.lifecycle) < 8 {
			t.lifecycle = append(t.lifecycle, lifecycleLine{e.Node, *e})
		}
		return
	}
	k := tableKey{e.Node, e.Boot, e.RequestID}
	r := t.byKey[k]
	if r == nil {
		r = &tableRow{key: k, last: -1}
		if e.From == "received" {
			r.last = 0
		}
		rows := t.Rows
		if rows <= 0 {
			rows = DefaultTableRows
		}
		for len(t.rows) >= rows {
			old := t.rows[0]
			t.rows = t.rows[1:]
			delete(t.byKey, old.key)
			t.scrolled++
			switch {
			case old.route == "fallback":
				t.offFB++
			case old.state == "done":
				t.offDone++
			case old.state == "failed":
				t.offFailed++
			}
		}
		t.rows = append(t.rows, r)
		t.byKey[k] = r
	}
	if c := colOf(e.Event); c >= 0 && r.last >= 0 {
		r.phases[c], r.has[c] = e.ElapsedUS-r.last, true
	}
	r.last = e.ElapsedUS
	r.total = e.ElapsedUS
	r.route, r.state = e.Route, e.To
	if e.Reason != "" && (r.reason == "" || e.To == "fallback") {
		r.step, r.reason = e.Step, e.Reason
	}
}

// Render appends the frame to dst: with colour (a terminal), the cursor
// first goes back over the previous frame and clears it.
func (t *Table) Render(dst []byte, colour bool) []byte {
	width := t.Width
	if width <= 0 {
		width = DefaultTableWidth
	}
	loc := t.Loc
	if loc == nil {
		loc = time.UTC
	}
	if colour && t.drawn > 0 {
		dst = append(dst, "\x1b["...)
		dst = strconv.AppendInt(dst, int64(t.drawn), 10)
		dst = append(dst, "F\x1b[J"...)
	}
	lines := 0
	line := func(cells []cell) {
		dst = appendCells(dst, cells, width, colour)
		lines++
	}
	head := []cell{{s: "NODE", w: 10}, {s: "REQUEST", w: 18}, {s: "ROUTE", w: 8}, {s: "STATE", w: 10}}
	for _, c := range tableCols {
		head = append(head, cell{s: c, w: -7})
	}
	head = append(head, cell{s: "TOTAL", w: -7}, cell{s: "STEP", w: 8}, cell{s: "REASON"})
	line(head)
	for _, r := range t.rows {
		cells := []cell{{s: word(r.key.node), w: 10}, {s: word(r.key.id), w: 18}, {s: word(r.route), w: 8},
			{s: word(r.state), w: 10, colour: stateColour(r.state)}}
		for i := range tableCols {
			s := ""
			if r.has[i] {
				s = micros(r.phases[i])
			}
			cells = append(cells, cell{s: s, w: -7})
		}
		step := ""
		if r.step != "" {
			step = word(r.step)
		}
		cells = append(cells, cell{s: micros(r.total), w: -7}, cell{s: step, w: 8})
		if r.reason != "" {
			cells = append(cells, cell{s: strconv.Quote(r.reason), colour: ansiRed})
		} else {
			cells = append(cells, cell{})
		}
		line(cells)
	}
	if t.scrolled > 0 {
		s := "… " + strconv.Itoa(t.scrolled) + " earlier requests: " + strconv.Itoa(t.offDone) + " done, " +
			strconv.Itoa(t.offFailed) + " failed, " + strconv.Itoa(t.offFB) + " fell back"
		line([]cell{{s: s}})
	}
	for _, l := range t.lifecycle {
		c := ansiYellow
		switch {
		case l.e.Event == "decoder.ready" || l.e.Event == "provider.ready":
			c = ansiGreen
		case l.e.Reason != "":
			c = ansiRed
		}
		s := string(l.e.Time.In(loc).AppendFormat(nil, TimeLayout)) + " " + word(l.node) + " " + word(l.e.Event)
		if l.e.Reason != "" {
			s += " " + strconv.Quote(l.e.Reason)
		}
		line([]cell{{s: s, colour: c}})
	}
	t.drawn = lines
	return dst
}

// cell is one column: w > 0 left-aligned in w columns, w < 0 right-aligned
// in -w, 0 the rest of the line.
type cell struct {
	s      string
	w      int
	colour string
}

func appendCells(dst []byte, cells []cell, width int, colour bool) []byte {
	used := 0
	for i, c := range cells {
		if i > 0 {
			if used+1 >= width {
				break
			}
			dst = append(dst, ' ')
			used++
		}
		s := c.s
		n := utf8.RuneCountInString(s)
		w := c.w
		if w < 0 {
			w = -w
		}
		if w > 0 && n > w {
			s, n = cut(s, w-1)+"…", w
		}
		if room := width - used; n > room {
			s, n = cut(s, room-1)+"…", room
		}
		pad := 0
		if w > n {
			pad = min(w-n, width-used-n)
		}
		if c.w < 0 {
			dst = appendSpaces(dst, pad)
		}
		if colour && c.colour != "" && s != "" {
			dst = append(dst, c.colour...)
			dst = append(dst, s...)
			dst = append(dst, ansiReset...)
		} else {
			dst = append(dst, s...)
		}
		if c.w > 0 && i < len(cells)-1 {
			dst = appendSpaces(dst, pad)
		}
		used += n + pad
		if used >= width {
			break
		}
	}
	// No trailing blanks.
	for len(dst) > 0 && dst[len(dst)-1] == ' ' {
		dst = dst[:len(dst)-1]
	}
	return append(dst, '\n')
}

func appendSpaces(dst []byte, n int) []byte {
	for range n {
		dst = append(dst, ' ')
	}
	return dst
}

// cut returns s's first n runes.
func cut(s string, n int) string {
	if n <= 0 {
		return ""
	}
	i := 0
	for j := range s {
		if i == n {
			return s[:j]
		}
		i++
	}
	return s
}

// word is appendWord as a string: quoted if it holds anything but
// printable non-space characters.
func word(s string) string { return string(appendWord(nil, s)) }

func stateColour(s string) string { return colourOf(s) }

// micros formats microseconds like `onebitd replay`: 850µs, 12.3ms, 4.20s.
func micros(us int64) string {
	switch {
	case us < 1000:
		return strconv.FormatInt(us, 10) + "µs"
	case us < 1_000_000:
		return strconv.FormatFloat(float64(us)/1e3, 'f', 1, 64) + "ms"
	}
	return strconv.FormatFloat(float64(us)/1e6, 'f', 2, 64) + "s"
}
