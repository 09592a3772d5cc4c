package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Entry is a completion entry point of onebitd.
type Entry string

// The entry points the soak drives.
const (
	EntryCompletion Entry = "/completion"
	EntryV1Compl    Entry = "/v1/completions"
	EntryChat       Entry = "/v1/chat/completions"
)

var entries = []Entry{EntryCompletion, EntryV1Compl, EntryChat}

// answer is what one completion gave.
type answer struct {
	status   int
	route    string
	reqID    string
	text     string
	errEvent bool   // a stream ended with data: {"error":…}
	errShape bool   // a non-200 answer is llama-server's {"error":{code,message,type}}
	bad      string // a protocol problem (bad SSE, bad JSON, [DONE] framing)
	left     bool   // the client left mid-stream (client-gone)
	body     string // the tail of the raw answer, for reports
}

// midStream is called once, after the first data event of a stream; it
// returns true when the client must leave now.
type midStream func() (leave bool)

// complete sends one greedy completion of prompt through base's ep and
// reads the answer; mid (stream only) runs after the first event. ctx
// bounds the whole exchange.
func complete(ctx context.Context, hc *http.Client, base string, ep Entry, stream bool, prompt string, nPredict int, mid midStream) (answer, error) {
	req := map[string]any{"stream": stream}
	switch ep {
	case EntryCompletion:
		req["prompt"], req["n_predict"] = prompt, nPredict
	case EntryV1Compl:
		req["prompt"], req["max_tokens"] = prompt, nPredict
	case EntryChat:
		req["messages"] = []map[string]string{{"role": "user", "content": prompt}}
		req["max_tokens"] = nPredict
	}
	body, _ := json.Marshal(req)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, base+string(ep), bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(hr)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, route: resp.Header.Get("X-Onebit-Route"), reqID: resp.Header.Get("X-Onebit-Request-Id")}
	if resp.StatusCode != http.StatusOK || !stream {
		raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		a.body = tail(string(raw))
		if err != nil {
			return a, fmt.Errorf("read the answer: %w", err)
		}
		if resp.StatusCode != http.StatusOK {
			a.errShape = errorShape(raw)
			return a, nil
		}
		var o map[string]any
		if err := json.Unmarshal(raw, &o); err != nil {
			a.bad = "answer is not JSON: " + err.Error()
			return a, nil
		}
		a.text = textOf(ep, o)
		return a, nil
	}
	// A stream: data: <json> events; OpenAI routes end with [DONE].
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var raw strings.Builder
	events, done := 0, false
	for {
		line, err := br.ReadString('\n')
		raw.WriteString(line)
		line = strings.TrimRight(line, "\r\n")
		if strings.HasPrefix(line, "data: ") {
			data := strings.TrimPrefix(line, "data: ")
			switch {
			case done:
				a.bad = "an event after [DONE]"
			case data == "[DONE]":
				done = true
			default:
				var o map[string]any
				if jerr := json.Unmarshal([]byte(data), &o); jerr != nil {
					a.bad = fmt.Sprintf("bad SSE event %q", tail(data))
					break
				}
				if _, ok := o["error"]; ok {
					a.errEvent = true
					a.errShape = errorShape([]byte(data))
				} else if a.errEvent {
					a.bad = "an event after the error event"
				}
				a.text += textOf(ep, o)
			}
			events++
			if events == 1 && mid != nil && mid() {
				a.left = true
				a.body = tail(raw.String())
				return a, nil // the deferred cancel and Close hang up
			}
		}
		if err != nil {
			a.body = tail(raw.String())
			if errors.Is(err, io.EOF) {
				break
			}
			return a, fmt.Errorf("read the stream: %w", err)
		}
	}
	switch {
	case a.errEvent && done:
		a.bad = "[DONE] after an error event"
	case !a.errEvent && (ep != EntryCompletion) != done:
		a.bad = "[DONE] framing wrong"
	}
	return a, nil
}

// errorShape reports whether raw is {"error":{"code":N,"message":"…","type":"…"}}.
func errorShape(raw []byte) bool {
	var e struct {
		Error *struct {
			Code    *int    `json:"code"`
			Message *string `json:"message"`
			Type    *string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &e) != nil || e.Error == nil {
		return false
	}
	return e.Error.Code != nil && *e.Error.Code >= 400 && e.Error.Message != nil && e.Error.Type != nil && *e.Error.Type != ""
}

// textOf is the generated text in one answer object or stream event.
func textOf(ep Entry, o map[string]any) string {
	switch ep {
	case EntryCompletion:
		return str(o["content"])
	case EntryV1Compl:
		if c := choice(o); c != nil {
			return str(c["text"])
		}
	case EntryChat:
		if c := choice(o); c != nil {
			var s string
			if m, ok := c["message"].(map[string]any); ok {
				s += str(m["content"])
			}
			if d, ok := c["delta"].(map[string]any); ok {
				s += str(d["content"])
			}
			return s
		}
	}
	return ""
}

func choice(o map[string]any) map[string]any {
	cs, _ := o["choices"].([]any)
	if len(cs) == 0 {
		return nil
	}
	c, _ := cs[0].(map[string]any)
	return c
}

func str(v any) string { s, _ := v.(string); return s }

func tail(s string) string {
	if len(s) > 300 {
		return "…" + s[len(s)-300:]
	}
	return s
}

// health asks base's /health (within a second): whether it answered 200,
// and onebitd's word on its warm provider ("ok" when ready).
func health(hc *http.Client, base string) (ok bool, provider string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
	resp, err := hc.Do(req)
	if err != nil {
		return false, ""
	}
	defer resp.Body.Close()
	var h struct {
		Onebitd struct {
			Provider string `json:"provider"`
		} `json:"onebitd"`
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	_ = json.Unmarshal(raw, &h)
	return resp.StatusCode == http.StatusOK, h.Onebitd.Provider
}
