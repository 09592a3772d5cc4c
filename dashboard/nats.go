package dashboard

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/onebitd/onebitd/eventlog"
)

// lostSuffix ends the subject of an event log's loss report
// (eventlog.Loss, not an event).
const lostSuffix = ".eventlog.lost"

// SubjectAll is every subject onebitd publishes on.
const SubjectAll = "onebit.>"

// Pending limits of the NATS subscription: beyond them nats.go drops
// messages (a slow consumer), which the page shows as nats_dropped.
const (
	pendingMsgs  = 1 << 16
	pendingBytes = 64 << 20
)

// Subscribe feeds the hub with every event published on subject (SubjectAll
// if empty) through nc, until the subscription or the connection is closed.
// It returns once the server confirmed the subscription. Messages that are
// not events are counted, not shown; a loss report of an event log
// (onebit.<node>.eventlog.lost, an eventlog.Loss) is counted for its node.
func (h *Hub) Subscribe(nc *nats.Conn, subject string) (*nats.Subscription, error) {
	if subject == "" {
		subject = SubjectAll
	}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		if strings.HasSuffix(m.Subject, lostSuffix) {
			var l eventlog.Loss
			if err := json.Unmarshal(m.Data, &l); err != nil || l.Node == "" {
				h.mu.Lock()
				h.bad++
				h.version++
				h.mu.Unlock()
				return
			}
			h.NoteEventlogLoss(l.Node, l.Total)
			return
		}
		if err := h.EmitJSON(m.Data); err != nil {
			h.cfg.Logger.Debug("dashboard: not an event", "subject", m.Subject, "error", err)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("dashboard: subscribe %s: %w", subject, err)
	}
	if err := sub.SetPendingLimits(pendingMsgs, pendingBytes); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("dashboard: subscribe %s: %w", subject, err)
	}
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("dashboard: subscribe %s: %w", subject, err)
	}
	h.mu.Lock()
	prev := h.natsDrop
	h.natsDrop = func() uint64 {
		n, _ := sub.Dropped()
		var p uint64
		if prev != nil {
			p = prev()
		}
		return p + uint64(max(n, 0))
	}
	h.mu.Unlock()
	return sub, nil
}
