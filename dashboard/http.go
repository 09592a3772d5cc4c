package dashboard

import (
	"crypto/rand"
	"embed"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"
)

//go:embed ui
var uiFiles embed.FS

// writeTimeout bounds each write to an SSE client.
const writeTimeout = 30 * time.Second

// csp allows nothing from outside the page's own origin.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves GET /ui/ (the page), /api/events (SSE) and
// /api/requests/{id} (a timeline).
func (h *Hub) Handler() http.Handler {
	mux := http.NewServeMux()
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	mux.Handle("GET /ui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", csp)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}))
	mux.Handle("GET /api/events", h.guard(http.HandlerFunc(h.serveEvents)))
	mux.Handle("GET /api/requests/{id}", h.guard(http.HandlerFunc(h.serveRequest)))
	mux.Handle("GET /api/session", h.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})))
	mux.HandleFunc("POST /api/session", h.login)
	return mux
}

// Sessions of the page when Config.CheckKey is set.
const (
	sessionCookie = "onebitd_dashboard"
	sessionTTL    = 12 * time.Hour
	maxSessions   = 256
	maxLoginBody  = 4 << 10
)

// presentedKey is a script's key: "Authorization: Bearer KEY" (any case of
// the scheme), else "X-Api-Key: KEY", as llama-server and onebitd's front
// read it.
func presentedKey(hd http.Header) string {
	k := hd.Get("Authorization")
	if k == "" {
		k = hd.Get("X-Api-Key")
	}
	if len(k) >= len("bearer ") && strings.EqualFold(k[:len("bearer ")], "bearer ") {
		k = k[len("bearer "):]
	}
	return k
}

// authorized reports whether r may read the API.
func (h *Hub) authorized(r *http.Request) bool {
	if h.cfg.CheckKey == nil {
		return true
	}
	if c, err := r.Cookie(sessionCookie); err == nil && c.Value != "" {
		h.mu.Lock()
		exp, ok := h.sessions[c.Value]
		if ok && time.Now().After(exp) {
			delete(h.sessions, c.Value)
			ok = false
		}
		h.mu.Unlock()
		if ok {
			return true
		}
	}
	k := presentedKey(r.Header)
	return k != "" && h.cfg.CheckKey(k)
}

func unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="onebitd"`)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = io.WriteString(w, `{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}`+"\n")
}

func (h *Hub) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.authorized(r) {
			unauthorized(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// login is POST /api/session with the form field key: a key CheckKey
// accepts opens a session (an HttpOnly, SameSite=Strict cookie of 32 random
// bytes, valid sessionTTL).
func (h *Hub) login(w http.ResponseWriter, r *http.Request) {
	if h.cfg.CheckKey == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	key := r.PostForm.Get("key")
	if key == "" || !h.cfg.CheckKey(key) {
		unauthorized(w)
		return
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		http.Error(w, "no randomness", http.StatusInternalServerError)
		return
	}
	token := hex.EncodeToString(b[:])
	now := time.Now()
	h.mu.Lock()
	for t, exp := range h.sessions {
		if now.After(exp) {
			delete(h.sessions, t)
		}
	}
	if len(h.sessions) >= maxSessions {
		var oldest string
		for t, exp := range h.sessions {
			if oldest == "" || exp.Before(h.sessions[oldest]) {
				oldest = t
			}
		}
		delete(h.sessions, oldest)
	}
	h.sessions[token] = now.Add(sessionTTL)
	h.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: token, Path: "/", MaxAge: int(sessionTTL / time.Second),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
}

func (h *Hub) serveRequest(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	tl := h.Timelines(id)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if len(tl) == 0 {
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]string{
			"request_id": id,
			"error":      "the dashboard no longer holds (or never saw) this request; `onebitd replay --request " + id + " EVENTLOG` reads it from the event log",
		})
		return
	}
	_ = json.NewEncoder(w).Encode(struct {
		RequestID string     `json:"request_id"`
		Timelines []Timeline `json:"timelines"`
	}{id, tl})
}

// client is one SSE stream.
type client struct {
	ch      chan []byte
	kick    chan struct{} // a frame was dropped: resync
	resync  bool
	dropped uint64
	resyncs uint64
}

// push queues a frame; called with the hub's lock held.
func (c *client) push(b []byte) {
	if c.resync {
		c.dropped++
		return
	}
	select {
	case c.ch <- b:
	default:
		c.dropped++
		c.resync = true
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

// parseLastEventID reads "<epoch>-<seq>".
func parseLastEventID(s string) (epoch string, seq uint64, ok bool) {
	epoch, n, ok := strings.Cut(s, "-")
	if !ok {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(n, 10, 64)
	return epoch, seq, err == nil
}

func (h *Hub) serveEvents(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	c := &client{ch: make(chan []byte, h.cfg.ClientBuffer), kick: make(chan struct{}, 1)}

	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		http.Error(w, ErrClosed.Error(), http.StatusServiceUnavailable)
		return
	}
	if len(h.clients) >= h.cfg.MaxClients {
		h.mu.Unlock()
		http.Error(w, ErrTooManyClients.Error(), http.StatusServiceUnavailable)
		return
	}
	var first [][]byte
	resumed := false
	if epoch, seq, ok := parseLastEventID(r.Header.Get("Last-Event-ID")); ok && epoch == h.epoch {
		first, resumed = h.framesSinceLocked(seq)
	}
	if !resumed {
		first = [][]byte{h.snapshotLocked(c)}
	}
	version := h.version
	h.clients[c] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.clients, c)
		h.mu.Unlock()
	}()

	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	write := func(bs ...[]byte) error {
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		for _, b := range bs {
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		return rc.Flush()
	}
	if err := write([]byte("retry: 1000\n\n")); err != nil {
		return
	}
	if err := write(first...); err != nil {
		return
	}
	stats := time.NewTicker(h.cfg.StatsInterval)
	defer stats.Stop()
	beat := time.NewTicker(h.cfg.Heartbeat)
	defer beat.Stop()
	var lastDropped uint64
	batch := make([][]byte, 0, 64)
	for {
		select {
		case <-r.Context().Done():
			return
		case <-h.done:
			return
		case b := <-c.ch:
			batch = append(batch[:0], b)
			for len(batch) < cap(batch) {
				select {
				case b := <-c.ch:
					batch = append(batch, b)
					continue
				default:
				}
				break
			}
			if err := write(batch...); err != nil {
				return
			}
		case <-c.kick:
			h.mu.Lock()
			for len(c.ch) > 0 {
				<-c.ch
			}
			c.resync = false
			c.resyncs++
			snap := h.snapshotLocked(c)
			version = h.version
			lastDropped = c.dropped
			h.mu.Unlock()
			if err := write(snap); err != nil {
				return
			}
		case <-stats.C:
			h.mu.Lock()
			if h.version == version && c.dropped == lastDropped {
				h.mu.Unlock()
				continue
			}
			version, lastDropped = h.version, c.dropped
			body, err := json.Marshal(h.statsLocked(c))
			h.mu.Unlock()
			if err != nil {
				return
			}
			if err := write(encodeFrame("", 0, "stats", body)); err != nil {
				return
			}
		case <-beat.C:
			if err := write([]byte(": ping\n\n")); err != nil {
				return
			}
		}
	}
}
