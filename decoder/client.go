// Package decoder talks to the decoder (llama-server or the fork with
// share/adopt): a small HTTP client for the endpoints the handoff needs, with
// llama-server's error shape parsed into errors a user can read.
package decoder

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Errors of this package.
var (
	// ErrNoShare: the decoder has no shared route (upstream llama-server
	// answers ?action=share with 400 "Invalid action").
	ErrNoShare = errors.New("decoder: the decoder has no shared route (?action=share is not an action it knows)")
	// ErrBadReply: a 2xx answer whose body is not what the endpoint returns.
	ErrBadReply = errors.New("decoder: malformed reply")
)

// maxReply bounds every reply body the client reads.
const maxReply = 64 << 20

// APIError is a non-2xx answer in llama-server's error shape
// {"error":{"code":N,"message":"…","type":"…"}}.
type APIError struct {
	Server  string // who answered: "decoder", "prefill server"
	Op      string // "tokenize", "share", …
	Status  int
	Type    string
	Message string
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	if e.Type != "" {
		return fmt.Sprintf("%s answered %s with %d %s: %s", e.Server, e.Op, e.Status, e.Type, msg)
	}
	return fmt.Sprintf("%s answered %s with %d: %s", e.Server, e.Op, e.Status, msg)
}

// Client calls one llama-server: the decoder, or any other instance (a
// prefill server) through NewFor.
type Client struct {
	server string // names the server in errors
	base   string // scheme://host:port, no trailing slash
	http   *http.Client
}

// New returns a client for the decoder at baseURL.
func New(baseURL string, hc *http.Client) (*Client, error) {
	return NewFor("decoder", baseURL, hc)
}

// NewFor returns a client for the llama-server at baseURL, called server in
// error messages ("prefill server").
func NewFor(server, baseURL string, hc *http.Client) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("decoder: bad decoder URL %q (want http://host:port)", baseURL)
	}
	if hc == nil {
		hc = &http.Client{Transport: NewTransport()}
	}
	return &Client{server: server, base: strings.TrimRight(u.Scheme+"://"+u.Host+u.Path, "/"), http: hc}, nil
}

// NewTransport is the HTTP transport onebitd uses towards the decoder: many
// idle keep-alive connections (one decoder, many concurrent requests).
func NewTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 512
	t.MaxIdleConnsPerHost = 512
	t.DisableCompression = true
	return t
}

// BaseURL is the decoder's base URL.
func (c *Client) BaseURL() string { return c.base }

// HTTP is the client's http.Client (shared with the proxy).
func (c *Client) HTTP() *http.Client { return c.http }

// Call sends in (JSON, nil for no body) to path and decodes a 2xx answer
// into out (nil: ignore it). A non-2xx answer is an *APIError; no answer in
// time, no connection and a malformed answer are errors naming op.
func (c *Client) Call(ctx context.Context, op, method, path string, in, out any) error {
	return c.do(ctx, op, method, path, in, out)
}

func (c *Client) do(ctx context.Context, op, method, path string, in, out any) error {
	var body io.Reader
	switch in := in.(type) {
	case nil:
	case rawBody:
		body = bytes.NewReader(in)
	default:
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s: %s: encode: %w", c.server, op, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", c.server, op, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s did not answer %s in time: %w", c.server, op, ctx.Err())
		}
		return fmt.Errorf("%s unreachable for %s: %w", c.server, op, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxReply))
	if err != nil {
		return fmt.Errorf("%s: %s: read reply: %w", c.server, op, err)
	}
	if resp.StatusCode/100 != 2 {
		return parseError(c.server, op, resp.StatusCode, raw)
	}
	if out == nil {
		return nil
	}
	if t, ok := out.(*tokensReply); ok {
		if toks, ok := parseTokens(raw); ok {
			t.Tokens = toks
			return nil
		}
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%w from %s: %v", ErrBadReply, op, err)
	}
	return nil
}

