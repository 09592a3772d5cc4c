package bus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onebitd/onebitd/event"
)

// setupJetStream creates the async publisher and creates or binds the
// stream. On the embedded server a failure fails Open; on an external server
// that is unreachable the stream is set up in the background once it is
// reachable, and events are published on core NATS (live subscribers only)
// until then. An embedded server in a cluster is treated like an external
// one: the stream needs the other nodes (a JetStream leader, replicas).
func (b *Bus) setupJetStream(ctx context.Context) error {
	js, err := jetstream.New(b.nc,
		jetstream.WithPublishAsyncMaxPending(jsMaxPending),
		jetstream.WithPublishAsyncTimeout(jsAckTimeout),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			if m.Header.Get(hdrCatchUp) != "" {
				b.kickCatchUp() // not an emitted event: not a drop; the next pass retries
				return
			}
			b.drop()
			if node, boot, seq, ok := parseMsgID(m.Header.Get(nats.MsgIdHdr)); ok {
				b.markBehind(boot, seq, node)
			}
			b.log.Debug("jetstream publish not acknowledged", logKeyError, err, "subject", m.Subject)
		}),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, ack *jetstream.PubAck) {
			b.onAck(m)
			switch {
			case ack.Duplicate:
				b.duplicates.Add(1)
			case m.Header.Get(hdrCatchUp) != "" && !b.ofThisBoot(m):
				b.republished.Add(1)
			default:
				b.published.Add(1)
			}
		}),
	)
	if err != nil {
		return fmt.Errorf("bus: jetstream: %w", err)
	}
	b.js = js
	if b.srv != nil && b.cfg.ClusterName == "" {
		sctx, cancel := context.WithTimeout(ctx, setupTimeout)
		defer cancel()
		if err := b.ensureStream(sctx); err != nil {
			return err
		}
		b.streamReady.Store(true)
		return nil
	}
	if b.nc.IsConnected() {
		sctx, cancel := context.WithTimeout(ctx, setupTimeout)
		err := b.ensureStream(sctx)
		cancel()
		if err == nil {
			b.streamReady.Store(true)
		} else {
			b.log.Warn("jetstream stream setup failed, retrying in the background", logKeyStream, StreamName, logKeyError, err)
		}
	}
	b.wg.Add(1)
	go b.keepStream()
	return nil
}

