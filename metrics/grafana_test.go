package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestGrafanaDashboardNames: every series docs/grafana/onebitd.json queries
// is one this package exposes (a renamed metric breaks the test, not the
// dashboard in production), and the file is valid JSON.
func TestGrafanaDashboardNames(t *testing.T) {
	b, err := os.ReadFile("../docs/grafana/onebitd.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("onebitd.json: %v", err)
	}
	m := New(Config{})
	feedFile(t, m, "testdata/events.jsonl")
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	exposed := map[string]bool{}
	for _, mf := range mfs {
		exposed[mf.GetName()] = true
	}
	name := regexp.MustCompile(`\b(onebitd|process|go)_[a-z_]+\b`)
	n := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, s := range name.FindAllString(tg.Expr, -1) {
				base := s
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(s, suf); ok && exposed[b] {
						base = b
					}
				}
				if !exposed[base] {
					t.Errorf("panel %q queries %s, which /metrics does not expose", p.Title, s)
				}
				n++
			}
		}
	}
	if n < 15 {
		t.Errorf("only %d series references in the dashboard", n)
	}
}