// parseError turns a non-2xx reply into an *APIError.
func parseError(server, op string, status int, raw []byte) error {
	e := &APIError{Server: server, Op: op, Status: status}
	var shape struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &shape) == nil && (shape.Error.Message != "" || shape.Error.Type != "") {
		e.Type, e.Message = shape.Error.Type, shape.Error.Message
	} else {
		e.Message = strings.TrimSpace(string(raw[:min(len(raw), 256)]))
	}
	e.Message = strings.Join(strings.Fields(e.Message), " ") // one line: it becomes a reason
	return e
}

// IsStatus reports whether err is an APIError with the given status.
func IsStatus(err error, status int) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == status
}

// tokensReply is /tokenize's answer.
type tokensReply struct {
	Tokens []int `json:"tokens"`
}

// parseTokens reads the common shape of a /tokenize reply,
// {"tokens":[int,…]} with any JSON whitespace, without reflection
// (encoding/json took ~1.8 ms for 12 722 tokens on the reference box). On
// any other shape it returns ok false and the caller uses json.Unmarshal;
// what it accepts, json.Unmarshal reads the same way (FuzzParseTokens).
func parseTokens(raw []byte) (toks []int, ok bool) {
	i := 0
	ws := func() {
		for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
		}
	}
	lit := func(s string) bool {
		ws()
		if len(raw)-i >= len(s) && string(raw[i:i+len(s)]) == s {
			i += len(s)
			return true
		}
		return false
	}
	if !lit("{") || !lit(`"tokens"`) || !lit(":") || !lit("[") {
		return nil, false
	}
	toks = make([]int, 0, len(raw)/5)
	if !lit("]") {
		for {
			ws()
			neg := i < len(raw) && raw[i] == '-'
			if neg {
				i++
			}
			start := i
			var u uint64
			for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
				u = u*10 + uint64(raw[i]-'0')
				i++
				if i-start > 18 { // beyond any token id; let encoding/json decide
					return nil, false
				}
			}
			if i == start || (raw[start] == '0' && i-start > 1) {
				return nil, false
			}
			v := int(u)
			if neg {
				v = -v
			}
			toks = append(toks, v)
			if lit(",") {
				continue
			}
			if !lit("]") {
				return nil, false
			}
			break
		}
	}
	if !lit("}") {
		return nil, false
	}
	ws()
	return toks, i == len(raw)
}

// Tokenize tokenizes content the way llama-server tokenizes a completion
// prompt (add_special and parse_special on, so BOS comes first).
func (c *Client) Tokenize(ctx context.Context, content string) ([]int, error) {
	var out tokensReply
	in := map[string]any{"content": content, "add_special": true, "parse_special": true}
	if err := c.do(ctx, "tokenize", http.MethodPost, "/tokenize", in, &out); err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

// ApplyTemplate renders chat messages (and the rest of a chat request's
// fields that matter to the template) into the prompt string.
func (c *Client) ApplyTemplate(ctx context.Context, chatBody json.RawMessage) (string, error) {
	var out struct {
		Prompt *string `json:"prompt"`
	}
	if err := c.do(ctx, "apply-template", http.MethodPost, "/apply-template", chatBody, &out); err != nil {
		return "", err
	}
	if out.Prompt == nil {
		return "", fmt.Errorf("%w from apply-template: no prompt", ErrBadReply)
	}
	return *out.Prompt, nil
}

// Props is the part of GET /props onebitd uses.
type Props struct {
	TotalSlots int    `json:"total_slots"`
	ModelPath  string `json:"model_path"`
	Default    struct {
		NCtx int `json:"n_ctx"`
	} `json:"default_generation_settings"`
}

// Props reads GET /props.
func (c *Client) Props(ctx context.Context) (Props, error) {
	var p Props
	err := c.do(ctx, "props", http.MethodGet, "/props", nil, &p)
	return p, err
}

// Health reads GET /health; nil means 200.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, "health", http.MethodGet, "/health", nil, nil)
}

