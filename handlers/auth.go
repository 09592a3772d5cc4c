package handlers

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// keySet holds the SHA-256 digest of each API key. A presented key is
// hashed and compared with every digest in constant time, so neither the
// position of the matching key nor the keys' lengths show in the timing
// (subtle.ConstantTimeCompare returns early on a length mismatch).
type keySet [][sha256.Size]byte

func newKeySet(keys []string) keySet {
	ks := make(keySet, 0, len(keys))
	for _, k := range keys {
		if k != "" {
			ks = append(ks, sha256.Sum256([]byte(k)))
		}
	}
	return ks
}

// match reports whether got is one of the keys; it looks at every key.
func (ks keySet) match(got string) bool {
	d := sha256.Sum256([]byte(got))
	ok := 0
	for i := range ks {
		ok |= subtle.ConstantTimeCompare(d[:], ks[i][:])
	}
	return ok == 1
}

// presentedKey is the credential of a request as llama-server reads it
// (middleware_validate_api_key): the Authorization header, or X-Api-Key
// when Authorization is empty, without a leading "Bearer " (the scheme is
// matched without regard to case, RFC 9110 §11.1).
func presentedKey(h http.Header) string {
	k := h.Get("Authorization")
	if k == "" {
		k = h.Get("X-Api-Key")
	}
	if len(k) >= len("bearer ") && strings.EqualFold(k[:len("bearer ")], "bearer ") {
		k = k[len("bearer "):]
	}
	return k
}

// writeUnauthorized is llama-server's answer to a missing or wrong key.
func writeUnauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="onebitd"`)
	writeError(w, http.StatusUnauthorized, typeAuthentication, "Invalid API Key")
}

// RequireKey wraps next so that it serves only requests that present one of
// keys (llama-server's convention: "Authorization: Bearer KEY", or
// "X-Api-Key: KEY"); any other request is answered 401 authentication_error
// "Invalid API Key" in llama-server's error shape. With no keys it returns
// next unchanged (llama-server without --api-key). The daemon wraps the
// handlers it serves beside the front (/metrics, a UI) with it.
func RequireKey(keys []string, next http.Handler) http.Handler {
	ks := newKeySet(keys)
	if len(ks) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ks.match(presentedKey(r.Header)) {
			writeUnauthorized(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// LoadAPIKeys reads an API key file (--api-key-file): one key a line,
// surrounding white space (a CRLF line end) dropped, blank lines skipped.
// A file that holds no key is ErrNoAPIKeys: an empty file must never mean
// "no authentication".
func LoadAPIKeys(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("handlers: API key file: %w", err)
	}
	var keys []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if k := strings.TrimSpace(sc.Text()); k != "" {
			keys = append(keys, k)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("handlers: API key file %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoAPIKeys, path)
	}
	return keys, nil
}
