package handlers

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// llama-server's error types.
const (
	typeInvalidRequest = "invalid_request_error"
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
