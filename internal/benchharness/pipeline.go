package benchharness

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/eventlog"
	"github.com/onebitd/onebitd/machine"
)

// Event pipeline workloads.
const (
	ReplayEvents = 1_000_000
	RSSRequests  = 10_000
	rssConc      = 8
	// replayRuns: 6 is the fewest that give the median a 95 % confidence
	// interval (benchmath).
	replayRuns = 6
	// walkTransitions is a shared-route request's transitions: listen,
	// share, prefill, adopt, forward, finish.
	walkTransitions = 6
)

// PipelineResult is section c.
type PipelineResult struct {
	// Transition is the cost of one transition (machine + events) per sink
	// configuration, in the order of SinkConfigs.
	Transition []TransitionRow
	// Replay: a generated log of ReplayN events (ReplayEvents × the
	// run's scale), by `onebitd replay`
	// (process, audit included) and by eventlog.Replay in-process.
	ReplayN          int
	ReplayBytes      int64
	ReplayCmd        Summary
	ReplayInProcess  Summary
	ReplayCmdRate    float64 // events/s at the median
	ReplayInProcRate float64
	// RSS of a plain-route onebitd process: idle after start, then every
	// rssEvery requests.
	RSSIdle     int64
	RSSSamples  []RSSSample
	RSSRequests int
}

// TransitionRow is one sink configuration's cost per transition.
type TransitionRow struct {
	Config  string
	PerStep Summary         // per transition, one value per repetition
	Runs    []time.Duration // each repetition's cost per transition
	Dropped uint64
}

// RSSSample is onebitd's VmRSS after Requests requests.
type RSSSample struct {
	Requests int
	RSS      int64
}

// Sink configurations of the transition benchmark.
const (
	SinkNone    = "machine only (no sink)"
	SinkLog     = "event log (batch)"
	SinkLogNATS = "event log + NATS (embedded, 1 subscriber)"
)

// SinkConfigs are the transition benchmark's configurations, in order.
var SinkConfigs = []string{SinkNone, SinkLog, SinkLogNATS}

func runPipeline(ctx context.Context, c *Config, log *slog.Logger) (*PipelineResult, error) {
	res := &PipelineResult{}
	log.Info("pipeline: per-transition cost")
	if err := transitions(ctx, c, res); err != nil {
		return nil, err
	}
	log.Info("pipeline: replay of a generated log", "events", c.count(ReplayEvents))
	if err := replay(ctx, c, res); err != nil {
		return nil, err
	}
	log.Info("pipeline: onebitd RSS", "requests", RSSRequests)
	if err := rss(ctx, c, res); err != nil {
		return nil, err
	}
	return res, nil
}

// sinkSet is one configuration's event pipeline.
type sinkSet struct {
	name  string
	sink  event.Sink
	stats func() uint64 // events dropped
	close func()
}

func openSinks(ctx context.Context, dir, name string) (*sinkSet, error) {
	s := &sinkSet{name: name, stats: func() uint64 { return 0 }, close: func() {}}
	if name == SinkNone {
		return s, nil
	}
	w, _, err := eventlog.Open(filepath.Join(dir, "transitions-"+strconv.Itoa(len(name))+".jsonl"), eventlog.SyncBatch, nil)
	if err != nil {
		return nil, err
	}
	sinks := []event.Sink{w}
	closers := []func(){func() { _ = w.Close() }}
	dropped := []func() uint64{func() uint64 { return w.Stats().Dropped }}
	if name == SinkLogNATS {
		b, err := bus.Open(ctx, bus.Config{Listen: bus.ListenOff, Node: "bench"})
		if err != nil {
			_ = w.Close()
			return nil, err
		}
		nc, err := b.InProcessConn()
		if err != nil {
			_ = b.Close()
			_ = w.Close()
			return nil, err
		}
		var got atomic.Int64
		if _, err := nc.Subscribe(bus.StreamSubjects, func(*nats.Msg) { got.Add(1) }); err != nil {
			nc.Close()
			_ = b.Close()
			_ = w.Close()
			return nil, err
		}
		sinks = append(sinks, b)
		closers = append(closers, func() { _ = b.Close() }, nc.Close)
		dropped = append(dropped, func() uint64 { return b.Stats().Dropped })
	}
	s.sink = event.NewRecorder("bench", sinks...)
	s.close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	s.stats = func() uint64 {
		var n uint64
		for _, f := range dropped {
			n += f()
		}
		return n
	}
	return s, nil
}

