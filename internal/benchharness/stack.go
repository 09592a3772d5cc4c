package benchharness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/onebitd/onebitd/handlers"
	"github.com/onebitd/onebitd/internal/simkv"
)

// Config is one harness run.
type Config struct {
	BinDir  string // onebitd, onebit-decoder-sim, onebit-provider-sim
	WorkDir string // scratch (slot dirs, state dirs, logs); removed by the caller
	// Scale multiplies every request count (1 = the documented run; the
	// tests use a small fraction). Counts never drop below a floor of 3.
	Scale float64
	// GoBench is `go test -bench` output to summarise (empty: none).
	GoBench string
	// GoBenchBase is an earlier `go test -bench` output to compare GoBench
	// against, benchstat-style (empty: none).
	GoBenchBase string
	// CPUProfile, when set, receives a CPU profile of the in-process
	// handoff runs (onebitd's code as it serves section a's requests).
	CPUProfile string
	// SlotBase is where section a's slot directories (share sockets,
	// tokens, layout and state files) are made; empty: WorkDir. The
	// command defaults it to /dev/shm (tmpfs), where docs/performance.md
	// recommends --slot-dir.
	SlotBase string
	// CellSize is section a's KV cell size in bytes (0: HandoffCellSize,
	// the seed's Qwen3-0.6B). The tests use a small one: the file route
	// then moves megabytes, not gigabytes, per request.
	CellSize int
	// Llama is section d, a real llama-server (Server empty: skipped).
	Llama LlamaConfig
	// Sections to run: any of "handoff", "proxy", "pipeline", "llama" (nil:
	// all).
	Sections []string
	Logger   *slog.Logger // progress; nil discards
}

func (c *Config) count(n int) int { return max(int(float64(n)*c.Scale+0.5), 3) }

func (c *Config) section(name string) bool {
	if len(c.Sections) == 0 {
		return true
	}
	for _, s := range c.Sections {
		if s == name {
			return true
		}
	}
	return false
}

func (c *Config) bin(name string) string { return filepath.Join(c.BinDir, name) }

var (
	reSimReady     = regexp.MustCompile(`listening on (http://\S+)`)
	reOnebitdReady = regexp.MustCompile(`"msg":"onebitd serving".*"listen":"(http://[^"]+)"`)
)

// modelFile writes the stand-in model both the simulator and the provider
// load (the sim model hashes the file's bytes).
func modelFile(dir string) (string, error) {
	p := filepath.Join(dir, "bench.gguf")
	return p, os.WriteFile(p, []byte("GGUF-SIM model bench\n"), 0o644)
}

// startSim starts a decoder simulator on a random loopback port.
func startSim(ctx context.Context, c *Config, model string, args ...string) (*Proc, string, error) {
	all := append([]string{"--host", "127.0.0.1", "--port", "0", "-m", model}, args...)
	return startProc(ctx, c.bin("onebit-decoder-sim"), reSimReady, all...)
}

// startOnebitd starts `onebitd serve` on a random loopback port with its
// embedded NATS server on a random port, logging JSON (the ready line).
func startOnebitd(ctx context.Context, c *Config, decoderURL, stateDir string, args ...string) (*Proc, string, error) {
	all := append([]string{"serve", "--listen", "127.0.0.1:0", "--decoder-url", decoderURL,
		"--state-dir", stateDir, "--nats-listen", "127.0.0.1:0", "--node", "bench",
		"--log-format", "json", "--handoff", "always"}, args...) // every request handed over: the handoff is what is measured
	return startProc(ctx, c.bin("onebitd"), reOnebitdReady, all...)
}

// promptText is a text of exactly n tokens (BOS included) in the sim
// tokenizer: n-1 vocabulary words.
func promptText(n int) string { return promptVariant(n, 0) }

// promptVariant is promptText's v-th variant: the same length, a different
// first word, so that consecutive requests share no prefix beyond BOS and
// every handoff is a whole prompt's (onebitd reuses what a slot holds).
func promptVariant(n, v int) string {
	ws := []string{" the", " cache", " of", " decoder", " slot", " token", " prefill", " and", " is", " water"}
	var b strings.Builder
	for i := 1; i < n; i++ {
		j := i*7 + i/10
		if i == 1 {
			j += v
		}
		b.WriteString(ws[j%len(ws)])
	}
	return b.String()
}

// promptTokens is len(simkv.Tokenize(text, true)): the tokens the decoder
// will see.
func promptTokens(text string) int { return len(simkv.Tokenize(text, true)) }

// completionBody is a /completion request body.
func completionBody(prompt string, nPredict int, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{"prompt": prompt, "n_predict": nPredict, "stream": stream})
	return b
}

// newClient is the load generator's client: keep-alive connections for
// every concurrent request.
func newClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 1024
	t.DisableCompression = true
	return &http.Client{Transport: t, Timeout: 120 * time.Second}
}

// reply is what one completion gave.
type reply struct {
	status  int
	route   string
	id      string
	promptN int
	cacheN  int
	dur     time.Duration // request sent to body read
	first   time.Duration // request sent to first body byte
}

// post sends body to base+path and reads the whole answer.
func post(ctx context.Context, hc *http.Client, url string, body []byte) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	var one [1]byte
	var r reply
	n, err := io.ReadFull(resp.Body, one[:])
	r.first = time.Since(t0)
	if err != nil && n == 0 {
		return reply{}, fmt.Errorf("read %s: %w", url, err)
	}
	rest, err := io.ReadAll(resp.Body)
	r.dur = time.Since(t0)
	if err != nil {
		return reply{}, fmt.Errorf("read %s: %w", url, err)
	}
	r.status = resp.StatusCode
	r.route = resp.Header.Get(handlers.HeaderRoute)
	r.id = resp.Header.Get(handlers.HeaderRequestID)
	if r.status != http.StatusOK {
		return r, fmt.Errorf("%w: %s answered %d: %.200s", ErrBadResponse, url, r.status, append(one[:n], rest...))
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var out struct {
			Timings struct {
				PromptN int `json:"prompt_n"`
				CacheN  int `json:"cache_n"`
			} `json:"timings"`
		}
		if err := json.Unmarshal(append(one[:n], rest...), &out); err == nil {
			r.promptN, r.cacheN = out.Timings.PromptN, out.Timings.CacheN
		}
	}
	return r, nil
}

// serveInProcess serves h on a random loopback port until the returned
// stop function is called.
func serveInProcess(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
