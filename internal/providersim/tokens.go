package providersim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/onebitd/onebitd/internal/simkv"
)

// MaxTokensFileSize bounds the tokens file: simkv.MaxStateCells ids of up to
// 4 digits plus separators and some whitespace.
const MaxTokensFileSize = 8 * simkv.MaxStateCells

// ParseTokens parses a tokens file: a JSON array of token ids, non-empty, at
// most simkv.MaxStateCells long, every id simkv.ValidToken. Nothing but
// whitespace may follow the array.
func ParseTokens(data []byte) ([]int, error) {
	tokens, err := parseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTokens, err)
	}
	return tokens, nil
}

// parseTokens is ParseTokens with plain (unwrapped) errors.
func parseTokens(data []byte) ([]int, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '[' {
		return nil, errors.New("not a JSON array of token ids")
	}
	var tokens []int
	if err := json.Unmarshal(data, &tokens); err != nil {
		return nil, fmt.Errorf("not a JSON array of token ids: %v", err)
	}
	if len(tokens) == 0 {
		return nil, errors.New("the prompt has no tokens")
	}
	if len(tokens) > simkv.MaxStateCells {
		return nil, fmt.Errorf("%d tokens, at most %d accepted", len(tokens), simkv.MaxStateCells)
	}
	for i, t := range tokens {
		if !simkv.ValidToken(t) {
			return nil, fmt.Errorf("token %d at index %d is not in the vocabulary", t, i)
		}
	}
	return tokens, nil
}

// ReadTokensFile reads and parses the tokens file at path.
func ReadTokensFile(path string) ([]int, error) {
	data, err := readBounded(path, MaxTokensFileSize)
	if err == nil {
		var tokens []int
		if tokens, err = parseTokens(data); err == nil {
			return tokens, nil
		}
	}
	return nil, fmt.Errorf("%w %s: %v", ErrTokens, path, err)
}

// readBounded reads at most limit bytes of path; a longer file is an error.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("cannot open it: %w", pe.Err)
		}
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > limit {
		return nil, fmt.Errorf("%d bytes, larger than %d bytes", fi.Size(), limit)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return data, nil
}
