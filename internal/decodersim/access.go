package decodersim

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// publicPaths are the paths llama-server serves without an API key.
var publicPaths = map[string]bool{
	"/": true, "/health": true, "/v1/health": true, "/models": true, "/v1/models": true, "/api/tags": true,
}

// authorized is llama-server's middleware_validate_api_key: without keys
// everything is open; with keys, every path but the public ones needs one of
// them in "Authorization" (a "Bearer " prefix is removed) or, when that
// header is empty, in "X-Api-Key". Keys are compared in constant time.
func (s *Server) authorized(r *http.Request) bool {
	if len(s.cfg.APIKeys) == 0 || publicPaths[r.URL.Path] {
		return true
	}
	got := r.Header.Get("Authorization")
	if got == "" {
		got = r.Header.Get("X-Api-Key")
	}
	got = strings.TrimPrefix(got, "Bearer ")
	ok := 0
	for _, k := range s.cfg.APIKeys {
		ok |= subtle.ConstantTimeCompare([]byte(got), []byte(k))
	}
	return ok == 1
}

// splitKeys is --api-key's value: a comma-separated list (empty items dropped).
func splitKeys(s string) []string {
	var out []string
	for _, k := range strings.Split(s, ",") {
		if k != "" {
			out = append(out, k)
		}
	}
	return out
}

// readKeyFile is --api-key-file: one key a line, empty lines skipped, as
// llama-server reads it (a line is taken as is, without trimming).
func readKeyFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--api-key-file: %w", err)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if k := sc.Text(); k != "" {
			out = append(out, k)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--api-key-file %s: %w", path, err)
	}
	return out, nil
}
