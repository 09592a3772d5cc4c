package decodersim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onebitd/onebitd/internal/jsonexact"
	"github.com/onebitd/onebitd/internal/simfault"
	"github.com/onebitd/onebitd/internal/simkv"
)

// Errors of the package (returned by ParseArgs, New and ListenAndServe).
var (
	// ErrConfig: a flag value or combination the simulator cannot run with.
	ErrConfig = errors.New("decodersim: invalid configuration")
	// ErrModel: the model file could not be read.
	ErrModel = errors.New("decodersim: cannot load model")
	// ErrKV: the KV memory (memfd chunks) could not be created or mapped.
	ErrKV = errors.New("decodersim: cannot create the KV memory")
)

// Log attribute keys.
const (
	attrSlot    = "slot"
	attrShareID = "share_id"
	attrError   = "error"
	attrAddr    = "addr"
	attrPath    = "path"
)

// buildInfo is what /props and system_fingerprint report.
const buildInfo = "b0-onebit-decoder-sim"

// Server is one simulated llama-server. It is safe for concurrent use.
type Server struct {
	cfg       Config
	log       *slog.Logger
	modelHash uint64
	layout    simkv.Layout
	kv        *kvMem
	sched     *scheduler
	mux       *http.ServeMux

	loaded    atomic.Bool
	loadTimer *time.Timer
	shareSeq  atomic.Int64

	mu        sync.Mutex
	adopted   map[int64]bool // share ids adopted so far
	armed     simfault.Fault // --fault-from-prompt: the next share or restore's fault
	inflight  sync.WaitGroup // running handlers; Close waits for them
	closed    atomic.Bool
	closeOnce sync.Once
}

// New loads the model (hashes the file), maps the KV chunks and returns a
// server that is "loading" for cfg.LoadingDelay. cfg is validated first. Close
// releases the KV memory.
func New(cfg Config, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mh, err := simkv.ModelHash(cfg.ModelPath)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrModel, err)
	}
	kv, err := newKV(cfg.NCtx, cfg.slotCells(), cfg.NLayer, cfg.stride(), cfg.ChunkSize)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:       cfg,
		log:       log,
		modelHash: mh,
		kv:        kv,
		sched:     newScheduler(cfg.NParallel, cfg.slotCells()),
		adopted:   make(map[int64]bool),
		layout: simkv.Layout{
			ModelHash: mh,
			NCtx:      cfg.NCtx,
			NLayer:    cfg.NLayer,
			CellSize:  cfg.CellSize,
			KVTypeK:   cfg.CacheTypeK,
			KVTypeV:   cfg.CacheTypeV,
			FlashAttn: cfg.flashAttn(),
			NBatch:    cfg.NBatch,
			NUbatch:   cfg.NUbatch,
		},
	}
	s.routes()
	if cfg.LoadingDelay > 0 {
		s.loadTimer = time.AfterFunc(cfg.LoadingDelay, func() { s.loaded.Store(true) })
	} else {
		s.loaded.Store(true)
	}
	log.Info("model loaded", attrPath, cfg.ModelPath,
		"n_ctx", cfg.NCtx, "n_parallel", cfg.NParallel, "kv_bytes", kv.totalBytes(), "kv_chunks", len(kv.chunks),
		"layout_hash", s.layout.Hash())
	return s, nil
}

// Close unmaps and closes the KV memory once the handlers still running have
// returned (stop the HTTP server first: Close does not cancel them); requests
// that arrive later answer 503.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		if s.loadTimer != nil {
			s.loadTimer.Stop()
		}
		s.inflight.Wait()
		s.kv.close()
	})
	return nil
}

// LayoutHash is the layout hash the server puts in share headers.
func (s *Server) LayoutHash() string { return s.layout.Hash() }

