package decodersim

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/onebitd/onebitd/internal/simkv"
)

// errPromptShape is upstream's text for a prompt of the wrong JSON type.
const errPromptShape = `"prompt" must be a string, a list of tokens, a list of mixed strings & tokens, or a list of prompts`

// errPromptElement is upstream's text for a bad element of a prompt list.
const errPromptElement = `element of "prompt" must be a string, an list of tokens, or a list of mixed strings & tokens`

// errManyPrompts: the simulator serves one prompt per request.
const errManyPrompts = "the simulator serves one prompt per request; got a list of %d prompts"

// parsePrompt turns a completion prompt into token ids with llama-server's
// rules (tokenize_input_prompts): a string is tokenized with BOS; an array of
// integers is token ids; an array mixing strings and integers is tokenized
// piece by piece (only a string in first position gets BOS); any other array
// is a list of prompts, of which the simulator accepts exactly one. Ids must
// be in the vocabulary.
func parsePrompt(raw json.RawMessage) ([]int, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, apiErr(errInvalidRequest, `"prompt" is required`)
	}
	toks, e := parseOnePrompt(raw, true)
	if e != nil {
		return nil, e
	}
	for _, t := range toks {
		if !simkv.ValidToken(t) { // upstream's answer, from server_tokens::validate
			return nil, apiErr(errInvalidRequest, "Prompt contains invalid tokens")
		}
	}
	return toks, nil
}

// parseOnePrompt parses a prompt; top is false inside a list of prompts.
func parseOnePrompt(raw json.RawMessage, top bool) ([]int, *apiError) {
	shapeErr := errPromptShape
	if !top {
		shapeErr = errPromptElement
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, apiErr(errInvalidRequest, "%s: %v", shapeErr, err)
		}
		return simkv.Tokenize(s, true), nil
	case '[':
	default:
		return nil, apiErr(errInvalidRequest, "%s", shapeErr)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, apiErr(errInvalidRequest, "%s: %v", shapeErr, err)
	}
	nStr, nInt := 0, 0
	for i := range items {
		items[i] = bytes.TrimSpace(items[i])
		switch {
		case len(items[i]) > 0 && items[i][0] == '"':
			nStr++
		case isInteger(items[i]):
			nInt++
		}
	}
	switch {
	case nInt == len(items): // token ids (also the empty prompt)
		toks := make([]int, len(items))
		for i, it := range items {
			toks[i] = tokenID(it)
		}
		return toks, nil
	case nStr > 0 && nInt > 0 && nStr+nInt == len(items): // mixed
		var toks []int
		for i, it := range items {
			if it[0] != '"' {
				toks = append(toks, tokenID(it))
				continue
			}
			var s string
			if err := json.Unmarshal(it, &s); err != nil {
				return nil, apiErr(errInvalidRequest, "%s: %v", shapeErr, err)
			}
			toks = append(toks, simkv.Tokenize(s, i == 0)...)
		}
		return toks, nil
	case !top:
		return nil, apiErr(errInvalidRequest, errPromptElement)
	}
	// A list of prompts.
	for _, it := range items {
		if len(it) == 0 || it[0] != '"' && it[0] != '[' {
			return nil, apiErr(errInvalidRequest, errPromptElement)
		}
	}
	if len(items) != 1 {
		return nil, apiErr(errInvalidRequest, errManyPrompts, len(items))
	}
	return parseOnePrompt(items[0], false)
}

// isInteger reports whether raw is a JSON integer literal (no fraction or
// exponent, like nlohmann's is_number_integer).
func isInteger(raw json.RawMessage) bool {
	s := string(raw)
	s = strings.TrimPrefix(s, "-")
	if s == "" || len(s) > 1 && s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// tokenID converts an integer literal (see isInteger); values outside int32
// become -1, which checkTokens refuses.
func tokenID(raw json.RawMessage) int {
	v, err := strconv.ParseInt(string(raw), 10, 32)
	if err != nil {
		return -1
	}
	return int(v)
}

// checkTokens refuses ids outside the vocabulary (adopt, restore; a
// completion answers upstream's "Prompt contains invalid tokens").
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
