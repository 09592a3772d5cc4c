// Package watch shows handoff events from NATS in a terminal (`onebitd
// watch`). On a terminal it keeps a live Table (one row per request, updated
// in place; see Table). Piped, it prints one line per event:
//
//	15:04:05.000 node-a 9f3c… shared prefilled→adopted share_id=7 n_tokens=512 n_fds=56 elapsed=1.234ms
//
// time (the watcher's local time), node, request id, route, from→to, then
// the attributes that matter when present: share_id, n_tokens, n_fds,
// step, reason, http_status, provider_exit, elapsed. On a terminal the
// transition is coloured by where it lands: green adopted/restored/done, red
// fallback/failed, yellow anything in between. Every string that came off
// the wire is printed quoted if it holds anything but printable non-space
// characters, so a payload cannot move the cursor or forge a line.
//
// Filters (Printer): --node, --route, --failed; --json prints each payload
// as it came.
package watch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
)

// Errors.
var (
	// ErrPayload: a message is not a handoff event.
	ErrPayload = errors.New("watch: message is not an event")
)

// Subjects.
const (
	// SubjectAll is every event onebitd publishes.
	SubjectAll = "onebit.>"
	// SubjectFallback is the fallbacks of every node.
	SubjectFallback = "onebit.*.handoff.fallback"
)

// subscribeTimeout bounds the round trip that confirms the subscription.
const subscribeTimeout = 10 * time.Second

// TimeLayout is the time column.
const TimeLayout = "15:04:05.000"

const (
	ansiGreen  = "\x1b[32m"
	ansiRed    = "\x1b[31m"
	ansiYellow = "\x1b[33m"
	ansiReset  = "\x1b[0m"
)

// Failed reports whether e belongs in `watch --failed`: a fallback, a
// request that failed, or any event that carries a reason.
func Failed(e *event.Event) bool {
	return e.To == "fallback" || e.To == "failed" || e.Reason != ""
}

// colourOf is the ANSI colour of a transition into state to.
func colourOf(to string) string {
	switch to {
	case "adopted", "restored", "done":
		return ansiGreen
	case "fallback", "failed":
		return ansiRed
	}
	return ansiYellow
}

// AppendLine appends e's line (with a trailing newline) to dst. The time is
// shown in loc (nil: UTC).
func AppendLine(dst []byte, e *event.Event, colour bool, loc *time.Location) []byte {
	if loc == nil {
		loc = time.UTC
	}
	dst = e.Time.In(loc).AppendFormat(dst, TimeLayout)
	dst = append(dst, ' ')
	dst = appendWord(dst, e.Node)
	dst = append(dst, ' ')
	if e.RequestID == "" && e.To == "" {
		// Not a request transition (decoder lifecycle): show its name.
		dst = append(dst, '-', ' ')
		if colour {
			dst = append(dst, ansiYellow...)
		}
		dst = appendWord(dst, e.Event)
		if colour {
			dst = append(dst, ansiReset...)
		}
		return appendAttrs(dst, e)
	}
	dst = appendWord(dst, e.RequestID)
	dst = append(dst, ' ')
	dst = appendWord(dst, e.Route)
	dst = append(dst, ' ')
	if colour {
		dst = append(dst, colourOf(e.To)...)
	}
	dst = appendWord(dst, e.From)
	dst = append(dst, "→"...)
	dst = appendWord(dst, e.To)
	if colour {
		dst = append(dst, ansiReset...)
	}
	return appendAttrs(dst, e)
}

