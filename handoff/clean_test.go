package handoff

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCleanStale(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	id := NewRequestID()
	if len(id) != RequestIDLen {
		t.Fatalf("id %q", id)
	}
	ours := []string{id + ".sock", id + ".tokens", id + ".json", id + ".bin", id + ".bin.tmp"}
	theirs := []string{"saved-by-user.bin", "r123.bin", id + ".txt", "x" + id[1:] + ".bin"}
	for _, n := range append(ours, theirs...) {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n, err := CleanStale(dir)
	if err != nil || n != len(ours) {
		t.Fatalf("removed %d (%v), want %d", n, err, len(ours))
	}
	left, _ := os.ReadDir(dir)
	if len(left) != len(theirs) {
		t.Fatalf("left %d files, want the %d that are not ours", len(left), len(theirs))
	}
}
