package tailbuf

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// reference computes Lines on the whole stream at once.
func reference(stream []byte, o Options) []string {
	b := New(o) // for the defaults only
	o = b.o
	var ls []string
	for _, raw := range bytes.FieldsFunc(stream, func(r rune) bool { return r == '\n' || r == '\r' }) {
		if s := Clean(raw[:min(len(raw), 2*o.MaxLine)], o.MaxLine); s != "" {
			ls = append(ls, s)
		}
	}
	n := 0
	for _, l := range ls {
		n += len(l)
	}
	for len(ls) > o.MaxLines || n > o.MaxBytes {
		n -= len(ls[0])
		ls = ls[1:]
	}
	return ls
}

func TestLines(t *testing.T) {
	small := Options{MaxBytes: 10, MaxLines: 3, MaxLine: 4}
	tests := []struct {
		name   string
		o      Options
		writes []string
		want   []string
	}{
		{"empty", Options{}, nil, nil},
		{"blank lines", Options{}, []string{"\n \n\t\n\r\n"}, nil},
		{"one line no newline", Options{}, []string{"boom"}, []string{"boom"}},
		{"split writes", Options{}, []string{"sim", "ulated fai", "lure\n"}, []string{"simulated failure"}},
		{"crlf", Options{}, []string{"a\r\nb\r\n"}, []string{"a", "b"}},
		{"carriage returns", Options{}, []string{"1%\r99%\rdone\r"}, []string{"1%", "99%", "done"}},
		{"control chars", Options{}, []string{"a\x00b\x1b[31mc\n"}, []string{"a b [31mc"}},
		{"invalid utf8", Options{}, []string{"bad \xff byte\n"}, []string{"bad   byte"}},
		{"long line cut on a rune", Options{}, []string{strings.Repeat("é", 400) + "\n"}, []string{strings.Repeat("é", 256)}},
		{"long line in pieces", Options{MaxLine: 8}, []string{"abcdef", "ghijkl", "mnop\nq"}, []string{"abcdefgh", "q"}},
		{"line count bound", small, []string{"a\nb\nc\nd\ne\n"}, []string{"c", "d", "e"}},
		{"byte bound", small, []string{"aaaa\nbbbb\ncccc\n"}, []string{"bbbb", "cccc"}},
		{"pending line counts", small, []string{"a\nb\nc\nd"}, []string{"b", "c", "d"}},
		{"big write", Options{}, []string{strings.Repeat("z\n", 10*DefaultMaxBytes) + "end"}, append(slices.Repeat([]string{"z"}, DefaultMaxLines-1), "end")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logged []string
			o := tc.o
			o.OnLine = func(s string) { logged = append(logged, s) }
			b := New(o)
			var all []byte
			for _, w := range tc.writes {
				if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
				all = append(all, w...)
			}
			if got := b.Lines(); !slices.Equal(got, tc.want) {
				t.Fatalf("Lines %q, want %q", got, tc.want)
			}
			if ref := reference(all, tc.o); !slices.Equal(ref, tc.want) {
				t.Fatalf("reference %q, want %q", ref, tc.want)
			}
			b.Flush()
			if got := b.Lines(); !slices.Equal(got, tc.want) {
				t.Fatalf("after Flush: Lines %q, want %q", got, tc.want)
			}
			want := ""
			if len(tc.want) > 0 {
				want = tc.want[len(tc.want)-1]
			}
			if b.Last() != want || b.String() != strings.Join(tc.want, "\n") {
				t.Fatalf("Last %q String %q", b.Last(), b.String())
			}
			// Every line was logged, in order, and the kept ones are its end.
			if len(logged) < len(tc.want) || !slices.Equal(logged[len(logged)-len(tc.want):], tc.want) {
				t.Fatalf("logged %q, kept %q", logged, tc.want)
			}
		})
	}
}

// An endless line costs bounded memory: only 2×MaxLine bytes are read.
func TestEndlessLineBounded(t *testing.T) {
	b := New(Options{MaxLine: 16})
	chunk := bytes.Repeat([]byte("x"), 1<<10)
	for range 1 << 10 {
		b.Write(chunk)
	}
	if cap(b.cur) > 1<<10+64 || len(b.cur) != 32 {
		t.Fatalf("current line holds %d bytes (cap %d)", len(b.cur), cap(b.cur))
	}
	if got := b.Last(); got != strings.Repeat("x", 16) {
		t.Fatalf("Last %q", got)
	}
}

// Concurrent writers of whole lines: every kept line is one of them, intact,
// and the bounds hold (run with -race).
func TestConcurrentWriters(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	b := New(Options{MaxLines: 50, MaxBytes: 1 << 10, OnLine: func(s string) { mu.Lock(); seen[s] = true; mu.Unlock() }})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				fmt.Fprintf(b, "writer %d line %d\n", g, i)
				if i%50 == 0 {
					_ = b.Lines()
				}
			}
		})
	}
	wg.Wait()
	ls := b.Lines()
	n := 0
	for _, l := range ls {
		n += len(l)
		var g, i int
		if _, err := fmt.Sscanf(l, "writer %d line %d", &g, &i); err != nil {
			t.Fatalf("torn line %q", l)
		}
	}
	if len(ls) > 50 || n > 1<<10 || len(ls) == 0 {
		t.Fatalf("%d lines, %d bytes", len(ls), n)
	}
	if len(seen) != 8*500 {
		t.Fatalf("OnLine saw %d distinct lines, want %d", len(seen), 8*500)
	}
}

func FuzzBuffer(f *testing.F) {
	f.Add([]byte("a\nb\rc"), uint16(1), uint16(2))
	f.Add([]byte(strings.Repeat("x", 3000)+"\n\xff\x00"), uint16(700), uint16(5))
	f.Add([]byte("  \t  "+strings.Repeat("é", 30)+"\r\n"), uint16(3), uint16(9))
	f.Add([]byte{}, uint16(0), uint16(0))
	f.Fuzz(func(t *testing.T, stream []byte, cut1, cut2 uint16) {
		o := Options{MaxBytes: 64, MaxLines: 5, MaxLine: 16}
		o.OnLine = func(s string) {
			if s == "" || len(s) > o.MaxLine || !utf8.ValidString(s) || strings.ContainsAny(s, "\r\n\x00") {
				t.Fatalf("handed on %q", s)
			}
		}
		b := New(o)
		a := min(int(cut1), len(stream))
		c := min(a+int(cut2), len(stream))
		for _, p := range [][]byte{stream[:a], stream[a:c], stream[c:]} {
			b.Write(p)
		}
		got := b.Lines()
		if want := reference(stream, o); !slices.Equal(got, want) {
			t.Fatalf("Lines %q, reference %q", got, want)
		}
		b.Flush()
		if got2 := b.Lines(); !slices.Equal(got, got2) {
			t.Fatalf("Flush changed Lines: %q -> %q", got, got2)
		}
	})
}
