package benchharness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Results is one harness run.
type Results struct {
	Machine  Machine
	Took     time.Duration
	Handoff  *HandoffResult  // nil when not run
	Proxy    *ProxyResult    // nil when not run
	Pipeline *PipelineResult // nil when not run
	Llama    *LlamaResult    // nil when not run; Skipped without LLAMA_SERVER
	GoBench  []GoBench       // parsed from Config.GoBench
	// GoBenchNote is why some lines of Config.GoBench were skipped ("").
	GoBenchNote string
	// GoBenchBase and GoBenchDelta: Config.GoBenchBase, and each benchmark
	// in it and in Config.GoBench compared (before → after).
	GoBenchBase  string
	GoBenchDelta []GoBenchDelta
}

// Run runs the sections c asks for. Every child process is stopped before it
// returns.
func Run(ctx context.Context, c Config) (*Results, error) {
	if c.Scale <= 0 {
		c.Scale = 1
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	res := &Results{Machine: DescribeMachine()}
	var err error
	if c.GoBench != "" {
		res.GoBench, err = ParseGoBenchFile(c.GoBench)
		switch {
		case errors.Is(err, ErrGoBenchSyntax):
			// benchstat's way: report the bad lines, keep the rest.
			log.Warn("go benchmark output has malformed lines", "file", c.GoBench, "error", err)
			res.GoBenchNote = err.Error()
		case err != nil:
			return nil, err
		}
		if c.GoBenchBase != "" {
			base, err := ParseGoBenchFile(c.GoBenchBase)
			if err != nil && !errors.Is(err, ErrGoBenchSyntax) {
				return nil, err
			}
			res.GoBenchBase, res.GoBenchDelta = c.GoBenchBase, CompareGoBench(base, res.GoBench)
		}
	}
	if c.section("handoff") {
		log.Info("section a: handoff vs prompt length")
		if res.Handoff, err = runHandoff(ctx, &c, log); err != nil {
			return nil, fmt.Errorf("handoff: %w", err)
		}
	}
	if c.section("proxy") {
		log.Info("section b: proxy overhead")
		if res.Proxy, err = runProxy(ctx, &c, log); err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
	}
	if c.section("pipeline") {
		log.Info("section c: event pipeline")
		if res.Pipeline, err = runPipeline(ctx, &c, log); err != nil {
			return nil, fmt.Errorf("pipeline: %w", err)
		}
	}
	if c.section("llama") {
		log.Info("section d: a real llama-server, plain vs file route")
		if res.Llama, err = runLlama(ctx, &c, log); err != nil {
			return nil, fmt.Errorf("llama-server: %w", err)
		}
	}
	res.Took = time.Since(start)
	return res, nil
}
