// Package handlers is onebitd's HTTP front: the completion entry points,
// which run each request through its state machine and then forward it to
// the decoder, and a verbatim reverse proxy for every other path, except
// the decoder's slot API (/slots: 403 permission_error unless
// Config.ExposeSlotsAPI), which belongs to onebitd.
//
// Every request, in order (Server.ServeHTTP): its path is made canonical
// (percent-decoded, cleaned; that is the path routed and forwarded); with
// Config.APIKeys, a key is required (401 authentication_error) except on
// /health, /v1/health and CORS preflights; /slots is refused; the body gets
// Config.BodyTimeout (408). A completion's body is refused 413 from its
// Content-Length before it is read. Every error is in llama-server's shape
// {"error":{"code":N,"message":"…","type":"…"}}. docs/security.md says why.
//
// With a Handoff, a completion is tokenized, takes the free slot holding
// the longest confirmed prefix of its prompt, and is handed over or not as
// package planner decides (Config.HandoffMode); the decision and its
// inputs travel on the event that leaves received, a skip being the plain
// route. The decoder's answer confirms what the slot then holds (reply.go).
// docs/planner.md has the rules.
package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/handoff"
	"github.com/onebitd/onebitd/machine"
	"github.com/onebitd/onebitd/planner"
	"github.com/onebitd/onebitd/slots"
)

// Response headers of every completion.
const (
	HeaderRoute     = "X-Onebit-Route"
	HeaderRequestID = "X-Onebit-Request-Id"
)

// Defaults of Config (the daemon's flags use them).
const (
	// DefaultMaxBody caps a completion request body (413 above).
	DefaultMaxBody = 32 << 20
	// DefaultBodyTimeout is how long a client has to send its request body
	// once its headers arrived (--body-timeout).
	DefaultBodyTimeout = 60 * time.Second
	// DefaultTokenizeTimeout bounds /apply-template + /tokenize.
	DefaultTokenizeTimeout = 30 * time.Second
)

// Config wires the front to the rest of onebitd.
type Config struct {
	Decoder *decoder.Client
	Pool    *slots.Pool
	Handoff *handoff.Handoff // nil: plain route
	Sink    event.Sink
	Logger  *slog.Logger
	MaxBody int64
	// TokenizeTimeout bounds /apply-template + /tokenize before a handoff.
	TokenizeTimeout time.Duration
	// Ready, when set, gates completions: while it returns an error they
	// get a clean 503 (a decoder being restarted), never a hang.
	Ready func() error

	// ExposeSlotsAPI (--expose-slots-api) lets clients reach the decoder's
	// /slots tree (GET /slots, ?action=save|restore|erase|share|adopt)
	// through the proxy. Off: 403 permission_error. Whoever can reach it can
	// read, overwrite or erase every slot's KV cache and write files as the
	// decoder: an operator's tool, never a client's.
	ExposeSlotsAPI bool
	// APIKeys (--api-key-file, see LoadAPIKeys): when set, every request
	// but /health, /v1/health and CORS preflights must present one of them
	// (Authorization: Bearer KEY, or X-Api-Key), else 401. The key is not
	// forwarded to the decoder.
	APIKeys []string
	// BodyTimeout (--body-timeout) is how long a client has, once its
	// headers arrived, to send its whole body; then 408. 0 means
	// DefaultBodyTimeout, a negative value no deadline.
	BodyTimeout time.Duration
	// NVocab is the decoder model's vocabulary size (DecoderVocab). When
	// set, a prompt of token ids with an id outside [0, NVocab) is answered
	// 400 as llama-server answers it, before a provider sees it. 0: not
	// checked.
	NVocab int

	// HandoffMode (--handoff auto|always|never) decides, with a Handoff,
	// whether each request is handed over (package planner). The zero
	// value is planner.ModeAlways, the behaviour before issue 13; the
	// daemon's flag defaults to auto.
	HandoffMode planner.Mode
	// HandoffMinTokens (--handoff-min-tokens) is auto's static floor
	// before the cost model has data; 0 means planner.DefaultMinTokens.
	HandoffMinTokens int
	// DecoderIdentity, when set, changes whenever the decoder restarts
	// (the launched decoder's pid): every slot's remembered prefix is then
	// forgotten before it can be used.
	DecoderIdentity func() int
}

