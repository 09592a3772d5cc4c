package handlers

import (
	"github.com/onebitd/onebitd/machine"

	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"sync/atomic"
	"time"
)

// ReasonClientGone and StepQueue are machine's (one vocabulary for the
// front and the handoff runner).
const (
	ReasonClientGone = machine.ReasonClientGone
	StepQueue        = machine.StepQueue
)

// publicPaths are served without an API key. llama-server also leaves its
// model list open; onebitd does not (it names the model file).
var publicPaths = map[string]bool{"/health": true, "/v1/health": true}

// canonicalPath is the path as onebitd routes, checks and forwards it:
// percent-decoded once (net/http did that), cleaned of "//", "." and "..",
// rooted. "*" (OPTIONS *) is kept.
func canonicalPath(p string) string {
	if p == "*" {
		return p
	}
	return path.Clean("/" + p)
}

// isSlotsPath reports whether p names the decoder's slot API (/slots and
// everything under it) in any case and under any number of
// percent-encodings: onebitd forwards a path decoded once, but refuses
// anything that decodes further to /slots as well.
func isSlotsPath(p string) bool {
	for range 4 {
		c := strings.ToLower(canonicalPath(p))
		if c == "/slots" || strings.HasPrefix(c, "/slots/") {
			return true
		}
		d, err := url.PathUnescape(p)
		if err != nil || d == p {
			return false
		}
		p = d
	}
	return false
}

// ServeHTTP implements http.Handler. In order: the path is made canonical;
// the API key is checked (except /health, /v1/health and CORS preflights);
// the decoder's /slots tree is refused (403) unless exposed; the body gets
// its deadline; then the route.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r2 := *r
	u := *r.URL
	u.Path, u.RawPath = canonicalPath(u.Path), ""
	r2.URL = &u
	r = &r2

	if len(s.keys) > 0 {
		if r.Method != http.MethodOptions && !publicPaths[u.Path] && !s.keys.match(presentedKey(r.Header)) {
			writeUnauthorized(w)
			return
		}
		// The client's credential is onebitd's, not the decoder's.
		if r.Header.Get("Authorization") != "" || r.Header.Get("X-Api-Key") != "" {
			r.Header = r.Header.Clone()
			r.Header.Del("Authorization")
			r.Header.Del("X-Api-Key")
		}
	}
	if !s.cfg.ExposeSlotsAPI && isSlotsPath(u.Path) {
		writeError(w, http.StatusForbidden, typePermission,
			"the decoder's slot API (/slots) belongs to onebitd and is not exposed to clients (onebitd serve --expose-slots-api)")
		return
	}
	if s.cfg.BodyTimeout > 0 && r.Body != nil && r.Body != http.NoBody {
		rc := http.NewResponseController(w)
		deadline := time.Now().Add(s.cfg.BodyTimeout)
		if err := rc.SetReadDeadline(deadline); err == nil {
			b := &deadlineBody{ReadCloser: r.Body, rc: rc, deadline: deadline}
			r.Body = b
			// The proxy hands its error handler a copy of the request
			// with the body wrapped: the context still finds b.
			r = r.WithContext(context.WithValue(r.Context(), deadlineBodyKey{}, b))
		} else {
			// A wrapping ResponseWriter without Unwrap hides the
			// connection: say so once rather than run without a deadline
			// unnoticed.
			s.noDeadline.Do(func() {
				s.log.Warn("the body deadline cannot be set on this connection: a ResponseWriter wrapper without Unwrap?", "error", err)
			})
		}
	}
	s.mux.ServeHTTP(w, r)
}

// deadlineBody is a request body read under the body deadline. The
// deadline must not outlive the body: for HTTP/1, net/http clears the read
// deadline itself when it starts the connection's background read after
// the body's end; the EOF here clears it too, whoever reads the body, so
// that a long answer is never cut by it (TestBodyTimeoutEndsWithBody). A
// body that was still incomplete at the deadline makes the answer 408.
type deadlineBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	deadline time.Time
	complete atomic.Bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.complete.Store(true)
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

type deadlineBodyKey struct{}

// timedOut reports whether the deadline passed before the body was read
// whole. (The read that hits the deadline also cancels the request's
// context, and the proxy may see that first: the clock decides, not the
// order in which the two errors arrive.)
func (b *deadlineBody) timedOut() bool {
	return !b.complete.Load() && !time.Now().Before(b.deadline)
}

// bodyTimedOut reports whether r's body missed the body deadline (err: the
// error of reading it, if any).
func bodyTimedOut(r *http.Request, err error) bool {
	if b, ok := r.Context().Value(deadlineBodyKey{}).(*deadlineBody); ok && b.timedOut() {
		return true
	}
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// writeBodyTimeout answers a request whose body did not arrive in time.
func (s *Server) writeBodyTimeout(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	writeError(w, http.StatusRequestTimeout, typeInvalidRequest,
		"the request body did not arrive within "+s.cfg.BodyTimeout.String())
}
