// Package probe is `onebitd probe-decoder`: a conformance table for a
// decoder (upstream llama-server, the fork with share/adopt, or the
// simulator). Each check is one line, PASS, FAIL or "not supported", with a
// short detail; SKIP marks a check that could not run because an earlier one
// failed.
//
// The checks, in order, on one slot (Config.Slot):
//
//   - health: GET /health answers 200.
//   - props: GET /props reports total_slots, and the slot is below it
//     (llama-server wraps a slot id past the end onto another slot).
//   - slot actions: after erase, a 2-token prompt evaluated with
//     n_predict 0 and id_slot N can be saved (?action=save): the decoder runs
//     with --slot-save-path. The file is ProbeFile in that directory; it is
//     overwritten on every run (remove it with Config.SlotDir).
//   - id_slot honoured: the save of slot N holds exactly that prompt (a
//     decoder that put the request elsewhere saves an empty slot).
//   - restore → prompt_n 1: erase, restore the file, complete the same
//     prompt: the decoder evaluates only the last token.
//   - share message: ?action=share to a unix socket made with fdpass.Listen
//     in a private temp dir; the message is received, its header validated,
//     its fds counted and closed.
//   - adopt without share_id refused (while a share is pending).
//   - older share_id refused: after a second share, adopting the first is
//     refused.
//   - adopt of the last share: adopting the second share is accepted (the
//     probe adopts the prompt's 2 tokens, whose cells it never wrote, and
//     erases the slot at the end: nothing stays adopted).
//   - reused share_id refused: adopting the second share again is refused.
//   - recurrent cache 501: a decoder whose cache cannot be shared answers
//     501 to share and adopt rather than half-sharing. When share answers
//     501, this line is the one that passes and every other share line is
//     "not supported (recurrent cache)".
//
// Upstream llama-server answers ?action=share with 400 "Invalid action":
// every share line is then "not supported" (the file route still works).
// The share_id lines are the ones that tell whether a decoder treats share_id
// as decoration: a decoder that does leaves a trust hole open.
package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/onebitd/onebitd/decoder"
)

// Errors of this package.
var (
	// ErrConfig: a Config the probe cannot run with.
	ErrConfig = errors.New("probe: invalid configuration")
)

// ProbeFile is the state file name the probe saves and restores in the
// decoder's --slot-save-path.
const ProbeFile = "onebit-probe.bin"

// probeText is tokenized for the probe's prompt; its first two tokens are
// used.
const probeText = "onebitd conformance probe"

// Check names, in the order of the table.
const (
	CheckHealth      = "health"
	CheckProps       = "props"
	CheckSlotActions = "slot actions"
	CheckIDSlot      = "id_slot honoured"
	CheckRestore     = "restore → prompt_n 1"
	CheckShare       = "share message"
	CheckNoShareID   = "adopt without share_id refused"
	CheckOlder       = "older share_id refused"
	CheckAdopt       = "adopt of the last share"
	CheckReused      = "reused share_id refused"
	CheckRecurrent   = "recurrent cache 501"
)

// shareChecks are the lines that need the fork's endpoints.
var shareChecks = []string{CheckShare, CheckNoShareID, CheckOlder, CheckAdopt, CheckReused}

// ShareIDChecks are the lines that test the share_id rules.
var ShareIDChecks = []string{CheckNoShareID, CheckOlder, CheckReused}

// Status is a check's outcome.
type Status string

// Statuses.
const (
	Pass         Status = "PASS"
	Fail         Status = "FAIL"
	NotSupported Status = "not supported"
	Skip         Status = "SKIP" // not run: an earlier check failed
)

// Check is one line of the table.
type Check struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
}

// Report is the whole table.
type Report struct {
	DecoderURL string  `json:"decoder_url"`
	Slot       int     `json:"slot"`
	OK         bool    `json:"ok"` // no FAIL
	Checks     []Check `json:"checks"`
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool {
	for _, c := range r.Checks {
		if c.Status == Fail {
			return true
		}
	}
	return false
}

// Get returns the check named name (zero Check if absent).
func (r *Report) Get(name string) Check {
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	return Check{}
}

// WriteTable writes the report as an aligned table.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "decoder %s, slot %d\n", r.DecoderURL, r.Slot)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range r.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Status, c.Name, c.Detail)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	verdict := "conformant"
	if r.Failed() {
		verdict = "NOT conformant"
	}
	_, err := fmt.Fprintf(w, "%s\n", verdict)
	return err
}