// Handler is the HTTP API.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// ListenAndServe listens on cfg's host and port, calls ready with the URL
// actually bound ("http://HOST:PORT", the port picked when cfg.Port is 0; or
// "unix://PATH" when the host ends in ".sock", as llama-server does: the
// socket file is created with the process umask and removed at the end), and
// serves until ctx ends; then it shuts down gracefully, giving running
// requests grace to finish before their connections are closed.
func (s *Server) ListenAndServe(ctx context.Context, grace time.Duration, ready func(url string)) error {
	network, addr, scheme := "tcp", net.JoinHostPort(s.cfg.Host, fmt.Sprint(s.cfg.Port)), "http://"
	if strings.HasSuffix(s.cfg.Host, ".sock") {
		network, addr, scheme = "unix", s.cfg.Host, "unix://"
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return fmt.Errorf("decodersim: listen: %w", err)
	}
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	url := scheme + ln.Addr().String()
	if ready != nil {
		ready(url)
	}
	s.log.Info("listening", attrAddr, url)
	select {
	case err := <-errc:
		return fmt.Errorf("decodersim: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	err = hs.Shutdown(sctx)
	if err != nil {
		_ = hs.Close()
	}
	<-errc
	s.log.Info("stopped")
	return nil
}

func (s *Server) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /health", s.handleHealth)
	m.HandleFunc("GET /v1/health", s.handleHealth)
	m.HandleFunc("GET /props", s.handleProps)
	m.HandleFunc("GET /slots", s.handleSlots)
	m.HandleFunc("GET /v1/models", s.handleModels)
	m.HandleFunc("GET /models", s.handleModels)
	m.HandleFunc("POST /tokenize", s.handleTokenize)
	m.HandleFunc("POST /detokenize", s.handleDetokenize)
	m.HandleFunc("POST /apply-template", s.handleApplyTemplate)
	m.HandleFunc("POST /completion", s.handleCompletion)
	m.HandleFunc("POST /completions", s.handleCompletion)
	m.HandleFunc("POST /v1/completions", s.handleOAICompletion)
	m.HandleFunc("POST /v1/chat/completions", s.handleOAIChat)
	m.HandleFunc("POST /chat/completions", s.handleOAIChat)
	m.HandleFunc("POST /slots/{id}", s.handleSlotAction)
	s.mux = m
}

// serveHTTP is llama-server's middleware: 503 while loading (except the
// model list), then the API key check (401), then 404 "File Not Found" for
// unknown routes.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.inflight.Add(1)
	defer s.inflight.Done()
	if s.closed.Load() {
		writeError(w, apiErr(errUnavailable, "Server is shutting down"))
		return
	}
	if !s.loaded.Load() {
		switch r.URL.Path {
		case "/models", "/v1/models", "/api/tags":
		default:
			writeError(w, apiErr(errUnavailable, "Loading model"))
			return
		}
	}
	if !s.authorized(r) {
		writeError(w, apiErr(errAuthentication, "Invalid API Key"))
		return
	}
	if _, pattern := s.mux.Handler(r); pattern == "" {
		writeError(w, apiErr(errNotFound, "File Not Found"))
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Error types of llama-server's error responses.
type errType int

const (
	errInvalidRequest errType = iota
	errNotFound
	errServer
	errNotSupported
	errUnavailable
	errExceedContext
	errAuthentication
)

var errTypes = [...]struct {
	name   string
	status int
}{
	errInvalidRequest: {"invalid_request_error", http.StatusBadRequest},
	errNotFound:       {"not_found_error", http.StatusNotFound},
	errServer:         {"server_error", http.StatusInternalServerError},
	errNotSupported:   {"not_supported_error", http.StatusNotImplemented},
	errUnavailable:    {"unavailable_error", http.StatusServiceUnavailable},
	errExceedContext:  {"exceed_context_size_error", http.StatusBadRequest},
	errAuthentication: {"authentication_error", http.StatusUnauthorized},
}

// apiError is one error answer: {"error":{"code":N,"message":"…","type":"…"}}.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Type    string `json:"type"`
	// exceed_context_size_error carries the numbers, as upstream does.
	NPromptTokens *int `json:"n_prompt_tokens,omitempty"`
	NCtx          *int `json:"n_ctx,omitempty"`
}

func (e *apiError) Error() string { return e.Message }

func apiErr(t errType, format string, a ...any) *apiError {
	msg := format
	if len(a) > 0 {
		msg = fmt.Sprintf(format, a...)
	}
	return &apiError{Code: errTypes[t].status, Message: msg, Type: errTypes[t].name}
}

func exceedContext(nPrompt, nCtx int) *apiError {
	e := apiErr(errExceedContext, "request (%d tokens) exceeds the available context size (%d tokens), try increasing it", nPrompt, nCtx)
	e.NPromptTokens, e.NCtx = &nPrompt, &nCtx
	return e
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Code, struct {
		Error *apiError `json:"error"`
	}{e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // a bug: every answer is made of marshalable types
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":500,"message":"cannot encode the answer","type":"server_error"}}`)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// maxBody bounds request bodies (a 1M-token prompt as ids is ~8 MB).
const maxBody = 64 << 20

// readBody reads and parses a JSON object body. Like upstream, a body that
// is not JSON answers 500 (nlohmann's parse_error is not an invalid_argument).
// Keys are matched as nlohmann::json matches them (see internal/jsonexact).
func readBody(r *http.Request, v any) *apiError {
	raw, e := readRaw(r)
	if e != nil {
		return e
	}
	return decodeBody(raw, v)
}

// readRaw reads a whole request body (at most maxBody bytes).
func readRaw(r *http.Request) ([]byte, *apiError) {
	buf := bytes.NewBuffer(make([]byte, 0, min(max(r.ContentLength, 0), maxBody)+bytes.MinRead))
	if _, err := buf.ReadFrom(http.MaxBytesReader(nil, r.Body, maxBody)); err != nil {
		return nil, apiErr(errServer, "[json.exception.parse_error.101] parse error: %v", err)
	}
	return buf.Bytes(), nil
}

// decodeBody parses a JSON body read by readRaw into v.
func decodeBody(body []byte, v any) *apiError {
	dec := json.NewDecoder(bytes.NewReader(body))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return apiErr(errServer, "[json.exception.parse_error.101] parse error: %v", err)
	}
	if dec.More() {
		return apiErr(errServer, "[json.exception.parse_error.101] parse error: syntax error: unexpected data after the JSON value")
	}
	// Keys match exactly, the last of duplicates wins: nlohmann::json's rules.
	if err := jsonexact.Unmarshal(raw, v); err != nil {
		return apiErr(errServer, "[json.exception.type_error.302] %v", err)
	}
	return nil
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Nanoseconds()) / 1e6 }
