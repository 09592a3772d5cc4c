package decoder

import (
	"strings"
	"testing"
)

func TestValidFilename(t *testing.T) {
	for name, want := range map[string]bool{
		"abc.bin": true, "0123456789abcdef.bin": true,
		"": false, ".": false, "..": false, "a..b": false, "a/b": false, `a\b`: false,
		"a:b": false, " a": false, "a ": false, "a.": false, strings.Repeat("x", 256): false,
		"\xff": false, "a\x00": false,
	} {
		if got := ValidFilename(name); got != want {
			t.Errorf("ValidFilename(%q) = %v", name, got)
		}
	}
}
