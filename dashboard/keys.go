package dashboard

import (
	"crypto/sha256"
	"crypto/subtle"
)

// KeyChecker returns a Config.CheckKey that accepts exactly keys (nil when
// keys is empty: no check). A presented key is hashed and compared with
// every key's SHA-256 digest in constant time, so neither which key matched
// nor the keys' lengths show in the timing; it is the same check as the
// daemon's front (handlers.RequireKey).
func KeyChecker(keys []string) func(key string) bool {
	if len(keys) == 0 {
		return nil
	}
	sums := make([][sha256.Size]byte, len(keys))
	for i, k := range keys {
		sums[i] = sha256.Sum256([]byte(k))
	}
	return func(key string) bool {
		got := sha256.Sum256([]byte(key))
		ok := 0
		for i := range sums {
			ok |= subtle.ConstantTimeCompare(got[:], sums[i][:])
		}
		return ok == 1
	}
}