// keepStream runs for an external server or an embedded cluster: it sets the stream up once the
// server can (with backoff), and checks it again after every reconnect, so
// that a server that came back without the stream gets it back. Until the
// stream is ready, events go out on core NATS.
func (b *Bus) keepStream() {
	defer b.wg.Done()
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(reconnectMin),
		backoff.WithMaxInterval(reconnectMax),
		backoff.WithMaxElapsedTime(0))
	t := time.NewTimer(0)
	defer t.Stop()
	if b.streamReady.Load() {
		<-t.C // idle until a reconnect
	}
	for {
		select {
		case <-b.done:
			return
		case <-b.streamCheck:
			bo.Reset()
		case <-t.C:
		}
		if !b.nc.IsConnected() {
			t.Reset(bo.NextBackOff())
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		err := b.ensureStream(ctx)
		cancel()
		if err != nil {
			b.log.Debug("jetstream stream setup failed", logKeyStream, StreamName, logKeyError, err)
			t.Reset(bo.NextBackOff())
			continue
		}
		if !b.streamReady.Swap(true) {
			b.log.Info("jetstream stream ready", logKeyStream, StreamName)
			b.kickCatchUp()
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

// ensureStream binds the stream ONEBIT if it exists, updating the limits
// the configuration sets (Stream*) where they differ and leaving the rest
// to whoever made it, or creates it on "onebit.>" with file storage and
// those limits.
func (b *Bus) ensureStream(ctx context.Context) error {
	s, err := b.js.Stream(ctx, StreamName)
	if err == nil {
		cur := s.CachedInfo().Config
		if !slices.Contains(cur.Subjects, StreamSubjects) {
			b.log.Warn("jetstream stream exists without onebit.>: some events will not be stored",
				logKeyStream, StreamName, "subjects", cur.Subjects)
		}
		if want, changed := b.streamLimits(cur); changed {
			if _, err := b.js.UpdateStream(ctx, want); err != nil {
				return fmt.Errorf("bus: update stream %s to replicas %d, max age %v, max bytes %d: %w",
					StreamName, want.Replicas, want.MaxAge, want.MaxBytes, err)
			}
			b.log.Info("jetstream stream limits updated", logKeyStream, StreamName,
				"replicas", want.Replicas, "max_age", want.MaxAge, "max_bytes", want.MaxBytes)
		}
		return b.waitLeader(ctx, s)
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("bus: look up stream %s: %w", StreamName, err)
	}
	cfg, _ := b.streamLimits(jetstream.StreamConfig{
		Name:        StreamName,
		Description: "onebitd handoff events",
		Subjects:    []string{StreamSubjects},
		Storage:     jetstream.FileStorage,
	})
	s, err = b.js.CreateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		s, err = b.js.Stream(ctx, StreamName)
	}
	if err != nil {
		return fmt.Errorf("bus: create stream %s on %s (replicas %d): %w", StreamName, StreamSubjects, cfg.Replicas, err)
	}
	return b.waitLeader(ctx, s)
}

// leaderPoll is the wait between two looks at a replicated stream that has
// no leader yet.
const leaderPoll = 50 * time.Millisecond

// waitLeader waits until a replicated stream has a leader: publishing
// before would have some publishes refused and later ones stored, out of
// order.
func (b *Bus) waitLeader(ctx context.Context, s jetstream.Stream) error {
	for {
		info, err := s.Info(ctx)
		if err != nil {
			return fmt.Errorf("bus: stream %s info: %w", StreamName, err)
		}
		if info.Cluster == nil || info.Cluster.Leader != "" {
			return nil
		}
		t := time.NewTimer(leaderPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("bus: stream %s has no leader: %w", StreamName, ctx.Err())
		case <-t.C:
		}
	}
}

// streamLimits applies the configured Stream* limits to c and reports
// whether that changed it.
func (b *Bus) streamLimits(c jetstream.StreamConfig) (jetstream.StreamConfig, bool) {
	changed := false
	if r := b.cfg.StreamReplicas; r > 0 && c.Replicas != r {
		c.Replicas, changed = r, true
	}
	if a := b.cfg.StreamMaxAge; a > 0 && c.MaxAge != a {
		c.MaxAge, changed = a, true
	}
	if n := b.cfg.StreamMaxBytes; n > 0 && c.MaxBytes != n {
		c.MaxBytes, changed = n, true
	}
	return c, changed
}

// streamFetchBatch and streamFetchWait bound one pull of StreamEvents; a
// pull refused for a passing reason (a server of the cluster restarting)
// is tried again streamFetchRetries times, streamRetryWait apart.
const (
	streamFetchBatch   = 512
	streamFetchWait    = 5 * time.Second
	streamFetchRetries = 10
	streamRetryWait    = 200 * time.Millisecond
)

// transientFetch: a pull that may work when tried again.
func transientFetch(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, nats.ErrConnectionReconnecting)
}

// pauseCtx waits d unless ctx ends first.
func pauseCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// StreamEvents reads stream from its first message to the last one present
// when it is called (an ordered consumer, nothing acknowledged or left
// behind on the server), decoding each payload as an event and yielding
// each boot's events in seq order (inSeqOrder). It connects as
// c says (the reader identity is enough). A payload that is not an event
// yields a non-nil error naming its stream sequence, and iteration goes on
// if the consumer wants; a connection or consumer error ends it.
func StreamEvents(ctx context.Context, c Client, stream string) func(yield func(event.Event, error) bool) {
	return StreamEventsOf(ctx, c, stream, "")
}

// NodeSubjects are the subjects of node's events: what StreamEventsOf and
// a dashboard filter on to see one node.
func NodeSubjects(node string) string { return SubjectPrefix + "." + Token(node) + ".>" }

// StreamEventsOf is StreamEvents limited to the events of node (its
// subjects, NodeSubjects; "" ⇒ every node): the server filters, so the
// other nodes' events are not sent.
func StreamEventsOf(ctx context.Context, c Client, stream, node string) func(yield func(event.Event, error) bool) {
	return inSeqOrder(streamEventsRaw(ctx, c, stream, node))
}

// reorderMax bounds the events inSeqOrder holds back.
const reorderMax = 1 << 16

// inSeqOrder yields every boot's events in seq order although the stream
// may store a few out of order: after a failure (a server of the cluster
// dying with acknowledgements pending, a link cut with bytes in flight)
// the bus republishes from the log what the stream did not acknowledge,
// while some later publishes had already been stored. An event ahead of
// its boot's next seq is held until the seqs before it arrive, at the
// end, or when reorderMax events are held (then its boot is released in
// seq order: the stream lacks the seqs in between). Events without a seq
// and errors pass at once.
func inSeqOrder(raw func(yield func(event.Event, error) bool)) func(yield func(event.Event, error) bool) {
	type bootKey struct{ node, boot string }
	return func(yield func(event.Event, error) bool) {
		next := map[bootKey]uint64{}
		held := map[bootKey]map[uint64]event.Event{}
		var order []bootKey // boots with held events, first held first
		nHeld := 0
		drain := func(k bootKey) bool { // release what follows next[k]
			h := held[k]
			for {
				e, ok := h[next[k]]
				if !ok {
					return true
				}
				delete(h, next[k])
				nHeld--
				next[k]++
				if !yield(e, nil) {
					return false
				}
			}
		}
		release := func(k bootKey) bool { // everything held, in seq order
			h := held[k]
			seqs := make([]uint64, 0, len(h))
			for s := range h {
				seqs = append(seqs, s)
			}
			slices.Sort(seqs)
			for _, s := range seqs {
				e := h[s]
				delete(h, s)
				nHeld--
				next[k] = s + 1
				if !yield(e, nil) {
					return false
				}
			}
			return true
		}
		for e, err := range raw {
			if err != nil || e.Seq == 0 {
				if !yield(e, err) {
					return
				}
				continue
			}
			k := bootKey{e.Node, e.Boot}
			n, seen := next[k]
			switch {
			case !seen || e.Seq == n:
				next[k] = e.Seq + 1
				if !yield(e, nil) || !drain(k) {
					return
				}
			case e.Seq < n: // already passed: as it comes (the audit says why)
				if !yield(e, nil) {
					return
				}
			default:
				if held[k] == nil {
					held[k] = map[uint64]event.Event{}
					order = append(order, k)
				}
				if _, dup := held[k][e.Seq]; !dup {
					nHeld++
				}
				held[k][e.Seq] = e
				if nHeld > reorderMax && !release(k) {
					return
				}
			}
		}
		for _, k := range order {
			if !release(k) {
				return
			}
		}
	}
}

func streamEventsRaw(ctx context.Context, c Client, stream, node string) func(yield func(event.Event, error) bool) {
	var filter []string
	if node != "" {
		filter = []string{NodeSubjects(node)}
	}
	return func(yield func(event.Event, error) bool) {
		if c.Name == "" {
			c.Name = "onebitd replay"
		}
		urls := cmp.Or(c.URLs, DefaultURL)
		nc, err := c.Connect()
		if err != nil {
			yield(event.Event{}, err)
			return
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			yield(event.Event{}, fmt.Errorf("bus: jetstream: %w", err))
			return
		}
		s, err := js.Stream(ctx, stream)
		if err != nil {
			yield(event.Event{}, fmt.Errorf("bus: stream %s on %s: %w", stream, redactURLs(urls), err))
			return
		}
		last := s.CachedInfo().State.LastSeq
		if s.CachedInfo().State.Msgs == 0 {
			return
		}
		if filter != nil {
			info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter[0]))
			if err != nil {
				yield(event.Event{}, fmt.Errorf("bus: stream %s on %s: %w", stream, redactURLs(urls), err))
				return
			}
			if len(info.State.Subjects) == 0 {
				return // no event of that node
			}
		}
		cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: filter,
			DeliverPolicy:  jetstream.DeliverAllPolicy,
		})
		if err != nil {
			yield(event.Event{}, fmt.Errorf("bus: ordered consumer on %s: %w", stream, err))
			return
		}
		retries := 0
		for {
			bctx, cancel := context.WithTimeout(ctx, streamFetchWait)
			batch, err := cons.Fetch(streamFetchBatch, jetstream.FetchContext(bctx))
			if err != nil {
				cancel()
				if transientFetch(err) && retries < streamFetchRetries && pauseCtx(ctx, streamRetryWait) == nil {
					retries++
					continue
				}
				yield(event.Event{}, fmt.Errorf("bus: fetch from %s: %w", stream, err))
				return
			}
			n := 0
			for m := range batch.Messages() {
				n++
				meta, err := m.Metadata()
				if err != nil {
					cancel()
					yield(event.Event{}, fmt.Errorf("bus: message metadata from %s: %w", stream, err))
					return
				}
				e, err := event.Parse(m.Data())
				if err != nil {
					err = fmt.Errorf("%w: %s message %d on %s: %w", ErrNotAnEvent, stream, meta.Sequence.Stream, m.Subject(), err)
					if !yield(event.Event{}, err) {
						cancel()
						return
					}
				} else if !yield(e, nil) {
					cancel()
					return
				}
				// Up to the stream's last message when called; filtered,
				// up to the last one of the node then (none pending).
				if meta.Sequence.Stream >= last || meta.NumPending == 0 {
					cancel()
					return
				}
			}
			err = batch.Error()
			cancel()
			if ctx.Err() != nil {
				yield(event.Event{}, fmt.Errorf("bus: read %s: %w", stream, ctx.Err()))
				return
			}
			if n == 0 && transientFetch(err) && retries < streamFetchRetries && pauseCtx(ctx, streamRetryWait) == nil {
				retries++ // the consumer's server is gone or not caught up: the ordered consumer resets
				continue
			}
			if n > 0 {
				retries = 0
			}
			if n == 0 {
				// Messages up to last were removed (limits, purge) while
				// reading: what was there has been read.
				if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
					yield(event.Event{}, fmt.Errorf("bus: fetch from %s: %w", stream, err))
				}
				return
			}
		}
	}
}
