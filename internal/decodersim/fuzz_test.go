package decodersim

import (
	"encoding/json"
	"testing"

	"github.com/onebitd/onebitd/internal/simkv"
)

// FuzzParsePrompt feeds arbitrary /completion bodies through the request
// parser: it must never panic, must answer 400 for a bad prompt, and every
// accepted prompt must be in the vocabulary.
func FuzzParsePrompt(f *testing.F) {
	for _, seed := range []string{
		`{"prompt":"Hello the world"}`,
		`{"prompt":[1,1000,1001,2]}`,
		`{"prompt":["The", 1000, " cache", 3]}`,
		`{"prompt":[1000, "mixed"]}`,
		`{"prompt":[[1,2],[3]]}`,
		`{"prompt":[1.5]}`,
		`{"prompt":[1e300]}`,
		`{"prompt":[-7]}`,
		`{"prompt":null}`,
		`{"prompt":{}}`,
		`{"prompt":"\u0000\ud800"}`,
		`{"prompt":[true,null,"x"]}`,
		`{"prompt":"x","stop":["a",""],"n_predict":0}`,
		`{}`,
		`[`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req genRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return // answered 500 before the prompt parser
		}
		toks, e := parsePrompt(req.Prompt)
		if e != nil {
			if e.Code != 400 || e.Type != "invalid_request_error" || e.Message == "" {
				t.Fatalf("bad error %+v", e)
			}
			return
		}
		for _, tok := range toks {
			if !simkv.ValidToken(tok) {
				t.Fatalf("accepted invalid token %d from %s", tok, body)
			}
		}
		if _, e := parseStop(req.Stop); e != nil && e.Code != 400 {
			t.Fatalf("bad stop error %+v", e)
		}
	})
}