func appendAttrs(dst []byte, e *event.Event) []byte {
	if e.Decision != "" { // the event leaving received: --handoff's decision
		dst = append(dst, " decision="...)
		dst = appendWord(dst, e.Decision)
		if e.DecisionBasis != "" {
			dst = append(dst, '(')
			dst = appendWord(dst, e.DecisionBasis)
			dst = append(dst, ')')
		}
		if e.PredictedDecoder != 0 || e.PredictedHandoff != 0 {
			dst = append(dst, " predicted_decoder_ms="...)
			dst = strconv.AppendFloat(dst, float64(e.PredictedDecoder)/1000, 'f', 1, 64)
			dst = append(dst, " predicted_handoff_ms="...)
			dst = strconv.AppendFloat(dst, float64(e.PredictedHandoff)/1000, 'f', 1, 64)
		}
		dst = append(dst, " held="...)
		dst = strconv.AppendInt(dst, int64(e.TokensHeld), 10)
		dst = append(dst, " prefill="...)
		dst = strconv.AppendInt(dst, int64(e.TokensPrefill), 10)
	}
	if e.ShareID != nil {
		dst = append(dst, " share_id="...)
		dst = strconv.AppendInt(dst, *e.ShareID, 10)
	}
	if e.NTokens != 0 {
		dst = append(dst, " n_tokens="...)
		dst = strconv.AppendInt(dst, int64(e.NTokens), 10)
	}
	if e.NFDs != 0 {
		dst = append(dst, " n_fds="...)
		dst = strconv.AppendInt(dst, int64(e.NFDs), 10)
	}
	if e.Step != "" {
		dst = append(dst, " step="...)
		dst = appendWord(dst, e.Step)
	}
	if e.Reason != "" {
		dst = append(dst, " reason="...)
		dst = strconv.AppendQuote(dst, e.Reason)
	}
	if e.HTTPStatus != 0 {
		dst = append(dst, " http_status="...)
		dst = strconv.AppendInt(dst, int64(e.HTTPStatus), 10)
	}
	if e.ProviderExit != nil {
		dst = append(dst, " provider_exit="...)
		dst = strconv.AppendInt(dst, int64(*e.ProviderExit), 10)
	}
	if e.RequestID != "" || e.ElapsedUS != 0 {
		dst = append(dst, " elapsed="...)
		dst = append(dst, (time.Duration(e.ElapsedUS) * time.Microsecond).String()...)
	}
	return append(dst, '\n')
}

// appendWord appends s as is when it is printable and has no space or
// quote, quoted otherwise; "-" for the empty string.
func appendWord(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, '-')
	}
	for _, r := range s {
		if r == utf8.RuneError || r == '"' || r == '\\' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return strconv.AppendQuote(dst, s)
		}
	}
	return append(dst, s...)
}

// Printer writes one line per event message, or keeps a live Table.
type Printer struct {
	W      io.Writer
	Colour bool           // ANSI colours (a terminal)
	JSON   bool           // print the raw payload instead of a line
	Failed bool           // only events for which Failed is true
	Loc    *time.Location // time column zone; nil: UTC
	Node   string         // only events of this node ("": all)
	// Route: only events whose route is Route ("": all); a request that
	// falls back carries route "fallback" from its fallback on. In a Table,
	// a request's row keeps updating once it is shown. Decoder and provider
	// lifecycle events have no route and are left out.
	Route string
	// Table, if set, is redrawn in place (at most every RedrawEvery, see
	// Flush) instead of printing lines; JSON wins over it.
	Table *Table

	buf   []byte
	dirty bool
	drawn time.Time
}

// RedrawEvery is how often a Table is redrawn at most.
const RedrawEvery = 100 * time.Millisecond

// Match reports whether e passes the Node, Route and Failed filters.
func (p *Printer) Match(e *event.Event) bool {
	if p.Node != "" && e.Node != p.Node {
		return false
	}
	if p.Route != "" && e.Route != p.Route && (p.Table == nil || p.JSON || e.RequestID == "" || !p.Table.has(e)) {
		return false
	}
	return !p.Failed || Failed(e)
}

// Flush redraws the Table if an event changed it since the last draw.
func (p *Printer) Flush() error {
	if p.Table == nil || !p.dirty {
		return nil
	}
	p.dirty = false
	p.drawn = time.Now()
	p.buf = p.Table.Render(p.buf[:0], p.Colour)
	_, err := p.W.Write(p.buf)
	return err
}

// pending is how long until a changed Table is due (ok false: nothing to draw).
func (p *Printer) pending() (time.Time, bool) {
	if p.Table == nil || !p.dirty {
		return time.Time{}, false
	}
	return p.drawn.Add(RedrawEvery), true
}

// Message handles one NATS message. It returns ErrPayload (wrapped with
// the subject) for a payload that is not an event, which is not printed,
// and the writer's error if writing fails.
func (p *Printer) Message(subject string, data []byte) error {
	if strings.HasSuffix(subject, lostSuffix) {
		return p.loss(subject, data)
	}
	e, err := event.Parse(data)
	if err != nil {
		return fmt.Errorf("%w (subject %s): %w", ErrPayload, strconv.Quote(subject), err)
	}
	if !p.Match(&e) {
		return nil
	}
	if p.Table != nil && !p.JSON {
		p.Table.Add(&e)
		p.dirty = true
		if time.Since(p.drawn) >= RedrawEvery {
			return p.Flush()
		}
		return nil
	}
	if p.JSON {
		p.buf = append(append(p.buf[:0], data...), '\n')
	} else {
		p.buf = AppendLine(p.buf[:0], &e, p.Colour, p.Loc)
	}
	_, err = p.W.Write(p.buf)
	return err
}

