package decodersim

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/onebitd/onebitd/internal/jsonexact"
	"github.com/onebitd/onebitd/internal/simkv"
)

// chatTemplate is the ChatML template the sim applies (reported by /props).
const chatTemplate = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// slotJSON is one entry of GET /slots (and /props' default settings).
type slotJSON struct {
	ID            int            `json:"id"`
	IDTask        int            `json:"id_task"`
	NCtx          int            `json:"n_ctx"`
	Speculative   bool           `json:"speculative"`
	IsProcessing  bool           `json:"is_processing"`
	NPromptTokens *int64         `json:"n_prompt_tokens,omitempty"`
	NCached       int64          `json:"n_cached"`
	Params        map[string]any `json:"params"`
	Prompt        string         `json:"prompt"`
	NextToken     []nextTokenJS  `json:"next_token"`
}

type nextTokenJS struct {
	HasNextToken bool   `json:"has_next_token"`
	HasNewLine   bool   `json:"has_new_line"`
	NRemain      int    `json:"n_remain"`
	NDecoded     int64  `json:"n_decoded"`
	StoppingWord string `json:"stopping_word"`
}

func (s *Server) defaultParams() map[string]any {
	return map[string]any{
		"n_predict":    -1,
		"seed":         4294967295,
		"temperature":  0.8,
		"top_k":        40,
		"top_p":        0.95,
		"min_p":        0.05,
		"n_keep":       0,
		"n_discard":    0,
		"ignore_eos":   false,
		"stream":       false,
		"cache_prompt": true,
		"stop":         []string{},
		"samplers":     []string{"greedy"},
	}
}

func (s *Server) slotInfo(sl *slot, busy bool) slotJSON {
	j := slotJSON{
		ID:           sl.id,
		IDTask:       -1,
		NCtx:         s.kv.slotCells,
		IsProcessing: busy,
		NCached:      sl.nCached.Load(),
		Params:       s.defaultParams(),
		NextToken:    []nextTokenJS{{HasNextToken: busy, NRemain: -1, NDecoded: sl.nDecoded.Load()}},
	}
	if n := sl.nPrompt.Load(); n >= 0 {
		j.NPromptTokens = &n
	}
	return j
}

func (s *Server) handleSlots(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.NoSlots {
		writeError(w, apiErr(errNotSupported, "This server does not support slots endpoint. Start it with `--slots`"))
		return
	}
	out := make([]slotJSON, len(s.sched.slots))
	for i, sl := range s.sched.slots {
		out[i] = s.slotInfo(sl, s.sched.isBusy(i))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleProps(w http.ResponseWriter, _ *http.Request) {
	def := s.slotInfo(s.sched.slots[0], false)
	def.NPromptTokens = nil
	def.NCached = 0
	writeJSON(w, http.StatusOK, struct {
		DefaultGenerationSettings slotJSON        `json:"default_generation_settings"`
		TotalSlots                int             `json:"total_slots"`
		ModelPath                 string          `json:"model_path"`
		Modalities                map[string]bool `json:"modalities"`
		ChatTemplate              string          `json:"chat_template"`
		BOSToken                  string          `json:"bos_token"`
		EOSToken                  string          `json:"eos_token"`
		BuildInfo                 string          `json:"build_info"`
		IsSleeping                bool            `json:"is_sleeping"`
	}{
		DefaultGenerationSettings: def,
		TotalSlots:                s.cfg.NParallel,
		ModelPath:                 s.cfg.ModelPath,
		Modalities:                map[string]bool{"vision": false, "audio": false},
		ChatTemplate:              chatTemplate,
		BuildInfo:                 buildInfo,
	})
}

var startTime = time.Now().Unix()

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string         `json:"id"`
		Object  string         `json:"object"`
		Created int64          `json:"created"`
		OwnedBy string         `json:"owned_by"`
		Meta    map[string]any `json:"meta"`
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []model{{
			ID: s.cfg.ModelPath, Object: "model", Created: startTime, OwnedBy: "llamacpp",
			Meta: map[string]any{"vocab_type": 1, "n_vocab": simkv.VocabSize(), "n_ctx_train": defaultNCtxTrain},
		}},
	})
}

// handleTokenize: {content, add_special (false), parse_special (true), with_pieces (false)}.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Content    *string `json:"content"`
		AddSpecial bool    `json:"add_special"`
		WithPieces bool    `json:"with_pieces"`
	}
	if e := readBody(r, &req); e != nil {
		writeError(w, e)
		return
	}
	var toks []int
	if req.Content != nil {
		toks = simkv.Tokenize(*req.Content, req.AddSpecial)
		s.armFault(*req.Content)
	} else {
		s.armFault("")
	}
	if !req.WithPieces {
		writeJSON(w, http.StatusOK, map[string]any{"tokens": nonNil(toks)})
		return
	}
	type piece struct {
		ID    int `json:"id"`
		Piece any `json:"piece"` // a string, or the bytes when not valid UTF-8
	}
	out := make([]piece, len(toks))
	for i, t := range toks {
		p := simkv.Piece(t)
		if utf8.ValidString(p) {
			out[i] = piece{t, p}
		} else {
			b := make([]int, len(p))
			for j := range len(p) {
				b[j] = int(p[j])
			}
			out[i] = piece{t, b}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": out})
}

func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Tokens []int `json:"tokens"`
	}
	if e := readBody(r, &req); e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"content": simkv.Detokenize(req.Tokens)})
}

// chatMessage is one OpenAI message; content is a string or an array of
// parts of which the text parts count.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// applyTemplate renders messages with the ChatML template, ending with the
// assistant generation prompt.
func applyTemplate(raw json.RawMessage) (string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", apiErr(errInvalidRequest, "'messages' is required")
	}
	var msgs []chatMessage
	if err := jsonexact.Unmarshal(raw, &msgs); err != nil {
		return "", apiErr(errInvalidRequest, "Expected 'messages' to be an array of {role, content}: %v", err)
	}
	if len(msgs) == 0 {
		return "", apiErr(errInvalidRequest, "'messages' must not be empty")
	}
	var b strings.Builder
	for i, m := range msgs {
		text, e := messageText(m.Content)
		if e != nil {
			return "", apiErr(errInvalidRequest, "message %d: %s", i, e.Message)
		}
		if m.Role == "" {
			return "", apiErr(errInvalidRequest, "message %d: missing 'role'", i)
		}
		b.WriteString("<|im_start|>" + m.Role + "\n" + text + "<|im_end|>\n")
	}
	b.WriteString("<|im_start|>assistant\n")
	return b.String(), nil
}

func messageText(raw json.RawMessage) (string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := jsonexact.Unmarshal(raw, &parts); err != nil {
		return "", apiErr(errInvalidRequest, "'content' must be a string or an array of parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", apiErr(errInvalidRequest, "unsupported content part type %q", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

func (s *Server) handleApplyTemplate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages json.RawMessage `json:"messages"`
	}
	if e := readBody(r, &req); e != nil {
		writeError(w, e)
		return
	}
	p, e := applyTemplate(req.Messages)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": p})
}

func nonNil(t []int) []int {
	if t == nil {
		return []int{}
	}
	return t
}
