package benchharness

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	"github.com/onebitd/onebitd/decoder"
)

// BareProxyEnv, when set to a decoder URL in the environment of the bench
// binary (or of a test binary whose TestMain calls BareProxyMain), makes the
// process a bare reverse proxy instead: the floor of one HTTP hop written
// in Go, to tell onebitd's own proxy cost from the cost of any hop.
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
	// onebitd's transport and flushing, nothing else.
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(u); r.Out.Host = r.In.Host },
		Transport:     decoder.NewTransport(),
		FlushInterval: -1,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare proxy:", err)
		return 1, true
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
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

// startBareProxy re-executes this binary as a bare proxy in front of
// upstream.
func startBareProxy(ctx context.Context, upstream string) (*Proc, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	return startProcEnv(ctx, self, []string{BareProxyEnv + "=" + upstream}, reBareReady)
}
