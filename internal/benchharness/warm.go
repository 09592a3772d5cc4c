package benchharness

import (
	"bytes"
	"context"
	"os/exec"
	"time"
)

// WarmResult is the warm provider's part of section a (issue 11: a
// provider launched once and fed jobs over a unix socket, `onebitd serve
// --provider-mode serve`, DESIGN §2c). When the onebitd binary has that
// mode, section a runs a third stack, the shared route with a warm
// provider (rows RouteSharedWarm), and the in-process copy reads the
// provider's own prefill_ms of each job. Otherwise NotMeasured says why.
type WarmResult struct {
	// NotMeasured is why the figures are missing ("" when measured).
	NotMeasured string
	// At the shortest prompt, in-process, per request: Overhead is the
	// prefill phase minus the provider's reported prefill_ms; Whole is the
	// whole request (client side) minus it.
	Overhead, Whole Summary
}

// Warm-provider figures, named in the targets table.
const (
	warmOverheadWhat = "warm provider: prefill phase − the provider's reported prefill_ms at 251 tokens (in-process, per request)"
	warmWholeWhat    = "warm provider: whole 251-token request − the provider's own prefill time (in-process, per request)"
)

// targets are the warm provider's rows; a nil WarmResult was not run.
func (w *WarmResult) targets() []Target {
	why := "no warm provider configured"
	switch {
	case w == nil:
	case w.NotMeasured != "":
		why = w.NotMeasured
	default:
		return []Target{durTarget(warmOverheadWhat, w.Overhead, TargetWarmOverhead), durTarget(warmWholeWhat, w.Whole, TargetWarmWhole)}
	}
	return []Target{notMeasured(warmOverheadWhat, why, TargetWarmOverhead), notMeasured(warmWholeWhat, why, TargetWarmWhole)}
}

// hasProviderModeServe reports whether `onebitd serve -h` lists
// --provider-mode (DESIGN §2c).
func hasProviderModeServe(ctx context.Context, onebitd string) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, onebitd, "serve", "-h").CombinedOutput() // -h may exit 0 or 2
	return bytes.Contains(out, []byte("provider-mode"))
}

// warmResult is the warm provider's figures at the shortest prompt from
// the RouteSharedWarm rows of h; ran says whether onebitd had the mode.
func warmResult(h *HandoffResult, ran bool) *WarmResult {
	if !ran {
		return &WarmResult{NotMeasured: "no warm provider configured (`onebitd serve` has no --provider-mode serve)"}
	}
	row := h.Row(RouteSharedWarm, HandoffSizes[0])
	if row == nil || row.ProviderReported.N == 0 {
		return &WarmResult{NotMeasured: "the warm provider's reported prefill_ms was not seen (provider.Warm logs it with each job)"}
	}
	return &WarmResult{Overhead: row.PrefillOverhead, Whole: row.WholeOverReported}
}
