package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/onebitd/onebitd/launcher"
)

// PrefillProviderName is the provider onebitd runs against a prefill server
// it launched (--prefill-bin): the file-route provider of cmd/onebit-prefill.
const PrefillProviderName = "onebit-prefill"

// Errors of the prefill server's options.
var (
	ErrPrefillWithProvider = errors.New("daemon: --prefill-bin runs its own provider (onebit-prefill): drop --provider")
	ErrPrefillShared       = errors.New("daemon: --prefill-bin is the file route: a prefill llama-server cannot share its KV with the decoder (drop --kv-share)")
	ErrNoPrefillProvider   = errors.New("daemon: onebit-prefill not found beside onebitd nor in PATH (give --prefill-provider)")
)

func (o *Options) checkPrefill() error {
	if o.PrefillBin == "" {
		return nil
	}
	if o.Provider != "" {
		return ErrPrefillWithProvider
	}
	if o.KVShare {
		return ErrPrefillShared
	}
	if o.Model == "" && len(o.PrefillArgs) == 0 && len(o.DecoderArgs) == 0 {
		return ErrNoModel
	}
	return nil
}

// prefillProvider finds onebit-prefill: the option, else beside the
// running executable, else in PATH.
func (o *Options) prefillProvider() (string, error) {
	if o.PrefillProvider != "" {
		return o.PrefillProvider, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), PrefillProviderName)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath(PrefillProviderName); err == nil {
		return p, nil
	}
	return "", ErrNoPrefillProvider
}

// prefillArgs are the prefill server's arguments: --prefill-arg, else the
// decoder's own (same model, -c, -fa, -b, -ub and KV types, so that the
// layouts of the two servers agree).
func (o *Options) prefillArgs() []string {
	if len(o.PrefillArgs) > 0 {
		return o.PrefillArgs
	}
	return o.DecoderArgs
}

// startPrefill launches the prefill server and points the provider at it:
// onebit-prefill --prefill-url URL --slots N, on the file route. A dead
// prefill server is restarted by its launcher (prefill.* events); meanwhile
// onebit-prefill fails and requests fall back to the plain answer.
func (d *Daemon) startPrefill(ctx context.Context, slots int) error {
	o := &d.opts
	if o.PrefillBin == "" {
		return nil
	}
	prov, err := o.prefillProvider()
	if err != nil {
		return err
	}
	args := o.prefillArgs()
	d.log.Info("launching the prefill server", "bin", o.PrefillBin, "args", strings.Join(args, " "), "provider", prov)
	l, err := launcher.Start(ctx, launcher.Config{
		Bin: o.PrefillBin, Args: args, Model: o.Model, SlotDir: o.SlotDir, Slots: slots,
		APIKey: true, UnixSocket: true, RunDir: filepath.Join(o.StateDir, "run", "prefill"),
		Kind: "prefill", Sink: d.events, Logger: d.log.With("server", "prefill"),
	})
	if err != nil {
		return fmt.Errorf("prefill server: %w", err)
	}
	d.prefill = l
	d.closers = append(d.closers, func() {
		if err := l.Stop(); err != nil {
			d.log.Warn("prefill server stop", attrError, err)
		}
	})
	o.Provider = prov
	o.ProviderArgs = append([]string{"--prefill-url", l.URL(), "--prefill-api-key-file", l.KeyFile(),
		"--slots", strconv.Itoa(slots)}, o.ProviderArgs...)
	return nil
}
