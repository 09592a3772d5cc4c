package decodersim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// writeModel writes a model file with the given bytes and returns its path.
func writeModel(t testing.TB, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "model.gguf")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// testConfig is a small valid configuration with a slot save path.
func testConfig(t testing.TB) Config {
	t.Helper()
	c := DefaultConfig()
	c.ModelPath = writeModel(t, "GGUF-SIM test model\n")
	c.NCtx = 512
	c.SlotSavePath = t.TempDir()
	return c
}

// simServer is a Server behind an httptest server.
type simServer struct {
	t   testing.TB
	srv *Server
	ts  *httptest.Server
}

func startSim(t testing.TB, cfg Config) *simServer {
	t.Helper()
	srv, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	return &simServer{t: t, srv: srv, ts: ts}
}

// reply is one HTTP answer.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("answer is not a JSON object: %v: %s", err, r.body)
	}
	return m
}

// errorOf returns the error object of an error answer.
func (r reply) errorOf(t testing.TB) (code int, typ, msg string) {
	t.Helper()
	var e struct {
		Error *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error == nil {
		t.Fatalf("not an error answer (status %d): %s", r.status, r.body)
	}
	return e.Error.Code, e.Error.Type, e.Error.Message
}

// do sends a request; body is sent verbatim when a string, else as JSON.
func (s *simServer) do(method, path string, body any) reply {
	s.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			s.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, s.ts.URL+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := s.ts.Client().Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("%s %s: read: %v", method, path, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

func (s *simServer) post(path string, body any) reply { return s.do(http.MethodPost, path, body) }

// completion is the part of a /completion answer tests look at.
type completion struct {
	Content      string `json:"content"`
	Tokens       []int  `json:"tokens"`
	IDSlot       int    `json:"id_slot"`
	StopType     string `json:"stop_type"`
	StoppingWord string `json:"stopping_word"`
	TokensCached int    `json:"tokens_cached"`
	TokensEval   int    `json:"tokens_evaluated"`
	Timings      struct {
		PromptN     int     `json:"prompt_n"`
		CacheN      int     `json:"cache_n"`
		PredictedN  int     `json:"predicted_n"`
		PromptMs    float64 `json:"prompt_ms"`
		PredictedMs float64 `json:"predicted_ms"`
	} `json:"timings"`
}

// complete runs a non-streamed /completion and fails the test on an error.
func (s *simServer) complete(body map[string]any) completion {
	s.t.Helper()
	if _, ok := body["return_tokens"]; !ok {
		body["return_tokens"] = true
	}
	r := s.post("/completion", body)
	if r.status != http.StatusOK {
		s.t.Fatalf("/completion %v: %d %s", body, r.status, r.body)
	}
	var c completion
	if err := json.Unmarshal(r.body, &c); err != nil {
		s.t.Fatal(err)
	}
	return c
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