// walk drives one shared-route request through its six transitions.
func walk(id string, sink event.Sink, shareID int64) {
	m := machine.New(id, int(shareID%4), machine.RouteShared, sink, nil)
	sid := shareID
	_ = m.Fire(machine.EvListen, machine.Attrs{})
	_ = m.Fire(machine.EvShare, machine.Attrs{ShareID: &sid, NFDs: 3, BytesMapped: 2348810240})
	_ = m.Fire(machine.EvPrefill, machine.Attrs{NTokens: 251})
	_ = m.Fire(machine.EvAdopt, machine.Attrs{ShareID: &sid, NTokens: 251, Cleanup: &event.Cleanup{FDsClosed: 3, FilesRemoved: 3}})
	_ = m.Fire(machine.EvForward, machine.Attrs{})
	_ = m.Fire(machine.EvFinish, machine.Attrs{HTTPStatus: 200})
}

func transitions(ctx context.Context, c *Config, res *PipelineResult) error {
	var sets []*sinkSet
	defer func() {
		for _, s := range sets {
			s.close()
		}
	}()
	for _, name := range SinkConfigs {
		s, err := openSinks(ctx, c.WorkDir, name)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		sets = append(sets, s)
	}
	walks := c.count(20_000)
	per := make([][]time.Duration, len(sets))
	var sid int64
	for rep := 0; rep < 7; rep++ { // repetitions interleaved across configurations
		for i, s := range sets {
			if err := ctx.Err(); err != nil {
				return err
			}
			t0 := time.Now()
			for range walks {
				sid++
				walk("r"+strconv.FormatInt(sid, 16), s.sink, sid)
			}
			per[i] = append(per[i], time.Since(t0)/time.Duration(walks*walkTransitions))
		}
	}
	for i, s := range sets {
		res.Transition = append(res.Transition, TransitionRow{Config: s.name, PerStep: Summarize(per[i]), Runs: per[i], Dropped: s.stats()})
	}
	return nil
}

// writeReplayLog writes n events of shared-route requests, made by the
// machine itself, to path.
func writeReplayLog(path string, n int) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	var buf []byte
	written := 0
	rec := event.NewRecorder("bench", event.SinkFunc(func(e *event.Event) {
		if written == n {
			return
		}
		buf = append(e.AppendJSON(buf[:0]), '\n')
		_, _ = bw.Write(buf)
		written++
	}))
	for i := int64(1); written < n; i++ {
		walk("r"+strconv.FormatInt(i, 16), rec, i)
	}
	if err := bw.Flush(); err != nil {
		return 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), f.Close()
}

func replay(ctx context.Context, c *Config, res *PipelineResult) error {
	path := filepath.Join(c.WorkDir, "replay.jsonl")
	n := c.count(ReplayEvents)
	size, err := writeReplayLog(path, n)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	res.ReplayBytes = size
	var cmdT, inT []time.Duration
	for range replayRuns {
		t0 := time.Now()
		cmd := exec.CommandContext(ctx, c.bin("onebitd"), "replay", "--failed", path)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("onebitd replay: %w: %.400s", err, out)
		}
		cmdT = append(cmdT, time.Since(t0))

		t0 = time.Now()
		rep, err := eventlog.Replay(eventlog.Files([]string{path}, nil), eventlog.NewAuditor())
		if err != nil {
			return err
		}
		inT = append(inT, time.Since(t0))
		if !rep.OK() || rep.Events != n {
			return fmt.Errorf("replay audit of the generated log: %d events, %d violations", rep.Events, len(rep.Violations))
		}
	}
	res.ReplayCmd, res.ReplayInProcess = Summarize(cmdT), Summarize(inT)
	res.ReplayN = n
	res.ReplayCmdRate = float64(n) / res.ReplayCmd.Median.Seconds()
	res.ReplayInProcRate = float64(n) / res.ReplayInProcess.Median.Seconds()
	return nil
}

func rss(ctx context.Context, c *Config, res *PipelineResult) error {
	s, err := newPlainStack(ctx, c, "rss", false)
	if err != nil {
		return err
	}
	defer s.close()
	if res.RSSIdle, err = RSS(s.proc.PID()); err != nil {
		return err
	}
	hc := newClient()
	body := completionBody(promptText(ProxyPromptTokens), ProxyNPredict, false)
	total := c.count(RSSRequests)
	every := max(total/10, 1)
	for done := 0; done < total; {
		n := min(every, total-done)
		lat, _, errs, err := load(ctx, hc, s.procURL+"/completion", body, rssConc, 120*time.Second, int64(n))
		if err != nil {
			return err
		}
		done += len(lat) + errs
		r, err := RSS(s.proc.PID())
		if err != nil {
			return err
		}
		res.RSSSamples = append(res.RSSSamples, RSSSample{Requests: done, RSS: r})
	}
	res.RSSRequests = total
	return nil
}