// Server is the HTTP front.
type Server struct {
	cfg   Config
	keys  keySet
	proxy *httputil.ReverseProxy
	mux   *http.ServeMux
	log   *slog.Logger

	noDeadline sync.Once // warned that the body deadline cannot be set

	// With a Handoff: the cost model and, unless the slot API is exposed
	// (then anyone may change a slot behind onebitd's back), the per-slot
	// prefix memory.
	plan *planner.Model
	mem  *planner.Memory

	// A provider that refuses --start (exit status 2, a usage error, on
	// every incremental run and never a success) gets the whole prompt.
	startOK, startRefused atomic.Int64

	cellsOnce sync.Once
	cells     int // cells per slot (/props default_generation_settings.n_ctx); 0: unknown
}

// New builds the front.
func New(cfg Config) (*Server, error) {
	if cfg.Decoder == nil || cfg.Pool == nil {
		return nil, errors.New("handlers: a decoder and a slot pool are required")
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.TokenizeTimeout == 0 {
		cfg.TokenizeTimeout = DefaultTokenizeTimeout
	}
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if len(cfg.APIKeys) > 0 && len(newKeySet(cfg.APIKeys)) == 0 {
		return nil, fmt.Errorf("%w: every key is empty", ErrNoAPIKeys)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	up, err := url.Parse(cfg.Decoder.BaseURL())
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, keys: newKeySet(cfg.APIKeys), log: cfg.Logger, mux: http.NewServeMux()}
	if cfg.Handoff != nil {
		mode := cfg.HandoffMode
		if mode == "" {
			mode = planner.ModeAlways
		}
		if _, err := planner.ParseMode(string(mode)); err != nil {
			return nil, err
		}
		s.plan = planner.NewModel(mode, cfg.HandoffMinTokens)
		if !cfg.ExposeSlotsAPI {
			s.mem = planner.NewMemory(cfg.Pool.Size())
		}
		if s.mem != nil && cfg.DecoderIdentity != nil {
			s.mem.Observe(cfg.DecoderIdentity())
		}
	}
	s.proxy = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(up)
			r.Out.Host = r.In.Host
		},
		Transport:     cfg.Decoder.HTTP().Transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if bodyTimedOut(r, nil) {
				s.writeBodyTimeout(w)
				return
			}
			if r.Context().Err() != nil {
				return
			}
			writeError(w, http.StatusServiceUnavailable, typeUnavailable, "decoder unavailable: "+err.Error())
		},
	}
	for _, p := range []string{"/completion", "/completions", "/v1/completions"} {
		s.mux.Handle("POST "+p, s.completion(kindCompletion))
	}
	for _, p := range []string{"/chat/completions", "/v1/chat/completions"} {
		s.mux.Handle("POST "+p, s.completion(kindChat))
	}
	s.mux.Handle("/", s.proxied())
	return s, nil
}

// proxied is the verbatim proxy. A request that may evaluate tokens into a
// slot behind onebitd's back (any method but GET, HEAD and OPTIONS: /infill,
// /embedding, an exposed /slots action…) forgets every slot's prefix before
// and after it.
func (s *Server) proxied() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.mem == nil {
			s.proxy.ServeHTTP(w, r)
			return
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			s.proxy.ServeHTTP(w, r)
		default:
			s.mem.ForgetAll()
			defer s.mem.ForgetAll()
			s.proxy.ServeHTTP(w, r)
		}
	})
}

// Planner is the cost model (nil without a Handoff).
func (s *Server) Planner() *planner.Model { return s.plan }

