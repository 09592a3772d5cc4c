// Command onebit-bench is onebitd's side-by-side performance harness (make
// bench): it starts the decoder simulator, the sim provider and onebitd from
// bin/ as real processes on loopback, measures the handoff against prompt
// length, the proxy overhead and the event pipeline in one run, prints the
// markdown report and writes it (with the plot beside it) to -out. With
// -llama-server and -model (make bench LLAMA_SERVER=… MODEL=…) it adds
// section d: onebitd launching that llama-server, the plain route against
// the file route (a second llama-server as the prefill server), side by side.
//
//	onebit-bench [-out docs/BENCHMARKS.md] [-bin bin] [-gobench bench.out] [-gobench-base old.out]
//	             [-scale 1] [-sections handoff,proxy,pipeline,llama] [-cpuprofile FILE]
//	             [-slot-base /dev/shm] [-timeout 40m]
//	             [-llama-server PATH -model GGUF [-llama-ctx 16384] [-llama-args "ARGS"]]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/onebitd/onebitd/internal/benchharness"
)

func main() {
	if code, ok := benchharness.BareProxyMain(); ok {
		os.Exit(code)
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("onebit-bench", flag.ContinueOnError)
	out := fs.String("out", "", "write the markdown report here (and the plot beside it); empty: stdout only")
	bin := fs.String("bin", "bin", "directory of the built binaries (make build)")
	gobench := fs.String("gobench", "bench.out", "`go test -bench` output to include (missing file: skipped)")
	gobenchBase := fs.String("gobench-base", "", "an earlier `go test -bench` output: compare -gobench against it (before → after, with confidence intervals and a significance test)")
	scale := fs.Float64("scale", 1, "multiply every request count (0.1 for a quick look; counts never drop below 3)")
	sections := fs.String("sections", "handoff,proxy,pipeline,llama", "sections to run, comma-separated (llama: skipped without -llama-server)")
	llamaServer := fs.String("llama-server", "", "section d: a real llama-server binary that onebitd launches (make bench LLAMA_SERVER=…); empty: the section is skipped")
	model := fs.String("model", "", "section d: the GGUF the llama-servers load (make bench MODEL=…)")
	llamaCtx := fs.Int("llama-ctx", benchharness.LlamaCtx, "section d: the llama-servers' -c (prompts are capped to it)")
	llamaArgs := fs.String("llama-args", "", "section d: more llama-server arguments, space-separated (after -c N -fa off)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the handoff section (in-process onebitd included) here")
	slotBase := fs.String("slot-base", defaultSlotBase(), "where the handoff's slot directories go (tmpfs recommended; empty: the scratch dir)")
	limit := fs.Duration("timeout", 40*time.Minute, "give up after this long (the honest simulator moves full cells: the file route at 12 722 tokens takes seconds per request); 2h more with -llama-server unless set")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "onebit-bench: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *llamaServer != "" && *model == "" {
		fmt.Fprintln(os.Stderr, "onebit-bench: -llama-server needs -model (make bench LLAMA_SERVER=… MODEL=…)")
		return 2
	}
	if *llamaServer != "" && !flagSet(fs, "timeout") {
		*limit += 2 * time.Hour // a 12 700-token prompt on a CPU: minutes per request
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *limit)
	defer cancel()

	work, err := os.MkdirTemp("", "onebit-bench")
	if err != nil {
		log.Error("scratch dir", "error", err)
		return 1
	}
	defer os.RemoveAll(work)
	cfg := benchharness.Config{BinDir: *bin, WorkDir: work, Scale: *scale, CPUProfile: *cpuprofile, SlotBase: *slotBase, GoBenchBase: *gobenchBase, Logger: log}
	cfg.Llama = benchharness.LlamaConfig{Server: *llamaServer, Model: *model, Ctx: *llamaCtx, Args: strings.Fields(*llamaArgs)}
	if *sections != "" {
		cfg.Sections = strings.Split(*sections, ",")
	}
	if *gobench != "" {
		if _, err := os.Stat(*gobench); err == nil {
			cfg.GoBench = *gobench
		}
	}
	res, err := benchharness.Run(ctx, cfg)
	if err != nil {
		log.Error("benchmark failed", "error", err)
		return 1
	}
	if err := res.Markdown(os.Stdout); err != nil {
		return 1
	}
	if *out == "" {
		return llamaFailed(res)
	}
	if err := writeReport(*out, res); err != nil {
		log.Error("write report", "error", err)
		return 1
	}
	log.Info("report written", "path", *out, "took", res.Took.Round(time.Second))
	return llamaFailed(res)
}

// llamaFailed is 1 when section d failed (the report says why), else 0.
func llamaFailed(res *benchharness.Results) int {
	if res.Llama != nil && res.Llama.Failed != "" {
		return 1
	}
	return 0
}

// flagSet reports whether name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// defaultSlotBase is /dev/shm when it is a writable directory.
func defaultSlotBase() string {
	const shm = "/dev/shm"
	if fi, err := os.Stat(shm); err == nil && fi.IsDir() && syscall.Access(shm, 2) == nil {
		return shm
	}
	return ""
}

// writeReport writes the markdown to path and the plot beside it.
func writeReport(path string, res *benchharness.Results) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := res.Markdown(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if res.Handoff == nil {
		return nil
	}
	p, err := os.Create(filepath.Join(filepath.Dir(path), benchharness.PlotFile))
	if err != nil {
		return err
	}
	if err := res.Handoff.Plot(p); err != nil {
		p.Close()
		return err
	}
	return p.Close()
}
