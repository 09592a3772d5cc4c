// Package prefill is onebit-prefill: the file-route provider (DESIGN §2
// "file") backed by a second llama-server, the prefill server. It is
// disaggregated prefill on two llama-servers over a shared directory:
//
//  1. read the prompt's token ids from --tokens (a JSON array);
//  2. POST /completion {"prompt": ids, "n_predict": 0, "cache_prompt": true,
//     "id_slot": N} to the prefill server: it evaluates the prompt into slot
//     N and generates nothing;
//  3. POST /slots/N?action=save {"filename": basename(--state)}: the prefill
//     server writes the slot's state to <its --slot-save-path>/<basename>;
//  4. check that --state now exists with the n_written bytes the server
//     reported, holding the n tokens of the prompt.
//
// onebitd runs one provider per request, concurrently. A run holds an
// exclusive flock on its prefill slot from step 2 to step 3 (lock files
// .onebit-prefill-<server hash>-<slot>.lock in the state directory), so runs
// on one host never interleave on a slot. With --slots N a run takes the
// first free slot of 0..N-1 (start the prefill server with -np N): N prefills
// run in parallel.
//
// The prefill server must therefore run with the same model (and KV
// settings) as the decoder, and with --slot-save-path equal to
// dirname(--state), which is onebitd's --slot-dir, the decoder's
// --slot-save-path too. The decoder then restores the file.
//
// Exit status: 0 only when the state file is complete; 1 on any failure
// (the last stderr line says why: the step, the HTTP status and
// llama-server's message); 2 on bad usage or when the prefill server runs
// another model than --model.
package prefill

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/onebitd/onebitd/decoder"
)

// Errors of this package.
var (
	// ErrUsage: a flag is missing or malformed (exit 2).
	ErrUsage = errors.New("prefill: bad usage")
	// ErrModelMismatch: the prefill server runs another model (exit 2).
	ErrModelMismatch = errors.New("prefill: the prefill server runs another model")
	// ErrTokens: the tokens file is not a JSON array of token ids.
	ErrTokens = errors.New("prefill: bad tokens file")
	// ErrServer: the prefill server answered with an error or not at all.
	ErrServer = errors.New("prefill: prefill server failed")
	// ErrIncomplete: the save answered 200 but the state file is not there
	// or not complete.
	ErrIncomplete = errors.New("prefill: state file incomplete")
)

// Limits.
const (
	// MaxTokensFile bounds the tokens file (a 1M-token prompt is ~8 MB).
	MaxTokensFile = 64 << 20
	// DefaultTimeout bounds a whole run when Config.Timeout is 0.
	DefaultTimeout = 5 * time.Minute
)

// Config is one run of onebit-prefill.
type Config struct {
	PrefillURL string        // --prefill-url: the prefill llama-server (http://host:port or unix:///path.sock)
	APIKeyFile string        // --prefill-api-key-file: its API key (llama-server --api-key-file)
	Slot       int           // --slot: the prefill server's slot to use
	Slots      int           // --slots: use any free one of slots 0..Slots-1 instead (0: only Slot)
	Timeout    time.Duration // --timeout: the whole run (0: DefaultTimeout)
	TokensPath string        // --tokens
	Tokens     []int         // the tokens themselves instead of TokensPath (warm mode: from the job)
	Model      string        // --model: checked against the server's /props model_path basename
	StatePath  string        // --state: where the state file must end up
	HTTP       *http.Client  // nil: a default client
}

// Result is what a successful run did.
type Result struct {
	Slot     int   // the prefill server's slot used
	NTokens  int   // prompt tokens sent
	NSaved   int   // tokens the server saved
	NWritten int64 // bytes of the state file
	PromptN  int   // tokens the prefill server evaluated (the rest came from its own prompt cache)
}

// ExitCode maps Run's error to the process exit status.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrUsage), errors.Is(err, ErrModelMismatch):
		return 2
	}
	return 1
}

func (c *Config) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrUsage}, a...)...)
	}
	switch {
	case c.PrefillURL == "":
		return bad("--prefill-url is required")
	case c.TokensPath == "" && c.Tokens == nil:
		return bad("--tokens is required")
	case c.Model == "":
		return bad("--model is required")
	case c.StatePath == "":
		return bad("--state is required")
	case c.Slot < 0:
		return bad("--slot %d is negative", c.Slot)
	case c.Slots < 0:
		return bad("--slots %d is negative", c.Slots)
	case c.Timeout < 0:
		return bad("--timeout %s is negative", c.Timeout)
	}
	u, err := url.Parse(c.PrefillURL)
	if err != nil || !((u.Scheme == "http" || u.Scheme == "https") && u.Host != "" || u.Scheme == "unix" && u.Host == "" && u.Path != "") {
		return bad("--prefill-url %q: want http://host:port or unix:///path/to.sock", c.PrefillURL)
	}
	c.PrefillURL = strings.TrimRight(c.PrefillURL, "/")
	if !decoder.ValidFilename(filepath.Base(c.StatePath)) || strings.HasSuffix(c.StatePath, "/") {
		return bad("--state %q: its file name is not one llama-server accepts", c.StatePath)
	}
	if fi, err := os.Stat(filepath.Dir(c.StatePath)); err != nil || !fi.IsDir() {
		return bad("--state %q: %s is not a directory", c.StatePath, filepath.Dir(c.StatePath))
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.HTTP == nil {
		c.HTTP = &http.Client{}
	}
	return nil
}

