package decodersim

import (
	"context"
	"strings"
	"time"

	"github.com/onebitd/onebitd/internal/simkv"
)

// defaultNPredict caps generation when n_predict is -1 or absent.
const defaultNPredict = 256

// Stop types, as llama-server names them.
const (
	stopNone  = "none"
	stopEOS   = "eos"
	stopLimit = "limit"
	stopWord  = "word"
)

// genParams is what a completion asks of the engine.
type genParams struct {
	prompt      []int
	nPredict    int // -1: until EOS or defaultNPredict; 0: evaluate the prompt only
	cachePrompt bool
	stop        []string
	tokenDelay  time.Duration // per generated token: --token-delay, or the gen-slow fault's
}

// genResult is the outcome of one completion.
type genResult struct {
	slot         int
	content      string // generated text, cut at a stop word
	tokens       []int  // generated tokens (EOS included)
	stopType     string
	stoppingWord string
	nPrompt      int
	promptN      int // prompt tokens evaluated
	cacheN       int // prompt tokens reused from the slot's cache
	promptMs     float64
	predictedMs  float64
	tokensCached int
	truncated    bool
}

// emitFunc receives text that became final with token tok (never empty:
// text that may start a stop word is held back). An error stops generation.
type emitFunc func(text string, tok int) error

// generate runs one completion on slot s, which the caller holds. It
// evaluates the part of the prompt that the slot's cache does not hold (the
// last prompt token always), then generates greedily. Every generated token
// but the last is evaluated into the next cell.
func (srv *Server) generate(ctx context.Context, s *slot, p genParams, emit emitFunc) (genResult, error) {
	res := genResult{slot: s.id, nPrompt: len(p.prompt), stopType: stopNone}
	s.nPrompt.Store(int64(len(p.prompt)))
	s.nDecoded.Store(0)
	if len(p.prompt) == 0 { // upstream: release the slot, answer with nothing
		res.tokensCached = len(s.tokens)
		return res, nil
	}

	keep := 0
	if p.cachePrompt {
		keep = commonPrefix(s.tokens, p.prompt)
	}
	if keep == len(p.prompt) {
		keep-- // the last prompt token is always evaluated again
	}
	s.touchKV()
	s.truncate(keep)
	t0 := time.Now()
	for i := keep; i < len(p.prompt); i++ {
		srv.evalCell(s, i, p.prompt[i])
		s.tokens = append(s.tokens, p.prompt[i])
	}
	s.nCached.Store(int64(len(s.tokens)))
	res.promptN, res.cacheN = len(p.prompt)-keep, keep
	if err := srv.spend(ctx, t0, srv.cfg.PromptMsPerToken*float64(res.promptN)); err != nil {
		return srv.finish(res, s, "", t0), err
	}
	res.promptMs = msSince(t0)

	nPredict := p.nPredict
	if nPredict < 0 {
		nPredict = defaultNPredict
	}
	if nPredict == 0 {
		res.stopType = stopLimit
		res.tokensCached = len(s.tokens)
		return res, nil
	}

	t1 := time.Now()
	var text strings.Builder
	sent := 0 // bytes of text already emitted
	for {
		if err := tokenDelay(ctx, p.tokenDelay); err != nil {
			return srv.finish(res, s, text.String(), t1), err
		}
		tok := srv.nextToken(s, len(s.tokens))
		res.tokens = append(res.tokens, tok)
		s.nDecoded.Store(int64(len(res.tokens)))

		if tok == simkv.TokEOS {
			res.stopType = stopEOS
		} else {
			text.WriteString(simkv.Piece(tok))
		}
		full := text.String()
		safe := len(full)
		if res.stopType == stopNone {
			switch at, word := findStop(full, p.stop); {
			case at >= 0:
				res.stopType, res.stoppingWord = stopWord, word
				safe = at
				text.Reset()
				text.WriteString(full[:at])
			case len(res.tokens) >= nPredict:
				res.stopType = stopLimit
			case len(s.tokens) >= srv.kv.slotCells: // no cell left for tok
				res.stopType, res.truncated = stopLimit, true
			default:
				safe = min(partialStop(full, p.stop), simkv.ValidUTF8Prefix(full))
			}
		}
		if safe > sent {
			if err := emit(full[sent:safe], tok); err != nil {
				return srv.finish(res, s, text.String(), t1), err
			}
			sent = safe
		}
		if res.stopType != stopNone {
			return srv.finish(res, s, text.String(), t1), nil
		}
		srv.evalCell(s, len(s.tokens), tok)
		s.tokens = append(s.tokens, tok)
		s.nCached.Store(int64(len(s.tokens)))
	}
}

func (srv *Server) finish(res genResult, s *slot, content string, t1 time.Time) genResult {
	res.content = content
	res.tokensCached = len(s.tokens)
	res.predictedMs = msSince(t1)
	return res
}

// spend waits until ms milliseconds have passed since t0, or ctx ends
// (--prompt-ms-per-token: the simulated prompt evaluation time, reported in
// timings.prompt_ms with the real work).
func (srv *Server) spend(ctx context.Context, t0 time.Time, ms float64) error {
	d := time.Duration(ms*float64(time.Millisecond)) - time.Since(t0)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tokenDelay sleeps d (--token-delay), or less if ctx ends.
func tokenDelay(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// findStop returns the earliest position of any stop word in text, and the
// word, or -1.
func findStop(text string, stops []string) (int, string) {
	at, word := -1, ""
	for _, w := range stops {
		if i := strings.Index(text, w); i >= 0 && (at < 0 || i < at) {
			at, word = i, w
		}
	}
	return at, word
}

// partialStop is the length of text that cannot be the start of a stop word:
// a suffix that is a prefix of a stop word is held back while streaming.
func partialStop(text string, stops []string) int {
	safe := len(text)
	for _, w := range stops {
		for n := min(len(w)-1, len(text)); n > 0; n-- {
			if strings.HasSuffix(text, w[:n]) {
				safe = min(safe, len(text)-n)
				break
			}
		}
	}
	return safe
}
