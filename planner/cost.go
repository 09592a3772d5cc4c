package planner

import (
	"errors"
	"fmt"
	"math"
	"sync"
)

// Mode is --handoff.
type Mode string

// Modes of --handoff.
const (
	// ModeAuto hands over when the model predicts it pays (the default when
	// a provider is configured).
	ModeAuto Mode = "auto"
	// ModeAlways hands over every request (incrementally when the slot
	// holds a confirmed prefix): onebitd's behaviour before issue 13.
	ModeAlways Mode = "always"
	// ModeNever never hands over: every request takes the plain route, with
	// a decision on its first event.
	ModeNever Mode = "never"
)

// ErrMode: --handoff is not auto, always or never.
var ErrMode = errors.New("planner: --handoff must be auto, always or never")

// ParseMode parses --handoff ("" is auto).
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeAuto:
		return ModeAuto, nil
	case ModeAlways, ModeNever:
		return Mode(s), nil
	}
	return "", fmt.Errorf("%w (got %q)", ErrMode, s)
}

// Choice is what a decision does.
type Choice string

// Choices.
const (
	Handoff Choice = "handoff"
	Skip    Choice = "skip"
)

// Bases of a decision: what decided it.
const (
	BasisAlways  = "always"  // --handoff always
	BasisNever   = "never"   // --handoff never
	BasisFloor   = "floor"   // no model yet: --handoff-min-tokens decided
	BasisModel   = "model"   // the cost model's predictions decided
	BasisExplore = "explore" // near the break-even: the other side, to keep the estimates fresh
	BasisHeld    = "held"    // the decoder holds all but the last token: nothing to hand over
)

// Defaults of the model.
const (
	DefaultMinTokens    = 1024 // --handoff-min-tokens (the seed's ONEBIT_PREFILL_MIN_TOKENS)
	DefaultDecay        = 0.95 // weight kept by the older samples at each new one
	DefaultMinSamples   = 3    // samples of each side before the model decides
	DefaultMargin       = 0.10 // the handoff must win by 10 %
	DefaultExploreBand  = 1.5  // predictions within ×1.5 of each other are near the break-even
	DefaultExploreEvery = 8    // one decision in 8 near the break-even explores
)

// Model is the online cost model (doc.go). Its zero value is not ready:
// use NewModel. It is safe for concurrent use.
type Model struct {
	Mode         Mode
	MinTokens    int
	Decay        float64
	MinSamples   int
	Margin       float64
	ExploreBand  float64
	ExploreEvery int

	mu      sync.Mutex
	dec     ratio
	prov    line
	over    map[string]*mean
	nearBEs int // decisions near the break-even so far
}

// NewModel returns a model with the package defaults; minTokens ≤ 0 means
// DefaultMinTokens.
func NewModel(mode Mode, minTokens int) *Model {
	if minTokens <= 0 {
		minTokens = DefaultMinTokens
	}
	if mode == "" {
		mode = ModeAuto
	}
	return &Model{Mode: mode, MinTokens: minTokens, Decay: DefaultDecay, MinSamples: DefaultMinSamples,
		Margin: DefaultMargin, ExploreBand: DefaultExploreBand, ExploreEvery: DefaultExploreEvery,
		over: make(map[string]*mean)}
}

// ratio is a decayed Σy/Σx.
type ratio struct {
	x, y float64
	n    int
}

// line is a decayed least-squares fit y = a + b x.
type line struct {
	w, x, y, xx, xy float64
	n               int
}

// mean is a decayed mean.
type mean struct {
	w, y float64
	n    int
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) && v >= 0 }

// ObserveDecoder records a reply's timings: promptMs to evaluate promptN
// prompt tokens.
func (m *Model) ObserveDecoder(promptN int, promptMs float64) {
	if promptN <= 0 || !finite(promptMs) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.Decay
	m.dec.x = m.dec.x*d + float64(promptN)
	m.dec.y = m.dec.y*d + promptMs
	m.dec.n++
}

// ObserveProvider records a provider run that prefilled tokens in ms.
func (m *Model) ObserveProvider(tokens int, ms float64) {
	if tokens <= 0 || !finite(ms) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	d, x := m.Decay, float64(tokens)
	p := &m.prov
	p.w = p.w*d + 1
	p.x = p.x*d + x
	p.y = p.y*d + ms
	p.xx = p.xx*d + x*x
	p.xy = p.xy*d + x*ms
	p.n++
}

// ObserveHandoff records the handoff's own cost on route (its wall time
// minus the provider's run), in ms.
func (m *Model) ObserveHandoff(route string, ms float64) {
	if !finite(ms) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	o := m.over[route]
	if o == nil {
		o = new(mean)
		m.over[route] = o
	}
	o.w = o.w*m.Decay + 1
	o.y = o.y*m.Decay + ms
	o.n++
}

