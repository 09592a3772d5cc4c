package launcher

import (
	"strings"
	"testing"
)

func collect(chunks ...string) []string {
	var got []string
	w := &lineWriter{emit: func(s string) { got = append(got, s) }}
	for _, c := range chunks {
		_, _ = w.Write([]byte(c))
	}
	w.flush()
	return got
}

func TestLineWriter(t *testing.T) {
	long := strings.Repeat("x", maxLine+10)
	tests := []struct {
		name   string
		chunks []string
		want   []string
	}{
		{"one line", []string{"hello\n"}, []string{"hello"}},
		{"split across writes", []string{"hel", "lo\nwor", "ld\n"}, []string{"hello", "world"}},
		{"crlf", []string{"a\r\nb\r\n"}, []string{"a", "b"}},
		{"no final newline", []string{"a\nb"}, []string{"a", "b"}},
		{"empty lines", []string{"\n\n"}, []string{"", ""}},
		{"nothing", nil, nil},
		{"long line split", []string{long + "\n"}, []string{long[:maxLine], long[maxLine:]}},
		{"long line in pieces", []string{long[:100], long[100:], "\n"}, []string{long[:maxLine], long[maxLine:]}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := collect(tt.chunks...)
			if strings.Join(got, "|") != strings.Join(tt.want, "|") || len(got) != len(tt.want) {
				t.Errorf("got %d lines %q, want %d", len(got), trunc(got), len(tt.want))
			}
		})
	}
}

func trunc(ls []string) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		if len(l) > 20 {
			l = l[:20] + "…"
		}
		out[i] = l
	}
	return out
}

func TestTail(t *testing.T) {
	tl := newTail(3)
	if got := tl.String(); got != "(no output)" {
		t.Errorf("empty tail %q", got)
	}
	for _, l := range []string{"a", "b"} {
		tl.add(l)
	}
	if got := tl.String(); got != "a\nb" {
		t.Errorf("tail %q", got)
	}
	for _, l := range []string{"c", "d", "e"} {
		tl.add(l)
	}
	if got := tl.String(); got != "c\nd\ne" {
		t.Errorf("tail %q", got)
	}
	tl.add(strings.Repeat("y", 2*maxTailLine))
	if got := tl.String(); len(got) > 2*maxTailLine {
		t.Errorf("long line kept whole (%d bytes)", len(got))
	}
}

// FuzzLineWriter: whatever the decoder writes, in whatever pieces, the
// emitted lines are its bytes (minus newlines and a \r before them), none
// longer than maxLine.
func FuzzLineWriter(f *testing.F) {
	f.Add("hello\nworld\n", 3)
	f.Add("a\r\n\r\n\n", 1)
	f.Add(strings.Repeat("z", maxLine+1), 7)
	f.Add("", 0)
	f.Fuzz(func(t *testing.T, in string, cut int) {
		if cut < 0 {
			cut = -cut
		}
		var chunks []string
		if cut > 0 {
			for s := in; len(s) > 0; {
				n := min(cut, len(s))
				chunks = append(chunks, s[:n])
				s = s[n:]
			}
		} else {
			chunks = []string{in}
		}
		got := collect(chunks...)
		var b strings.Builder
		for _, l := range got {
			if len(l) > maxLine {
				t.Fatalf("line of %d bytes", len(l))
			}
			b.WriteString(l)
		}
		want := strings.NewReplacer("\r\n", "", "\n", "").Replace(in)
		// A lone \r at a line end is dropped too; compare without any \r
		// that precedes a newline in the input.
		if strings.ReplaceAll(b.String(), "\r", "") != strings.ReplaceAll(want, "\r", "") {
			t.Fatalf("lost bytes: %q → %q", in, got)
		}
	})
}
