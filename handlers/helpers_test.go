package handlers

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/handoff"
	"github.com/onebitd/onebitd/internal/decodersim"
	"github.com/onebitd/onebitd/internal/obtest"
	"github.com/onebitd/onebitd/internal/providersim"
	"github.com/onebitd/onebitd/provider"
)

// The test binary doubles as the prefill provider: with
// GO_WANT_HELPER_PROCESS=1 and "-provider MARK" as its first arguments it
// appends the tokens file it was given to MARK, then runs the sim provider
// (internal/providersim) on the remaining (contract) arguments.
const helperEnv = "GO_WANT_HELPER_PROCESS"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" && len(os.Args) > 2 && os.Args[1] == "-provider" {
		os.Exit(providerMain(os.Args[2], os.Args[3:]))
	}
	os.Setenv(helperEnv, "1")                // inherited by the providers the tests start
	os.Setenv("GORACE", "atexit_sleep_ms=0") // a -race child otherwise sleeps 1s on exit 0
	os.Exit(m.Run())
}

func providerMain(mark string, args []string) int {
	for i, a := range args {
		if a == "--tokens" && i+1 < len(args) {
			toks, _ := os.ReadFile(args[i+1])
			f, err := os.OpenFile(mark, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
			if err == nil {
				f.Write(append(toks, '\n'))
				f.Close()
			}
		}
	}
	return providersim.Main(context.Background(), args, os.Stderr)
}

// fileRoute configures the front with a file-route handoff whose provider is
// the sim provider run by this test binary; the returned path is where the
// provider appends every token list it is given (absent: it never ran).
func fileRoute(t *testing.T, decURL string, sc decodersim.Config) (func(*Config), string) {
	t.Helper()
	dec, err := decoder.New(decURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(t.TempDir(), "provider-saw")
	prov := &provider.Runner{Path: os.Args[0], Args: []string{"-provider", mark}, Timeout: 30 * time.Second}
	h := handoff.NewHandoff(handoff.Config{SlotDir: sc.SlotSavePath, Model: sc.ModelPath}, dec, handoff.Exec{Runner: prov}, nil)
	return func(c *Config) { c.Handoff = h }, mark
}

// seenReq is a request as the decoder received it.
type seenReq struct {
	Method, Path, RawPath, RawQuery string
	Header                          http.Header
}

// recorder records every request that reaches the decoder.
type recorder struct {
	mu   sync.Mutex
	reqs []seenReq
}

func (rec *recorder) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, seenReq{r.Method, r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.Header.Clone()})
		rec.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

func (rec *recorder) all() []seenReq {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]seenReq(nil), rec.reqs...)
}

// rawResult is one answer to a request written byte for byte.
type rawResult struct {
	status  int
	header  http.Header
	body    []byte
	close   bool // Connection: close
	elapsed time.Duration
	err     error // no answer within the deadline, or a broken one
}

// raw writes req verbatim on a new connection to base (http://host:port)
// and reads one response, waiting at most wait.
func raw(t *testing.T, base, req string, wait time.Duration) rawResult {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetDeadline(start.Add(wait))
	if _, err := io.WriteString(c, req); err != nil {
		return rawResult{err: err}
	}
	method, _, _ := strings.Cut(req, " ")
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		return rawResult{err: err, elapsed: time.Since(start)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return rawResult{status: resp.StatusCode, header: resp.Header, body: body, close: resp.Close, elapsed: time.Since(start), err: err}
}

// logTo returns a logger writing text lines into a buffer.
func logTo() (*slog.Logger, *obtest.Buffer) {
	var buf obtest.Buffer
	return slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &buf
}

// logHas reports whether one line of buf holds every part.
func logHas(buf *obtest.Buffer, parts ...string) bool {
	for _, line := range strings.Split(buf.String(), "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return true
		}
	}
	return false
}

var itoa = strconv.Itoa

// readAll reads and closes resp's body.
func readAll(resp *http.Response) []byte {
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}