// Estimates is a snapshot of the model.
type Estimates struct {
	DecoderMsPerToken  float64 // 0 before the first sample
	ProviderFixedMs    float64
	ProviderMsPerToken float64
	HandoffMs          map[string]float64 // per route
	DecoderSamples     int
	ProviderSamples    int
}

// Estimates returns the current estimates.
func (m *Model) Estimates() Estimates {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := Estimates{DecoderSamples: m.dec.n, ProviderSamples: m.prov.n, HandoffMs: make(map[string]float64, len(m.over))}
	if m.dec.x > 0 {
		e.DecoderMsPerToken = m.dec.y / m.dec.x
	}
	e.ProviderFixedMs, e.ProviderMsPerToken = m.prov.fit()
	for r, o := range m.over {
		if o.w > 0 {
			e.HandoffMs[r] = o.y / o.w
		}
	}
	return e
}

// fit is the line's intercept and slope, both ≥ 0. With one distinct x
// (no slope to fit) the line goes through the origin.
func (p *line) fit() (a, b float64) {
	if p.w <= 0 {
		return 0, 0
	}
	den := p.w*p.xx - p.x*p.x
	if den > 1e-9*p.w*p.xx {
		b = (p.w*p.xy - p.x*p.y) / den
		a = (p.y - b*p.x) / p.w
	}
	if den <= 1e-9*p.w*p.xx || a < 0 || b < 0 {
		a = 0
		if p.xx > 0 {
			b = p.xy / p.xx
		}
		if b < 0 {
			b = 0
		}
	}
	return a, b
}

// Decision is what Decide chose and why: the fields of the event that
// leaves received.
type Decision struct {
	Choice        Choice
	Basis         string
	DecoderUS     int64 // predicted decoder prefill of the tokens it does not hold, µs (0: no model yet)
	HandoffUS     int64 // predicted provider + handoff, µs (0: no model yet)
	TokensHeld    int   // prompt tokens the slot holds (a confirmed prefix)
	TokensPrefill int   // tokens the chosen side prefills: n - held when skipped, n - Start when handed over
	Start         int   // the provider's --start when handed over: held on the incremental route, else 0
}

// Decide decides for a prompt of n tokens of which the slot holds held
// (a confirmed prefix, at most n-1 counted). incremental says whether the
// handoff can start at held (the shared route, DESIGN §2b --start); else
// the provider prefills all n tokens (the file route) while the decoder,
// skipping, still reuses its prefix. route names the handoff's overhead
// estimate ("shared" or "file").
func (m *Model) Decide(n, held int, incremental bool, route string) Decision {
	held = min(max(held, 0), max(n-1, 0))
	start := 0
	if incremental {
		start = held
	}
	d := Decision{TokensHeld: held}
	decTokens, provTokens := n-held, n-start
	m.mu.Lock()
	defer m.mu.Unlock()
	ready := m.dec.n >= m.MinSamples && m.prov.n >= m.MinSamples && m.dec.x > 0
	if ready {
		a, b := m.prov.fit()
		over := 0.0
		if o := m.over[route]; o != nil && o.w > 0 {
			over = o.y / o.w
		}
		d.DecoderUS = int64(math.Round(1000 * float64(decTokens) * m.dec.y / m.dec.x))
		d.HandoffUS = int64(math.Round(1000 * (a + b*float64(provTokens) + over)))
	}
	switch {
	case m.Mode == ModeNever:
		d.Choice, d.Basis = Skip, BasisNever
	case m.Mode == ModeAlways:
		d.Choice, d.Basis = Handoff, BasisAlways
	case decTokens <= 1:
		d.Choice, d.Basis = Skip, BasisHeld
	case !ready:
		d.Basis = BasisFloor
		d.Choice = Skip
		if decTokens >= m.MinTokens {
			d.Choice = Handoff
		}
	default:
		d.Basis = BasisModel
		dec, hand := float64(d.DecoderUS), float64(d.HandoffUS)
		d.Choice = Skip
		if hand*(1+m.Margin) < dec {
			d.Choice = Handoff
		}
		if m.ExploreEvery > 0 && hand <= dec*m.ExploreBand && dec <= hand*m.ExploreBand {
			m.nearBEs++
			if m.nearBEs%m.ExploreEvery == 0 {
				d.Basis = BasisExplore
				if d.Choice == Handoff {
					d.Choice = Skip
				} else {
					d.Choice = Handoff
				}
			}
		}
	}
	if d.Choice == Handoff {
		d.Start, d.TokensPrefill = start, provTokens
	} else {
		d.TokensPrefill = decTokens
	}
	return d
}
