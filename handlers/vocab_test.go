package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/internal/simkv"
)

// TestDecoderVocab: n_vocab is read where llama-server publishes it, the
// model's meta in GET /v1/models.
func TestDecoderVocab(t *testing.T) {
	dec, err := decoder.New(sim(t, nil).URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := DecoderVocab(context.Background(), dec)
	if err != nil || n != simkv.VocabSize() {
		t.Fatalf("n_vocab %d %v, want %d", n, err, simkv.VocabSize())
	}
	// A decoder that does not say: ErrNoVocab, not a guess.
	bare := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"object":"list","data":[{"id":"m"}]}`))
	}))
	defer bare.Close()
	dec2, _ := decoder.New(bare.URL, nil)
	if n, err := DecoderVocab(context.Background(), dec2); n != 0 || err == nil {
		t.Fatalf("no meta: %d %v", n, err)
	}
}

// TestTokenIDsOutsideVocab (issue 10 §6): a prompt of token ids with an id
// outside [0, n_vocab) is refused with llama-server's own answer (400
// invalid_request_error "Prompt contains invalid tokens") before a provider
// sees it; a prompt inside the vocabulary is handed over.
func TestTokenIDsOutsideVocab(t *testing.T) {
	dec, sc := simWrap(t, nil, nil)
	client, _ := decoder.New(dec.URL, nil)
	nv, err := DecoderVocab(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	route, mark := fileRoute(t, dec.URL, sc)
	f := newFront(t, dec.URL, func(c *Config) { route(c); c.NVocab = nv })
	for _, prompt := range []string{
		"[1," + itoa(nv) + "]",
		"[1,-1,300]",
		"[1,300,4294968296]",
		"[1,300,9223372036854775807]",
	} {
		resp, raw := post(t, f.url+"/completion", `{"prompt":`+prompt+`,"n_predict":1}`)
		if resp.StatusCode != 400 {
			t.Fatalf("%s: %d %s", prompt, resp.StatusCode, raw)
		}
		if msg := errorShape(t, raw, 400, typeInvalidRequest); msg != "Prompt contains invalid tokens" {
			t.Fatalf("%s: message %q", prompt, msg)
		}
		if _, err := os.Stat(mark); err == nil {
			saw, _ := os.ReadFile(mark)
			t.Fatalf("%s: the provider saw %s", prompt, saw)
		}
	}
	if n := len(f.mem.Events()); n != 0 {
		t.Fatalf("refused prompts made %d events", n)
	}

	// The test's own check: a prompt inside the vocabulary reaches the provider.
	toks, err := client.Tokenize(context.Background(), " the cache is warm the cache")
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := json.Marshal(toks)
	resp, raw := post(t, f.url+"/completion", `{"prompt":`+string(ids)+`,"n_predict":1}`)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderRoute) != "file" {
		t.Fatalf("valid ids: %d %s %s", resp.StatusCode, resp.Header.Get(HeaderRoute), raw)
	}
	if saw, err := os.ReadFile(mark); err != nil || !strings.Contains(string(saw), strings.Trim(string(ids), "[]")) {
		t.Fatalf("the provider saw %q (%v), want %s", saw, err, ids)
	}
}
