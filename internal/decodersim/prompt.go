package decodersim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"

	"github.com/onebitd/onebitd/internal/simkv"
)

// errPromptShape is upstream's text for a prompt of the wrong JSON type.
const errPromptShape = `"prompt" must be a string, a list of tokens, a list of mixed strings & tokens, or a list of prompts`

// parsePrompt turns a completion prompt into token ids with llama-server's
// rules (tokenize_mixed): a string is tokenized with BOS and special-token
// parsing; an array mixes token ids and strings, where only a string in first
// position gets BOS. An array of arrays (several prompts) is refused: the
// simulator serves one prompt per request. Ids must be in the vocabulary.
func parsePrompt(raw json.RawMessage) ([]int, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, apiErr(errInvalidRequest, `"prompt" is required`)
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, apiErr(errInvalidRequest, "%s: %v", errPromptShape, err)
		}
		return simkv.Tokenize(s, true), nil
	case '[':
	default:
		return nil, apiErr(errInvalidRequest, errPromptShape)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, apiErr(errInvalidRequest, "%s: %v", errPromptShape, err)
	}
	toks := make([]int, 0, len(items))
	for i, it := range items {
		it = bytes.TrimSpace(it)
		if len(it) == 0 {
			return nil, apiErr(errInvalidRequest, errPromptShape)
		}
		switch it[0] {
		case '"':
			var s string
			if err := json.Unmarshal(it, &s); err != nil {
				return nil, apiErr(errInvalidRequest, "%s: %v", errPromptShape, err)
			}
			toks = append(toks, simkv.Tokenize(s, i == 0)...)
		case '[':
			return nil, apiErr(errInvalidRequest, "the simulator serves one prompt per request; got a list of prompts")
		default:
			id, err := tokenID(it)
			if err != nil {
				return nil, apiErr(errInvalidRequest, "%s: element %d: %v", errPromptShape, i, err)
			}
			toks = append(toks, id)
		}
	}
	if err := checkTokens(toks); err != nil {
		return nil, err
	}
	return toks, nil
}

// tokenID parses one JSON number as a token id (an integral value).
func tokenID(raw json.RawMessage) (int, error) {
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil {
		return 0, fmt.Errorf("not a token id: %s", truncate(string(raw), 32))
	}
	if f != math.Trunc(f) || f < math.MinInt32 || f > math.MaxInt32 {
		return 0, fmt.Errorf("not a token id: %s", truncate(string(raw), 32))
	}
	return int(f), nil
}

// checkTokens refuses ids outside the vocabulary.
func checkTokens(toks []int) *apiError {
	for i, t := range toks {
		if !simkv.ValidToken(t) {
			return apiErr(errInvalidRequest, "invalid token %d at position %d (vocabulary size %d)", t, i, simkv.VocabSize())
		}
	}
	return nil
}

// parseStop accepts a string or an array of strings (empty strings dropped).
func parseStop(raw json.RawMessage) ([]string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, apiErr(errInvalidRequest, `"stop" must be a string or an array of strings`)
	}
	out := many[:0]
	for _, s := range many {
		if s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