// Config is one probe run.
type Config struct {
	DecoderURL string
	Slot       int
	Timeout    time.Duration // per request and per socket wait; default 30s
	// SlotDir, when set, is the decoder's --slot-save-path as seen from
	// here: the probe removes ProbeFile from it at the end.
	SlotDir string
	HTTP    *http.Client // nil: a default client
	// APIKeyFile holds the decoder's API key (its --api-key-file).
	APIKeyFile string
}

// Run probes the decoder. It returns an error only for a bad Config; every
// decoder behaviour is a line of the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Slot < 0 {
		return nil, fmt.Errorf("%w: slot %d is negative", ErrConfig, cfg.Slot)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	}
	var opts []decoder.Option
	if cfg.APIKeyFile != "" {
		opts = append(opts, decoder.WithAPIKeyFile(cfg.APIKeyFile))
	}
	dc, err := decoder.New(cfg.DecoderURL, cfg.HTTP, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	p := &prober{cfg: cfg, dc: dc, rep: &Report{DecoderURL: dc.BaseURL(), Slot: cfg.Slot}}
	p.run(ctx)
	p.rep.OK = !p.rep.Failed()
	return p.rep, nil
}

type prober struct {
	cfg Config
	dc  *decoder.Client
	rep *Report
}

func (p *prober) add(name string, st Status, format string, a ...any) {
	p.rep.Checks = append(p.rep.Checks, Check{Name: name, Status: st, Detail: fmt.Sprintf(format, a...)})
}

func (p *prober) skip(why string, names ...string) {
	for _, n := range names {
		p.add(n, Skip, "%s", why)
	}
}

// ctx bounds one step.
func (p *prober) step(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.cfg.Timeout)
}

func (p *prober) run(ctx context.Context) {
	all := []string{CheckProps, CheckSlotActions, CheckIDSlot, CheckRestore, CheckShare, CheckNoShareID, CheckOlder, CheckAdopt, CheckReused, CheckRecurrent}
	sctx, cancel := p.step(ctx)
	err := p.dc.Health(sctx)
	cancel()
	if err != nil {
		p.add(CheckHealth, Fail, "%v", err)
		p.skip("the decoder is not healthy", all...)
		return
	}
	p.add(CheckHealth, Pass, "200")

	sctx, cancel = p.step(ctx)
	props, err := p.dc.Props(sctx)
	cancel()
	switch {
	case err != nil:
		p.add(CheckProps, Fail, "%v", err)
		p.skip("no /props", all[1:]...)
		return
	case props.TotalSlots < 1:
		p.add(CheckProps, Fail, "no total_slots in /props")
		p.skip("no slot count", all[1:]...)
		return
	case p.cfg.Slot >= props.TotalSlots:
		p.add(CheckProps, Fail, "slot %d but total_slots %d (llama-server would wrap the id onto another slot)", p.cfg.Slot, props.TotalSlots)
		p.skip("the slot does not exist", all[1:]...)
		return
	}
	p.add(CheckProps, Pass, "total_slots %d, n_ctx %d, model %s", props.TotalSlots, props.Default.NCtx, filepath.Base(props.ModelPath))

	// Whatever happens next, leave the slot empty.
	defer func() {
		ectx, cancel := p.step(context.WithoutCancel(ctx))
		_ = p.dc.Erase(ectx, p.cfg.Slot)
		cancel()
		if p.cfg.SlotDir != "" {
			_ = os.Remove(filepath.Join(p.cfg.SlotDir, ProbeFile))
		}
	}()

	toks, ok := p.slotChecks(ctx)
	if !ok {
		p.skip("slot actions are needed", CheckShare, CheckNoShareID, CheckOlder, CheckAdopt, CheckReused, CheckRecurrent)
		return
	}
	p.shareChecks(ctx, toks)
}

