package simfault

import (
	"strings"
	"testing"

	"github.com/onebitd/onebitd/internal/simkv"
)

func TestFind(t *testing.T) {
	for _, tc := range []struct {
		text string
		want Fault
	}{
		{"", None},
		{"the cache of FAULT:prov-hang and", ProvHang},
		{"FAULT:prov-hang", ProvHang},
		{"FAULT:prov-hangs FAULT:dec-500", Dec500}, // a longer name is not the fault
		{"FAULT:nope FAULT:gen-slow.", GenSlow},
		{"FAULT:", None},
		{"fault:prov-fail", None}, // case matters
		{"FAULT:prov-fail FAULT:dec-501", ProvFail},
		{"<|im_start|>user\n the FAULT:share-garbage<|im_end|>", ShareGarbage},
	} {
		if got := Find(tc.text); got != tc.want {
			t.Errorf("Find(%q) = %q, want %q", tc.text, got, tc.want)
		}
	}
}

// TestFromTokens: a marker survives the simulator's tokenizer whatever
// surrounds it, and every fault is found.
func TestFromTokens(t *testing.T) {
	for _, f := range All {
		for _, text := range []string{" the cache " + Marker(f) + " of slot", Marker(f), " water" + Marker(f)} {
			if got := FromTokens(simkv.Tokenize(text, true)); got != f {
				t.Errorf("FromTokens(Tokenize(%q)) = %q, want %q", text, got, f)
			}
		}
	}
}

func TestKinds(t *testing.T) {
	for _, f := range All {
		if f.Provider() && f.SlotAction() {
			t.Errorf("%s is both a provider and a slot action fault", f)
		}
		if f.Provider() != strings.HasPrefix(string(f), "prov-") {
			t.Errorf("%s: Provider() wrong", f)
		}
	}
}

func FuzzFind(f *testing.F) {
	for _, s := range []string{"FAULT:prov-hang", "FAULT:FAULT:dec-500", "xFAULT:gen-500-", "FAULT:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := Find(s)
		if got != None && !strings.Contains(s, Marker(got)) {
			t.Fatalf("Find(%q) = %q, not in the text", s, got)
		}
	})
}