// ForgetPrefixes forgets every slot's remembered prefix (the decoder
// restarted, or a slot was changed behind onebitd's back).
func (s *Server) ForgetPrefixes() {
	if s.mem != nil {
		s.mem.ForgetAll()
	}
}

// fits reports whether n cells fit a slot without the decoder shifting its
// context (which moves cells: what they hold is then unknown). The slot
// size is read once from /props; unknown means no.
func (s *Server) fits(n int) bool {
	s.cellsOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.TokenizeTimeout)
		defer cancel()
		if p, err := s.cfg.Decoder.Props(ctx); err == nil {
			s.cells = p.Default.NCtx
		} else {
			s.log.Warn("the decoder's slot size is unknown: no prefix is remembered", "error", err)
		}
	})
	return n < s.cells
}

// Refusals of --start before onebitd stops passing it.
const maxStartRefusals = 3

// startAccepted reports whether the provider may be given --start.
func (s *Server) startAccepted() bool {
	return s.startOK.Load() > 0 || s.startRefused.Load() < maxStartRefusals
}

// noteStart counts an incremental run's outcome.
func (s *Server) noteStart(log *slog.Logger, out handoff.Outcome) {
	switch {
	case out.Start == 0 || !out.Ran:
	case out.Reason == "":
		s.startOK.Add(1)
	case out.Exit == 2 && s.startOK.Load() == 0:
		if s.startRefused.Add(1) == maxStartRefusals {
			log.Warn("the provider refused --start on every incremental handoff: it gets the whole prompt from now on", "reason", out.Reason)
		}
	}
}

// identity is the decoder's identity (0 when unknown: attached by URL).
func (s *Server) identity() int {
	if s.cfg.DecoderIdentity == nil {
		return 0
	}
	return s.cfg.DecoderIdentity()
}

// checkDecoder forgets every prefix when the decoder's identity changed.
func (s *Server) checkDecoder() {
	if s.mem != nil && s.mem.Observe(s.identity()) {
		s.log.Info("the decoder restarted: every slot's prefix is forgotten")
	}
}

type kind int

const (
	kindCompletion kind = iota
	kindChat
)

