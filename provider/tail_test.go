package provider

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

// refLastLine is lastLine computed on the whole stream at once.
func refLastLine(stream []byte, size, maxLine int) string {
	if len(stream) > size {
		stream = stream[len(stream)-size:]
	}
	lines := bytes.FieldsFunc(stream, func(r rune) bool { return r == '\n' || r == '\r' })
	for i := len(lines) - 1; i >= 0; i-- {
		if s := clean(lines[i], maxLine); s != "" {
			return s
		}
	}
	return ""
}

func TestTailLastLine(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   string
	}{
		{"empty", nil, ""},
		{"blank lines", []string{"\n \n\t\n"}, ""},
		{"one line no newline", []string{"boom"}, "boom"},
		{"last non-empty", []string{"a\nb\n\n   \n"}, "b"},
		{"split writes", []string{"sim", "ulated fai", "lure\n"}, "simulated failure"},
		{"carriage return", []string{"1%\r99%\rdone\r"}, "done"},
		{"control chars", []string{"a\x00b\x1b[31mc\n"}, "a b [31mc"},
		{"invalid utf8", []string{"bad \xff byte\n"}, "bad   byte"},
		{"long line cut", []string{strings.Repeat("é", 400) + "\n"}, strings.Repeat("é", 256)},
		{"beyond the tail", []string{"old reason\n", strings.Repeat("y", TailSize)}, strings.Repeat("y", MaxLineLen)},
		{"big write", []string{strings.Repeat("z\n", 10*TailSize) + "end"}, "end"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logged []string
			tl := newTail(TailSize, MaxLineLen, func(s string) { logged = append(logged, s) }, true)
			var all []byte
			for _, w := range tc.writes {
				if n, err := tl.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
				all = append(all, w...)
			}
			tl.flush()
			if got := tl.lastLine(); got != tc.want {
				t.Fatalf("lastLine %q, want %q", got, tc.want)
			}
			if ref := refLastLine(all, TailSize, MaxLineLen); ref != tc.want {
				t.Fatalf("reference %q, want %q", ref, tc.want)
			}
			for _, l := range logged {
				if len(l) > MaxLineLen || l == "" {
					t.Fatalf("logged line of %d bytes", len(l))
				}
			}
		})
	}
}

func FuzzTail(f *testing.F) {
	f.Add([]byte("a\nb\rc"), uint16(1), uint16(2))
	f.Add([]byte(strings.Repeat("x", 3000)+"\n\xff\x00"), uint16(700), uint16(5))
	f.Add([]byte{}, uint16(0), uint16(0))
	f.Fuzz(func(t *testing.T, stream []byte, cut1, cut2 uint16) {
		const size, maxLine = 64, 16
		tl := newTail(size, maxLine, func(s string) {
			if s == "" || len(s) > maxLine || !utf8.ValidString(s) {
				t.Fatalf("logged %q", s)
			}
		}, true)
		a := min(int(cut1), len(stream))
		b := min(a+int(cut2), len(stream))
		for _, p := range [][]byte{stream[:a], stream[a:b], stream[b:]} {
			tl.Write(p)
		}
		tl.flush()
		got := tl.lastLine()
		if want := refLastLine(stream, size, maxLine); got != want {
			t.Fatalf("lastLine %q, reference %q", got, want)
		}
		if len(got) > maxLine || !utf8.ValidString(got) || strings.ContainsAny(got, "\r\n\x00") {
			t.Fatalf("bad reason line %q", got)
		}
	})
}
