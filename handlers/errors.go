package handlers

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// Errors of this package.
var (
	// ErrNoAPIKeys: an API key file holds no key.
	ErrNoAPIKeys = errors.New("handlers: the API key file holds no key (one key a line)")
	// ErrNoVocab: the decoder's model list does not say n_vocab.
	ErrNoVocab = errors.New("handlers: the decoder's /v1/models has no meta.n_vocab")
)

// llama-server's error types (tools/server format_error_response). A 408
// (a body that did not arrive in time) and a 413 are the client's request
// at fault: invalid_request_error, with the HTTP status as code.
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error" // 401
	typePermission     = "permission_error"     // 403
	typeNotFound       = "not_found_error"
	typeServer         = "server_error"
	typeUnavailable    = "unavailable_error"
)

type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Type    string `json:"type"`
}

// errorBody is llama-server's error shape.
func errorBody(status int, typ, msg string) []byte {
	b, _ := json.Marshal(struct {
		Error apiError `json:"error"`
	}{apiError{Code: status, Message: msg, Type: typ}})
	return b
}

// writeError answers with llama-server's error shape.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	b := errorBody(status, typ, msg)
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}