// ShareReply is the decoder's answer to ?action=share.
type ShareReply struct {
	IDSlot      int    `json:"id_slot"`
	ShareID     *int64 `json:"share_id"`
	NRegions    int    `json:"n_regions"`
	NFDs        int    `json:"n_fds"`
	BytesMapped int64  `json:"bytes_mapped"`
}

// Share asks the decoder to export slot's KV on the unix socket at socket.
func (c *Client) Share(ctx context.Context, slot int, socket string) (ShareReply, error) {
	var r ShareReply
	err := c.do(ctx, "share", http.MethodPost, slotPath(slot, "share"), map[string]any{"socket": socket}, &r)
	if err != nil {
		var ae *APIError
		if errors.As(err, &ae) && ae.Status == http.StatusBadRequest && strings.Contains(strings.ToLower(ae.Message), "invalid action") {
			return r, fmt.Errorf("%w: %w", ErrNoShare, err)
		}
		return r, err
	}
	if r.ShareID == nil {
		return r, fmt.Errorf("%w from share: no share_id", ErrBadReply)
	}
	return r, nil
}

// Adopt asks the decoder to adopt cells 0..len(tokens)-1 of slot, written by
// the provider into the regions of share shareID.
func (c *Client) Adopt(ctx context.Context, slot int, tokens []int, shareID int64) error {
	return c.do(ctx, "adopt", http.MethodPost, slotPath(slot, "adopt"),
		map[string]any{"tokens": tokens, "share_id": shareID}, nil)
}

// AdoptJSON is Adopt with the tokens already encoded as a JSON array (the
// handoff encodes a prompt's tokens once, for the tokens file and this
// body: at 12 722 tokens that saves json.Marshal's ~300 µs).
func (c *Client) AdoptJSON(ctx context.Context, slot int, tokens json.RawMessage, shareID int64) error {
	body := make(rawBody, 0, len(tokens)+48)
	body = append(body, `{"share_id":`...)
	body = strconv.AppendInt(body, shareID, 10)
	body = append(body, `,"tokens":`...)
	body = append(body, tokens...)
	body = append(body, '}')
	return c.do(ctx, "adopt", http.MethodPost, slotPath(slot, "adopt"), body, nil)
}

// rawBody is a request body already encoded as JSON.
type rawBody []byte

// RestoreReply is the decoder's answer to ?action=restore.
type RestoreReply struct {
	IDSlot    int    `json:"id_slot"`
	Filename  string `json:"filename"`
	NRestored int    `json:"n_restored"`
	NRead     int64  `json:"n_read"`
}

// Restore asks the decoder to load filename (relative to its
// --slot-save-path) into slot.
func (c *Client) Restore(ctx context.Context, slot int, filename string) (RestoreReply, error) {
	var r RestoreReply
	err := c.do(ctx, "restore", http.MethodPost, slotPath(slot, "restore"), map[string]any{"filename": filename}, &r)
	return r, err
}

// SaveReply is the answer to ?action=save.
type SaveReply struct {
	IDSlot   int    `json:"id_slot"`
	Filename string `json:"filename"`
	NSaved   *int   `json:"n_saved"`
	NWritten *int64 `json:"n_written"`
}

// Save asks the server to write slot's state to filename (relative to its
// --slot-save-path).
func (c *Client) Save(ctx context.Context, slot int, filename string) (SaveReply, error) {
	var r SaveReply
	err := c.do(ctx, "save", http.MethodPost, slotPath(slot, "save"), map[string]any{"filename": filename}, &r)
	if err == nil && (r.NSaved == nil || r.NWritten == nil) {
		err = fmt.Errorf("%w from save: no n_saved or n_written", ErrBadReply)
	}
	return r, err
}

// Erase clears slot.
func (c *Client) Erase(ctx context.Context, slot int) error {
	return c.do(ctx, "erase", http.MethodPost, slotPath(slot, "erase"), nil, nil)
}

func slotPath(slot int, action string) string {
	return "/slots/" + strconv.Itoa(slot) + "?action=" + action
}
