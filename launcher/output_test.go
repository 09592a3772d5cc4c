package launcher

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/onebitd/onebitd/internal/obtest"
)

// The decoder's stdout and stderr are logged line by line; the last stderr
// lines are kept, bounded, for error messages.
func TestSpawnOutput(t *testing.T) {
	tests := []struct {
		name   string
		script string
		logged []string
		tail   string
		exit   string
	}{
		{"both streams", "echo out; echo err1 >&2; printf 'err2' >&2; exit 2",
			[]string{"stream=stdout pid=", "decoder_output=out", "decoder_output=err1", "decoder_output=err2"}, "err1\nerr2", "exit status 2"},
		{"no output", "exit 0", nil, "(no output)", "exit status 0"},
		{"tail bounded", "i=0; while [ $i -lt 100 ]; do echo line $i >&2; i=$((i+1)); done; head -c 5000 /dev/zero | tr '\\0' y >&2",
			[]string{"decoder_output=\"line 99\""}, "", "exit status 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf obtest.Buffer
			p, err := spawn("/bin/sh", []string{"-c", tc.script}, slog.New(slog.NewTextHandler(&buf, nil)))
			if err != nil {
				t.Fatal(err)
			}
			<-p.exited
			for _, want := range tc.logged {
				if !strings.Contains(buf.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, buf.String())
				}
			}
			tail := p.stderrTail()
			if tc.tail != "" && tail != tc.tail {
				t.Errorf("tail %q, want %q", tail, tc.tail)
			}
			if lines := strings.Split(tail, "\n"); len(lines) > TailLines || len(tail) > TailLines*(maxTailLine+1) {
				t.Errorf("tail of %d lines, %d bytes", len(lines), len(tail))
			} else if tc.name == "tail bounded" && (lines[len(lines)-1] != strings.Repeat("y", maxTailLine) || lines[len(lines)-2] != "line 99") {
				t.Errorf("tail ends %q", lines[len(lines)-2:])
			}
			if got := p.exitReason(); got != tc.exit {
				t.Errorf("exit %q, want %q", got, tc.exit)
			}
		})
	}
}
