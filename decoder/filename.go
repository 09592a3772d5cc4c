package decoder

import (
	"strings"
	"unicode/utf8"
)

// ValidFilename is llama.cpp's fs_validate_filename: what a slot action
// (save, restore) accepts as a filename. No directories: the file is always
// <slot-save-path>/<filename>.
func ValidFilename(name string) bool {
	if name == "" || len(name) > 255 || !utf8.ValidString(name) {
		return false
	}
	for _, c := range name {
		switch {
		case c <= 0x1f, c == 0x7f, c >= 0x80 && c <= 0x9f,
			c == 0xff0e, c == 0x2215, c == 0x2216,
			c >= 0xd800 && c <= 0xdfff, c == 0xfffd, c == 0xfeff,
			strings.ContainsRune(`:*?"<>|/\`, c):
			return false
		}
	}
	if name[0] == ' ' || name[len(name)-1] == ' ' || name[len(name)-1] == '.' {
		return false
	}
	return !strings.Contains(name, "..") && name != "."
}