// lostSuffix ends the subject of an event log's loss report.
const lostSuffix = ".eventlog.lost"

// loss shows an event log's loss report (an eventlog.Loss, published by the
// daemon on onebit.<node>.eventlog.lost): a line, or a lifecycle line of the
// table, at the watcher's time (the report carries none).
func (p *Printer) loss(subject string, data []byte) error {
	var l eventlog.Loss
	if err := json.Unmarshal(data, &l); err != nil || l.Node == "" {
		if err == nil {
			err = errors.New("no node")
		}
		return fmt.Errorf("%w (subject %s): loss report: %w", ErrPayload, strconv.Quote(subject), err)
	}
	reason := strconv.FormatUint(l.Total, 10) + " events lost"
	if l.Error != "" {
		reason += ": " + l.Error
	}
	if l.Recovered {
		reason += " (the log writes again)"
	}
	e := event.Event{Time: time.Now(), Node: l.Node, Boot: l.Boot, Event: "eventlog.lost", Reason: reason}
	if !p.Match(&e) {
		return nil
	}
	switch {
	case p.JSON:
		p.buf = append(append(p.buf[:0], data...), '\n')
	case p.Table != nil:
		p.Table.Add(&e)
		p.dirty = true
		return p.Flush()
	default:
		loc := p.Loc
		if loc == nil {
			loc = time.UTC
		}
		b := e.Time.In(loc).AppendFormat(p.buf[:0], TimeLayout)
		b = append(b, ' ')
		b = appendWord(b, l.Node)
		b = append(b, " - "...)
		if p.Colour {
			b = append(b, ansiRed...)
		}
		b = append(b, "eventlog.lost"...)
		if p.Colour {
			b = append(b, ansiReset...)
		}
		b = append(b, " events="...)
		b = strconv.AppendUint(b, l.Events, 10)
		b = append(b, " seq="...)
		b = strconv.AppendUint(b, l.FirstSeq, 10)
		b = append(b, ".."...)
		b = strconv.AppendUint(b, l.LastSeq, 10)
		b = append(b, " total="...)
		b = strconv.AppendUint(b, l.Total, 10)
		if l.Error != "" {
			b = append(b, " error="...)
			b = strconv.AppendQuote(b, l.Error)
		}
		if l.Recovered {
			b = append(b, " recovered"...)
		}
		p.buf = append(b, '\n')
	}
	_, err := p.W.Write(p.buf)
	return err
}

// Ready is called by Run once the subscription is in place on the server.
type Ready func(subject string)

// Run subscribes nc to subject and hands every message to p until ctx is
// done (then it returns nil) or the connection is closed. A payload that is
// not an event is reported on errw and skipped.
func Run(ctx context.Context, nc *nats.Conn, subject string, p *Printer, errw io.Writer, ready Ready) error {
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		return fmt.Errorf("watch: subscribe %s: %w", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	fctx, cancel := context.WithTimeout(ctx, subscribeTimeout)
	err = nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("watch: subscribe %s: %w", subject, err)
	}
	if ready != nil {
		ready(subject)
	}
	for {
		wait, cancel := ctx, context.CancelFunc(func() {})
		if due, ok := p.pending(); ok {
			wait, cancel = context.WithDeadline(ctx, due)
		}
		m, err := sub.NextMsgWithContext(wait)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				if err := p.Flush(); err != nil {
					return fmt.Errorf("watch: write: %w", err)
				}
				return nil
			}
			if errors.Is(err, context.DeadlineExceeded) {
				if err := p.Flush(); err != nil {
					return fmt.Errorf("watch: write: %w", err)
				}
				continue
			}
			return fmt.Errorf("watch: %s: %w", subject, err)
		}
		if err := p.Message(m.Subject, m.Data); err != nil {
			if !errors.Is(err, ErrPayload) {
				return fmt.Errorf("watch: write: %w", err)
			}
			fmt.Fprintf(errw, "onebitd watch: %v\n", err)
		}
	}
}
