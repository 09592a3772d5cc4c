package dashboard

import "testing"

func TestKeyChecker(t *testing.T) {
	if KeyChecker(nil) != nil {
		t.Fatal("no keys: a checker")
	}
	check := KeyChecker([]string{"alpha", "beta-longer-key"})
	for _, tt := range []struct {
		key  string
		want bool
	}{{"alpha", true}, {"beta-longer-key", true}, {"", false}, {"alph", false}, {"alphaa", false}, {"Alpha", false}} {
		if got := check(tt.key); got != tt.want {
			t.Errorf("check(%q) = %v", tt.key, got)
		}
	}
}