func (s *Server) completion(k kind) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := handoff.NewRequestID()
		w.Header().Set(HeaderRequestID, id)
		log := s.log.With("request_id", id)

		if r.ContentLength > s.cfg.MaxBody {
			// From the header, before a byte of the body is read.
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusRequestEntityTooLarge, typeInvalidRequest,
				fmt.Sprintf("request body too large (limit %d bytes)", s.cfg.MaxBody))
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
		if err != nil {
			var mbe *http.MaxBytesError
			switch {
			case errors.As(err, &mbe):
				writeError(w, http.StatusRequestEntityTooLarge, typeInvalidRequest,
					fmt.Sprintf("request body too large (limit %d bytes)", mbe.Limit))
			case bodyTimedOut(r, err):
				s.writeBodyTimeout(w)
			default:
				writeError(w, http.StatusBadRequest, typeInvalidRequest, "cannot read request body: "+err.Error())
			}
			return
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
			msg := "invalid JSON: the request body must be a JSON object"
			if err != nil {
				msg = "invalid JSON: " + err.Error()
			}
			writeError(w, http.StatusBadRequest, typeInvalidRequest, msg)
			return
		}
		if s.cfg.Ready != nil {
			if err := s.cfg.Ready(); err != nil {
				writeError(w, http.StatusServiceUnavailable, typeUnavailable, err.Error())
				return
			}
		}

		// Tokenize first (it needs no slot), so that a slot is held only
		// for the handoff and the generation.
		var tokens []int
		var why error
		if s.cfg.Handoff != nil {
			tokens, why = s.tokens(r.Context(), k, body, fields)
			if r.Context().Err() != nil {
				s.clientGone(log, machine.StepTokenize)
				return
			}
			if errors.Is(why, errInvalidTokens) {
				writeError(w, http.StatusBadRequest, typeInvalidRequest, msgInvalidTokens)
				return
			}
		}

		s.checkDecoder()
		var slot int
		if s.mem != nil && why == nil {
			slot, err = s.cfg.Pool.AcquireBest(r.Context(), func(k int) int { return s.mem.Held(k, tokens) })
		} else {
			slot, err = s.cfg.Pool.Acquire(r.Context())
		}
		switch {
		case errors.Is(err, slots.ErrQueueFull):
			writeError(w, http.StatusServiceUnavailable, typeUnavailable, "all decoder slots are busy and the wait queue is full; retry later")
			return
		case errors.Is(err, slots.ErrClosed):
			writeError(w, http.StatusServiceUnavailable, typeUnavailable, "onebitd is shutting down and takes no new request; retry on another instance or later")
			return
		case err != nil:
			s.clientGone(log, StepQueue)
			return
		}
		defer s.cfg.Pool.Release(slot)

		// The request is about to change what the slot holds: its memory
		// is unconfirmed until the decoder's answer confirms it.
		held, ticket := 0, planner.Ticket{}
		if s.mem != nil {
			s.checkDecoder() // a restart while the request waited for its slot
			held, ticket = s.mem.Take(slot, tokens)
		}

		route := machine.RoutePlain
		var dec *planner.Decision
		if s.cfg.Handoff != nil && why == nil {
			hr := s.cfg.Handoff.Route()
			d := s.plan.Decide(len(tokens), held, hr == machine.RouteShared && s.startAccepted(), string(hr))
			dec = &d
			if d.Choice == planner.Handoff {
				route = hr
			}
		} else if s.cfg.Handoff != nil {
			route = s.cfg.Handoff.Route()
		}
		var sink event.Sink = s.cfg.Sink
		if dec != nil {
			sink = &decisionSink{inner: s.cfg.Sink, d: dec}
		}
		m := machine.New(id, slot, route, sink, log)
		minCache := 0
		switch {
		case s.cfg.Handoff == nil:
		case why != nil:
			log.Warn("handoff fell back", "slot", slot, "step", machine.StepTokenize, "reason", why.Error())
			m.Fire(machine.EvFallback, machine.Attrs{Reason: why.Error(), Step: machine.StepTokenize, Cleanup: &event.Cleanup{}})
		case dec.Choice == planner.Skip:
			minCache = dec.TokensHeld // the decoder's own cache must hold at least what we trusted
		default:
			t0 := time.Now()
			out := s.cfg.Handoff.RunFrom(r.Context(), m, tokens, dec.Start)
			s.noteStart(log, out)
			if out.Reason == "" && out.Start > 0 && !s.mem.Valid(ticket, s.identity()) {
				// The decoder restarted (or the slot was forgotten) during
				// an incremental handoff: the cells before Start may not
				// hold the prefix. The decoder prefills the whole prompt
				// itself (cache_prompt false).
				log.Warn("the slot's prefix was forgotten during an incremental handoff: the prompt is evaluated again in full", "slot", slot)
				s.checkDecoder()
				fields["cache_prompt"] = json.RawMessage("false")
				minCache = -1
			}
			if out.Reason == "" && minCache == 0 {
				minCache = len(tokens) - 1
				if out.Ran {
					prov := out.Provider.Seconds() * 1000
					s.plan.ObserveProvider(len(tokens)-out.Start, prov)
					s.plan.ObserveHandoff(string(route), time.Since(t0).Seconds()*1000-prov)
				}
			}
		}
		fields["id_slot"] = json.RawMessage(strconv.Itoa(slot))
		if minCache >= 0 {
			fields["cache_prompt"] = json.RawMessage("true")
		}
		st, ok := s.forward(w, r, m, encodeFields(fields, len(body)))
		if s.plan != nil && st.ok && st.promptN > 0 {
			s.plan.ObserveDecoder(st.promptN, st.promptMs)
		}
		if s.mem != nil && why == nil && ok && minCache >= 0 && st.holds(len(tokens), minCache) && s.fits(len(tokens)+st.predictedN) {
			s.mem.Confirm(ticket, st.held(tokens))
		} else if s.mem != nil && why == nil && ok && st.ok && st.cacheN < minCache {
			log.Warn("the decoder reused less of the slot than onebitd trusted: the slot's prefix is forgotten",
				"slot", slot, "trusted", minCache, "cache_n", st.cacheN)
		}
	})
}

