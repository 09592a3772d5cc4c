package benchharness

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"time"
)

// WarmResult is the warm provider's part of section a (issue 11: a
// provider launched once and fed jobs over a unix socket, `onebitd serve
// --provider-mode serve`). Until onebitd has that mode the harness cannot
// take these figures, and NotMeasured says so.
type WarmResult struct {
	// NotMeasured is why the figures are missing ("" when measured).
	NotMeasured string
	// Overhead is the prefill phase minus the provider's own reported
	// prefill_ms, per request; Whole is the whole 251-token request minus
	// the provider's prefill_ms.
	Overhead, Whole Summary
}

// Warm-provider figures, named in the targets table.
const (
	warmOverheadWhat = "warm provider: prefill phase − the provider's reported prefill_ms"
	warmWholeWhat    = "warm provider: whole 251-token request − the provider's own prefill time"
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

// warmStatus is section a's warm-provider result for this onebitd binary.
func warmStatus(ctx context.Context, c *Config) *WarmResult {
	if !hasProviderModeServe(ctx, c.bin("onebitd")) {
		return &WarmResult{NotMeasured: "no warm provider configured (`onebitd serve` has no --provider-mode serve yet)"}
	}
	return &WarmResult{NotMeasured: fmt.Sprintf("no warm provider configured: %s has --provider-mode, but its events carry no provider prefill_ms for the harness to subtract yet", c.bin("onebitd"))}
}
