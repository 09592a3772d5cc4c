package handlers

import (
	"context"
	"fmt"
	"net/http"

	"github.com/onebitd/onebitd/decoder"
)

// DecoderVocab reads the decoder model's vocabulary size where llama-server
// publishes it: GET /v1/models, data[0].meta.n_vocab (its model_meta();
// /props does not carry it). The model list is public in llama-server, so
// this needs no API key. ErrNoVocab when the answer does not say.
func DecoderVocab(ctx context.Context, dec *decoder.Client) (int, error) {
	var out struct {
		Data []struct {
			Meta *struct {
				NVocab int `json:"n_vocab"`
			} `json:"meta"`
		} `json:"data"`
	}
	if err := dec.Call(ctx, "models", http.MethodGet, "/v1/models", nil, &out); err != nil {
		return 0, fmt.Errorf("handlers: n_vocab: %w", err)
	}
	if len(out.Data) == 0 || out.Data[0].Meta == nil || out.Data[0].Meta.NVocab <= 0 {
		return 0, ErrNoVocab
	}
	return out.Data[0].Meta.NVocab, nil
}