// decisionSink puts the handoff decision on the event that leaves
// received (issue 13), then passes every event on.
type decisionSink struct {
	inner event.Sink
	d     *planner.Decision
}

func (s *decisionSink) Emit(e *event.Event) {
	if s.d != nil && e.From == string(machine.Received) {
		e.Decision, e.DecisionBasis = string(s.d.Choice), s.d.Basis
		e.PredictedDecoder, e.PredictedHandoff = s.d.DecoderUS, s.d.HandoffUS
		e.TokensHeld, e.TokensPrefill = s.d.TokensHeld, s.d.TokensPrefill
		s.d = nil
	}
	if s.inner != nil {
		s.inner.Emit(e)
	}
}

// encodeFields writes fields as a JSON object, keys sorted (as
// json.Marshal does), values verbatim: each is a valid JSON value that
// json.Unmarshal cut out of the request body, so it needs none of
// json.Marshal's compaction and HTML escaping, which cost ~285 µs on a
// 12 700-token prompt. size is a capacity hint.
func encodeFields(fields map[string]json.RawMessage, size int) []byte {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]byte, 0, size+64)
	out = append(out, '{')
	for i, k := range keys {
		if i > 0 {
			out = append(out, ',')
		}
		out = appendKey(out, k)
		out = append(out, ':')
		out = append(out, fields[k]...)
	}
	return append(out, '}')
}

// appendKey appends k as a JSON string: verbatim when it is plain printable
// ASCII, else through json.Marshal (escapes).
func appendKey(out []byte, k string) []byte {
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			q, _ := json.Marshal(k) // a string always marshals
			return append(out, q...)
		}
	}
	out = append(out, '"')
	out = append(out, k...)
	return append(out, '"')
}

// errInvalidTokens: a prompt of token ids holds an id outside the
// vocabulary; llama-server refuses it with msgInvalidTokens (400
// invalid_request_error).
var errInvalidTokens = errors.New("the prompt holds a token id outside the vocabulary")

const msgInvalidTokens = "Prompt contains invalid tokens"

// clientGone reports a client that left before its request held a slot:
// such a request has no machine (a machine needs a slot), so a log line
// says where it left.
func (s *Server) clientGone(log *slog.Logger, step string) {
	log.Info("client went away", "step", step, "reason", ReasonClientGone)
}

// tokens is the prompt's token ids as the decoder will see them. An error
// is a fallback reason, or errInvalidTokens (the request is refused).
func (s *Server) tokens(ctx context.Context, k kind, body []byte, fields map[string]json.RawMessage) ([]int, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.TokenizeTimeout)
	defer cancel()
	var prompt string
	switch k {
	case kindChat:
		if _, ok := fields["messages"]; !ok {
			return nil, errors.New("the chat request has no messages to hand over")
		}
		p, err := s.cfg.Decoder.ApplyTemplate(ctx, body)
		if err != nil {
			return nil, err
		}
		prompt = p
	default:
		raw, ok := fields["prompt"]
		if !ok {
			return nil, errors.New("the request has no prompt to hand over")
		}
		if err := json.Unmarshal(raw, &prompt); err != nil {
			var ids []int
			if json.Unmarshal(raw, &ids) != nil {
				return nil, errors.New("the prompt is neither a string nor an array of token ids (several prompts or mixed arrays are not handed over)")
			}
			if s.cfg.NVocab > 0 {
				for _, id := range ids {
					if id < 0 || id >= s.cfg.NVocab {
						return nil, errInvalidTokens
					}
				}
			}
			return worthIt(ids)
		}
	}
	toks, err := s.cfg.Decoder.Tokenize(ctx, prompt)
	if err != nil {
		return nil, err
	}
	return worthIt(toks)
}