// Run does one prefill (see the package comment).
func Run(ctx context.Context, cfg Config) (Result, error) {
	var res Result
	if err := cfg.check(); err != nil {
		return res, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	toks := cfg.Tokens
	if toks == nil {
		var err error
		if toks, err = ReadTokensFile(cfg.TokensPath); err != nil {
			return res, err
		}
	}
	res.NTokens = len(toks)
	var opts []decoder.Option
	if cfg.APIKeyFile != "" {
		opts = append(opts, decoder.WithAPIKeyFile(cfg.APIKeyFile))
	}
	c, err := decoder.NewFor("prefill server", cfg.PrefillURL, cfg.HTTP, opts...)
	if err != nil {
		return res, fmt.Errorf("%w: %w", ErrUsage, err)
	}

	var props struct {
		ModelPath  string `json:"model_path"`
		TotalSlots int    `json:"total_slots"`
	}
	if err := c.Call(ctx, "props", http.MethodGet, "/props", nil, &props); err != nil {
		return res, serverError{err}
	}
	if props.ModelPath != "" && filepath.Base(props.ModelPath) != filepath.Base(cfg.Model) {
		return res, fmt.Errorf("%w: it runs %s, --model is %s (both sides must load the same model)",
			ErrModelMismatch, filepath.Base(props.ModelPath), filepath.Base(cfg.Model))
	}
	slots := []int{cfg.Slot}
	if cfg.Slots > 0 {
		slots = slots[:0]
		for i := range cfg.Slots {
			slots = append(slots, i)
		}
	}
	// llama-server wraps a slot id past the end onto another slot.
	if last := slots[len(slots)-1]; props.TotalSlots > 0 && last >= props.TotalSlots {
		flag := fmt.Sprintf("--slot %d", last)
		if cfg.Slots > 0 {
			flag = fmt.Sprintf("--slots %d", cfg.Slots)
		}
		return res, fmt.Errorf("%w: %s but the prefill server has %d slots", ErrUsage, flag, props.TotalSlots)
	}
	slot, lock, err := lockSlot(ctx, filepath.Dir(cfg.StatePath), cfg.PrefillURL, slots)
	if err != nil {
		return res, err
	}
	defer lock.unlock()
	res.Slot = slot

	var comp struct {
		Timings struct {
			PromptN int `json:"prompt_n"`
		} `json:"timings"`
	}
	body := map[string]any{"prompt": toks, "n_predict": 0, "cache_prompt": true, "id_slot": slot}
	if err := c.Call(ctx, "completion", http.MethodPost, "/completion", body, &comp); err != nil {
		return res, serverError{err}
	}
	res.PromptN = comp.Timings.PromptN

	// A file left at --state by an earlier run would make a failed save look
	// complete.
	if err := os.Remove(cfg.StatePath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return res, fmt.Errorf("prefill: remove the old state file: %w", err)
	}
	name := filepath.Base(cfg.StatePath)
	save, err := c.Save(ctx, slot, name)
	if err != nil {
		return res, serverError{err}
	}
	res.NSaved, res.NWritten = *save.NSaved, *save.NWritten
	if err := checkState(cfg.StatePath, res.NWritten); err != nil {
		return res, err
	}
	if res.NSaved != res.NTokens {
		return res, fmt.Errorf("%w: the prefill server saved %d tokens of slot %d, the prompt has %d",
			ErrIncomplete, res.NSaved, slot, res.NTokens)
	}
	return res, nil
}

// serverError is an error of the prefill server's client: it reads as that
// error and matches ErrServer.
type serverError struct{ err error }

func (e serverError) Error() string   { return "prefill: " + e.err.Error() }
func (e serverError) Unwrap() []error { return []error{ErrServer, e.err} }

// checkState checks that path is a regular file of want bytes.
func checkState(path string, want int64) error {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: the prefill server saved %d bytes but %s does not exist: start it with --slot-save-path %s",
				ErrIncomplete, want, path, filepath.Dir(path))
		}
		return fmt.Errorf("%w: %w", ErrIncomplete, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() != want {
		return fmt.Errorf("%w: %s has %d bytes, the prefill server reported %d written (is its --slot-save-path %s?)",
			ErrIncomplete, path, fi.Size(), want, filepath.Dir(path))
	}
	return nil
}

// ReadTokensFile reads a tokens file: a JSON array of token ids (DESIGN §2).
func ReadTokensFile(path string) ([]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokens, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxTokensFile+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrTokens, path, err)
	}
	if len(b) > MaxTokensFile {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrTokens, path, MaxTokensFile)
	}
	toks, err := ParseTokens(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return toks, nil
}

// ParseTokens parses a non-empty JSON array of token ids in [0, 2^31).
func ParseTokens(b []byte) ([]int, error) {
	var raw []json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%w: not a JSON array of token ids: %w", ErrTokens, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the array", ErrTokens)
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("%w: no tokens", ErrTokens)
	}
	toks := make([]int, len(raw))
	for i, n := range raw {
		v, err := strconv.ParseInt(string(bytes.TrimSpace(n)), 10, 32)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%w: token %d is %q, not a token id", ErrTokens, i, truncate(string(n), 32))
		}
		toks[i] = int(v)
	}
	return toks, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