// slotChecks runs the slot action, id_slot and restore checks and returns
// the probe prompt.
func (p *prober) slotChecks(ctx context.Context) ([]int, bool) {
	slot := p.cfg.Slot
	sctx, cancel := p.step(ctx)
	defer cancel()
	toks, err := p.dc.Tokenize(sctx, probeText)
	if err != nil || len(toks) < 2 {
		p.add(CheckSlotActions, Fail, "tokenize %q: %d tokens, %v", probeText, len(toks), err)
		p.skip("no prompt", CheckIDSlot, CheckRestore)
		return nil, false
	}
	toks = toks[:2]
	if err := p.dc.Erase(sctx, slot); err != nil {
		if decoder.IsStatus(err, http.StatusNotImplemented) {
			p.add(CheckSlotActions, Fail, "slot actions disabled: start the decoder with --slot-save-path (%v)", err)
		} else {
			p.add(CheckSlotActions, Fail, "erase: %v", err)
		}
		p.skip("slot actions are needed", CheckIDSlot, CheckRestore)
		return nil, false
	}
	comp, err := p.complete(sctx, toks, 0)
	if err != nil {
		p.add(CheckSlotActions, Fail, "completion with n_predict 0 and id_slot %d: %v", slot, err)
		p.skip("the prompt could not be evaluated", CheckIDSlot, CheckRestore)
		return nil, false
	}
	save, err := p.save(sctx)
	if err != nil {
		p.add(CheckSlotActions, Fail, "save: %v", err)
		p.skip("save is needed", CheckIDSlot, CheckRestore)
		return nil, false
	}
	p.add(CheckSlotActions, Pass, "saved %d tokens (%d bytes) to %s", save.NSaved, save.NWritten, ProbeFile)

	switch {
	case comp.IDSlot != nil && *comp.IDSlot != slot:
		p.add(CheckIDSlot, Fail, "the completion ran in slot %d, not %d", *comp.IDSlot, slot)
	case save.NSaved != len(toks):
		p.add(CheckIDSlot, Fail, "slot %d holds %d tokens after a %d-token prompt sent to it", slot, save.NSaved, len(toks))
	default:
		p.add(CheckIDSlot, Pass, "slot %d holds the %d-token prompt", slot, len(toks))
	}

	if err := p.dc.Erase(sctx, slot); err != nil {
		p.add(CheckRestore, Fail, "erase: %v", err)
		return toks, true
	}
	rr, err := p.dc.Restore(sctx, slot, ProbeFile)
	if err != nil {
		p.add(CheckRestore, Fail, "restore: %v", err)
		return toks, true
	}
	comp, err = p.complete(sctx, toks, 1)
	switch {
	case err != nil:
		p.add(CheckRestore, Fail, "completion after restore: %v", err)
	case comp.Timings.PromptN != 1:
		p.add(CheckRestore, Fail, "restored %d tokens, then prompt_n %d (cache_n %d), want 1", rr.NRestored, comp.Timings.PromptN, comp.Timings.CacheN)
	default:
		p.add(CheckRestore, Pass, "restored %d tokens, prompt_n 1, cache_n %d", rr.NRestored, comp.Timings.CacheN)
	}
	return toks, true
}

type completion struct {
	IDSlot  *int `json:"id_slot"`
	Timings struct {
		PromptN int `json:"prompt_n"`
		CacheN  int `json:"cache_n"`
	} `json:"timings"`
}

func (p *prober) complete(ctx context.Context, toks []int, nPredict int) (completion, error) {
	var c completion
	body := map[string]any{"prompt": toks, "n_predict": nPredict, "cache_prompt": true, "id_slot": p.cfg.Slot}
	err := p.post(ctx, "completion", "/completion", body, &c)
	return c, err
}

type saveReply struct {
	NSaved   int   `json:"n_saved"`
	NWritten int64 `json:"n_written"`
}

func (p *prober) save(ctx context.Context) (saveReply, error) {
	var s saveReply
	err := p.post(ctx, "save", fmt.Sprintf("/slots/%d?action=save", p.cfg.Slot), map[string]any{"filename": ProbeFile}, &s)
	return s, err
}

// post sends a JSON body; a non-2xx answer is a *decoder.APIError.
func (p *prober) post(ctx context.Context, op, path string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.dc.BaseURL()+path, strings.NewReader(string(b)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.dc.HTTP().Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s: read the reply: %w", op, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &decoder.APIError{Op: op, Status: resp.StatusCode}
		var shape struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if json.Unmarshal(raw, &shape) == nil {
			e.Type, e.Message = shape.Error.Type, shape.Error.Message
		}
		return e
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s: malformed reply: %w", op, err)
	}
	return nil
}