// worthIt refuses prompts too short to hand over: the decoder evaluates the
// last token anyway.
func worthIt(toks []int) ([]int, error) {
	if len(toks) < 2 {
		return nil, errors.New("the prompt is too short to be worth a handoff (fewer than 2 tokens)")
	}
	return toks, nil
}

// hop-by-hop headers are not forwarded (RFC 9110 §7.6.1).
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// forward sends body to the decoder and copies the answer back, streaming
// event by event. The machine ends in done or failed. It returns what the
// answer said of the prompt and whether the request ended done.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, m *machine.Machine, body []byte) (replyStats, bool) {
	m.Fire(machine.EvForward, machine.Attrs{})
	w.Header().Set(HeaderRoute, string(m.Route()))

	target := s.cfg.Decoder.BaseURL() + r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		s.fail(m, 0, err)
		writeError(w, http.StatusInternalServerError, typeServer, err.Error())
		return replyStats{}, false
	}
	for k, vs := range r.Header {
		if !hopByHop[k] && k != "Content-Length" && k != "Accept-Encoding" {
			req.Header[k] = vs
		}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.cfg.Decoder.HTTP().Do(req)
	if err != nil {
		if r.Context().Err() != nil {
			s.fail(m, 0, errors.New(ReasonClientGone+" before the decoder answered"))
			return replyStats{}, false
		}
		s.ForgetPrefixes() // a decoder that does not answer may be restarting: trust no slot
		s.fail(m, 0, err)
		writeError(w, http.StatusServiceUnavailable, typeUnavailable, "decoder unavailable: "+err.Error())
		return replyStats{}, false
	}
	defer resp.Body.Close()
	h := w.Header()
	for k, vs := range resp.Header {
		if !hopByHop[k] {
			h[k] = vs
		}
	}
	stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if stream {
		h.Set("X-Accel-Buffering", "no")
		h.Del("Content-Length")
	}
	w.WriteHeader(resp.StatusCode)

	tap := &replyTap{stream: stream}
	if err := s.copy(w, io.TeeReader(resp.Body, tap), stream); err != nil {
		if r.Context().Err() != nil {
			s.fail(m, resp.StatusCode, errors.New(ReasonClientGone+" mid-response"))
			return replyStats{}, false
		}
		if stream {
			// Never a fake [DONE]: the stream ends with llama-server's
			// mid-stream error event.
			fmt.Fprintf(w, "data: %s\n\n", errorBody(http.StatusInternalServerError, typeServer, "decoder connection lost: "+err.Error()))
			http.NewResponseController(w).Flush()
		}
		s.fail(m, resp.StatusCode, fmt.Errorf("decoder connection lost mid-response: %w", err))
		return replyStats{}, false
	}
	if resp.StatusCode >= 500 {
		s.fail(m, resp.StatusCode, fmt.Errorf("the decoder answered %d", resp.StatusCode))
		return replyStats{}, false
	}
	m.Fire(machine.EvFinish, machine.Attrs{HTTPStatus: resp.StatusCode})
	if resp.StatusCode != http.StatusOK {
		return replyStats{}, false
	}
	return tap.stats(), true
}

func (s *Server) fail(m *machine.Machine, status int, err error) {
	s.log.Warn("request failed", "request_id", m.ID(), "slot", m.Slot(), "error", err)
	m.Fire(machine.EvFail, machine.Attrs{HTTPStatus: status, Reason: err.Error()})
}

// copy copies the decoder's answer; a stream is flushed after every read so
// each event reaches the client as soon as the decoder sent it.
func (s *Server) copy(w http.ResponseWriter, body io.Reader, stream bool) error {
	if !stream {
		_, err := io.Copy(w, body)
		return err
	}
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if ferr := rc.Flush(); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
