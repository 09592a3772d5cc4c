package benchharness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/onebitd/onebitd/decoder"
)

// BareProxyEnv, when set to a decoder URL in the environment of the bench
// binary (or of a test binary whose TestMain calls BareProxyMain), makes the
// process a bare proxy instead: onebitd's forward path (same transport, same
// copy and flush) and nothing else, the floor of one HTTP hop written in Go,
// to tell onebitd's own proxy cost from the cost of any hop.
const BareProxyEnv = "ONEBIT_BENCH_BARE_PROXY"

var reBareReady = regexp.MustCompile(`bare proxy listening on (http://\S+)`)

// BareProxyMain runs the bare proxy when BareProxyEnv is set and returns
// its exit status; ok is false when the variable is unset.
func BareProxyMain() (code int, ok bool) {
	upstream := os.Getenv(BareProxyEnv)
	if upstream == "" {
		return 0, false
	}
	u, err := url.Parse(upstream)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare proxy:", err)
		return 2, true
	}
	hc := &http.Client{Transport: decoder.NewTransport()}
	base := strings.TrimRight(u.String(), "/")
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { bareForward(w, r, hc, base) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare proxy:", err)
		return 1, true
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Fprintf(os.Stderr, "bare proxy listening on http://%s\n", ln.Addr())
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, "bare proxy:", err)
		return 1, true
	}
	return 0, true
}

// bareForward is onebitd's forward without the rest of onebitd: read the
// body, send it to the decoder, copy the answer back (flushing each read of
// a stream).
func bareForward(w http.ResponseWriter, r *http.Request, hc *http.Client, base string) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, base+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer resp.Body.Close()
	stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	for k, vs := range resp.Header {
		if k != "Connection" && k != "Transfer-Encoding" && (!stream || k != "Content-Length") {
			w.Header()[k] = vs
		}
	}
	w.WriteHeader(resp.StatusCode)
	if !stream {
		_, _ = io.Copy(w, resp.Body)
		return
	}
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// startBareProxy re-executes this binary as a bare proxy in front of
// upstream.
func startBareProxy(ctx context.Context, upstream string) (*Proc, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	return startProcEnv(ctx, self, []string{BareProxyEnv + "=" + upstream}, reBareReady)
}
