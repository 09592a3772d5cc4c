package handoff

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"

	"github.com/onebitd/onebitd/machine"
	"github.com/onebitd/onebitd/provider"
	"github.com/onebitd/onebitd/provjob"
)

// Job is one prefill, as either provider contract needs it.
type Job struct {
	Route      machine.Route // RouteShared or RouteFile
	Tokens     []int
	TokensFile *os.File // sealed memfd holding the tokens as a JSON array
	Model      string
	Start      int        // cells 0..Start-1 already hold the prompt's first tokens (DESIGN §2b --start)
	Layout     []byte     // shared: the share header, verbatim
	LayoutFile *os.File   // shared: sealed memfd holding Layout
	Regions    []*os.File // shared: the region fds, in fd_index order
	State      string     // file: the state file to write (absolute)
}

// Exec runs the provider as a process per job (--provider-mode exec): the
// region fds are inherited at 3.., the tokens and layout memfds after
// them, named by /proc/self/fd/N paths so that a provider that opens a
// path works unchanged.
type Exec struct{ Runner *provider.Runner }

// Prefill implements Provider.
func (e Exec) Prefill(ctx context.Context, job *Job) (provider.Result, error) {
	files := make([]*os.File, 0, len(job.Regions)+2)
	files = append(files, job.Regions...)
	fd := func(f *os.File) string {
		files = append(files, f)
		return ProcFDPath(3 + len(files) - 1)
	}
	var args []string
	switch job.Route {
	case machine.RouteShared:
		fds := make([]string, len(job.Regions))
		for i := range fds {
			fds[i] = strconv.Itoa(3 + i)
		}
		args = []string{"--tokens", fd(job.TokensFile), "--model", job.Model, "--layout", fd(job.LayoutFile),
			"--fds", strings.Join(fds, ",")}
	default:
		args = []string{"--tokens", fd(job.TokensFile), "--model", job.Model, "--state", job.State}
	}
	if job.Start > 0 {
		args = append(args, "--start", strconv.Itoa(job.Start))
	}
	return e.Runner.Run(ctx, args, files)
}

// Warm sends each job to one long-running provider (--provider-mode serve,
// DESIGN §2c). On a timeout, a dead provider or a lost connection its
// process group is gone before Prefill returns.
type Warm struct{ W *provider.Warm }

// Prefill implements Provider.
func (w Warm) Prefill(ctx context.Context, job *Job) (provider.Result, error) {
	pj := &provjob.Job{Version: provjob.Version, Route: string(job.Route), Tokens: job.Tokens, Model: job.Model,
		Start: job.Start, State: job.State}
	if job.Route == machine.RouteShared {
		pj.Layout = json.RawMessage(job.Layout)
	}
	return w.W.Run(ctx, pj, job.Regions)
}
