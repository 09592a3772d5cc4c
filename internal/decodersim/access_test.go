package decodersim

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onebitd/onebitd/internal/simkv"
)

// TestAPIKey: with API keys every endpoint but the public ones (/health,
// /v1/health, /models, /v1/models, /api/tags) answers 401 in llama-server's
// shape unless the request carries a configured key, as "Authorization:
// Bearer KEY" (or a bare key, or X-Api-Key, as upstream accepts).
func TestAPIKey(t *testing.T) {
	cfg := testConfig(t)
	cfg.APIKeys = []string{"k-one", "k-two"}
	s := startSim(t, cfg)
	const invalid = `{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}`
	tests := []struct {
		name, method, path, body string
		header                   map[string]string
		status                   int
	}{
		{"health is open", "GET", "/health", "", nil, 200},
		{"v1 health is open", "GET", "/v1/health", "", nil, 200},
		{"models is open", "GET", "/v1/models", "", nil, 200},
		{"props without key", "GET", "/props", "", nil, 401},
		{"slots without key", "GET", "/slots", "", nil, 401},
		{"save without key", "POST", "/slots/0?action=save", `{"filename":"x.bin"}`, nil, 401},
		{"restore without key", "POST", "/slots/0?action=restore", `{"filename":"x.bin"}`, nil, 401},
		{"erase without key", "POST", "/slots/0?action=erase", "", nil, 401},
		{"share without key", "POST", "/slots/0?action=share", `{"socket":"/tmp/x.sock"}`, nil, 401},
		{"adopt without key", "POST", "/slots/0?action=adopt", `{"tokens":[1],"share_id":1}`, nil, 401},
		{"completion without key", "POST", "/completion", `{"prompt":"x","n_predict":1}`, nil, 401},
		{"tokenize without key", "POST", "/tokenize", `{"content":"x"}`, nil, 401},
		{"unknown route without key", "GET", "/nope", "", nil, 401},
		{"wrong key", "GET", "/props", "", map[string]string{"Authorization": "Bearer k-three"}, 401},
		{"key prefix", "GET", "/props", "", map[string]string{"Authorization": "Bearer k-on"}, 401},
		{"key with suffix", "GET", "/props", "", map[string]string{"Authorization": "Bearer k-onex"}, 401},
		{"basic auth", "GET", "/props", "", map[string]string{"Authorization": "Basic k-one"}, 401},
		{"lower-case bearer", "GET", "/props", "", map[string]string{"Authorization": "bearer k-one"}, 401},
		{"first key", "GET", "/props", "", map[string]string{"Authorization": "Bearer k-one"}, 200},
		{"second key", "GET", "/slots", "", map[string]string{"Authorization": "Bearer k-two"}, 200},
		{"bare key", "GET", "/props", "", map[string]string{"Authorization": "k-one"}, 200},
		{"x-api-key", "GET", "/props", "", map[string]string{"X-Api-Key": "k-two"}, 200},
		{"erase with key", "POST", "/slots/0?action=erase", "", map[string]string{"Authorization": "Bearer k-one"}, 200},
		{"unknown route with key", "GET", "/nope", "", map[string]string{"Authorization": "Bearer k-one"}, 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, s.ts.URL+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			resp, err := s.ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			_, _ = fmt.Fprint(&b, readAllString(t, resp))
			if resp.StatusCode != tc.status {
				t.Fatalf("%d %s, want %d", resp.StatusCode, b.String(), tc.status)
			}
			if tc.status == 401 && b.String() != invalid {
				t.Errorf("body %s, want %s", b.String(), invalid)
			}
		})
	}
}

func readAllString(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return b.String()
}

// TestAPIKeyFlags: --api-key takes a comma-separated list, --api-key-file
// one key a line (empty lines skipped), both add up; a missing file is an
// error.
func TestAPIKeyFlags(t *testing.T) {
	model := writeModel(t, "m")
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	if err := os.WriteFile(file, []byte("alpha\n\nbeta\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want []string
		err  string
	}{
		{[]string{"-m", model}, nil, ""},
		{[]string{"-m", model, "--api-key", "a,b"}, []string{"a", "b"}, ""},
		{[]string{"-m", model, "--api-key-file", file}, []string{"alpha", "beta"}, ""},
		{[]string{"-m", model, "--api-key", "x", "--api-key-file", file}, []string{"x", "alpha", "beta"}, ""},
		{[]string{"-m", model, "--api-key-file", filepath.Join(dir, "none")}, nil, "--api-key-file"},
	}
	for _, tc := range tests {
		c, err := ParseArgs(tc.args, nil)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: err %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || strings.Join(c.APIKeys, "|") != strings.Join(tc.want, "|") {
			t.Errorf("%v: keys %q err %v, want %q", tc.args, c.APIKeys, err, tc.want)
		}
	}
}

// TestExactKeys: llama-server reads bodies with nlohmann::json, whose keys
// match exactly (no case or Unicode folding) and whose duplicate keys keep
// the last value. encoding/json folds case ("ID_SLOT") and Unicode ("id_ſlot",
// U+017F) and would pick another slot than the one onebitd named.
func TestExactKeys(t *testing.T) {
	cfg := testConfig(t)
	cfg.NParallel = 2
	s := startSim(t, cfg)
	tests := []struct {
		name string
		body string
		slot int
	}{
		{"plain", `{"prompt":"x","n_predict":0,"id_slot":1}`, 1},
		{"upper-case twin after", `{"prompt":"x","n_predict":0,"id_slot":0,"ID_SLOT":1}`, 0},
		{"long-s twin after", `{"prompt":"x","n_predict":0,"id_slot":0,"id_ſlot":1}`, 0},
		{"kelvin twin", `{"prompt":"x","n_predict":0,"id_slot":1,"\u212a":0}`, 1},
		{"duplicate keeps last", `{"prompt":"x","n_predict":0,"id_slot":0,"id_slot":1}`, 1},
		{"duplicate keeps last, other order", `{"prompt":"x","n_predict":0,"id_slot":1,"id_slot":0}`, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.t = t
			r := s.post("/completion", tc.body)
			if r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if got := r.json(t)["id_slot"]; got != float64(tc.slot) {
				t.Errorf("id_slot %v, want %d", got, tc.slot)
			}
		})
	}
	// A key that matches only by folding is absent: no content to tokenize,
	// no filename, no role.
	absent := []struct {
		path, body string
		status     int
		want       string
	}{
		{"/tokenize", `{"Content":" the"}`, 200, `{"tokens":[]}`},
		{"/tokenize", `{"content":" the","CONTENT":" a"}`, 200, fmt.Sprintf(`{"tokens":[%d]}`, simkv.Tokenize(" the", false)[0])},
		{"/slots/0?action=save", `{"FileName":"x.bin"}`, 500, "key 'filename' not found"},
		{"/apply-template", `{"messages":[{"ROLE":"user","content":"hi"}]}`, 400, "missing 'role'"},
		{"/slots/0?action=adopt", `{"tokens":[1],"Share_ID":1}`, 400, "share_id is required"},
	}
	for _, tc := range absent {
		s.t = t
		r := s.post(tc.path, tc.body)
		if r.status != tc.status || !strings.Contains(string(r.body), tc.want) {
			t.Errorf("%s %s: %d %s, want %d containing %s", tc.path, tc.body, r.status, r.body, tc.status, tc.want)
		}
	}
}
