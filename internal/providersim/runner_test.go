package providersim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/onebitd/onebitd/internal/simkv"
	"github.com/onebitd/onebitd/provider"
)

// TestSimWithRunner runs the sim binary through provider.Runner, as onebitd
// does, and checks the fallback reasons onebitd would report.
func TestSimWithRunner(t *testing.T) {
	dir := t.TempDir()
	modelPath, model := writeModel(t, dir, "a")
	otherPath, other := writeModel(t, dir, "b")
	tokens := simkv.Tokenize("the slot of the decoder", true)
	tokFile := filepath.Join(dir, "r.tokens")
	if err := provider.WriteTokens(tokFile, tokens); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	t.Run("file", func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "r.bin")
		r := &provider.Runner{Path: simBin, Timeout: 10 * time.Second}
		if res, err := r.RunFile(ctx, tokFile, modelPath, state); err != nil {
			t.Fatalf("res %+v err %v", res, err)
		}
		checkStateFile(t, state, model, tokens, &DefaultGeometry)
	})

	shared := func(t *testing.T, r *provider.Runner, modelPath string) (provider.Result, func(toks []int), error) {
		h, files := makeShare(t, model, defaultGeometry)
		layout := filepath.Join(t.TempDir(), "r.json")
		if err := os.WriteFile(layout, headerJSON(t, h), 0o600); err != nil {
			t.Fatal(err)
		}
		res, err := r.RunShared(ctx, tokFile, modelPath, layout, files)
		return res, func(toks []int) { checkShared(t, h, files, model, toks, true) }, err
	}
	t.Run("shared", func(t *testing.T) {
		res, check, err := shared(t, &provider.Runner{Path: simBin, Timeout: 10 * time.Second}, modelPath)
		if err != nil {
			t.Fatalf("res %+v err %v", res, err)
		}
		check(tokens)
	})
	t.Run("shared layout mismatch", func(t *testing.T) {
		res, check, err := shared(t, &provider.Runner{Path: simBin, Timeout: 10 * time.Second}, otherPath)
		h, _ := makeShare(t, model, defaultGeometry)
		want := fmt.Sprintf("provider exited with status 2: layout hash mismatch: decoder %s, provider model %s",
			h.LayoutHash, LayoutHash(other, &h))
		if !errors.Is(err, provider.ErrProviderExit) || err.Error() != want || res.ExitCode != 2 {
			t.Fatalf("res %+v err %v; want %q", res, err, want)
		}
		check(nil)
	})
	t.Run("write then fail", func(t *testing.T) {
		res, check, err := shared(t, &provider.Runner{Path: simBin, Args: []string{"--write-then-fail"}, Timeout: 10 * time.Second}, modelPath)
		if err == nil || err.Error() != "provider exited with status 1: simulated failure after writing" || res.ExitCode != 1 {
			t.Fatalf("res %+v err %v", res, err)
		}
		check(tokens) // written, and left for the decoder never to adopt
	})
	t.Run("hang", func(t *testing.T) {
		r := &provider.Runner{Path: simBin, Args: []string{"--hang"}, Timeout: 300 * time.Millisecond}
		res, err := r.RunFile(ctx, tokFile, modelPath, filepath.Join(t.TempDir(), "r.bin"))
		if !errors.Is(err, provider.ErrProviderTimeout) || !res.TimedOut ||
			err.Error() != "provider timed out after 300ms (process group killed)" {
			t.Fatalf("res %+v err %v", res, err)
		}
	})
}

// BenchmarkSimRoutes measures one provider run through provider.Runner
// (process start included) at the prompt lengths of LLAMA_SERVER.md, with a
// Qwen3-0.6B-like share: 28 layers, k and v, 2048-byte strides, n_ctx 16384.
func BenchmarkSimRoutes(b *testing.B) {
	dir := b.TempDir()
	modelPath, model := writeModel(b, dir, "a")
	g := geometry{nCtx: 16384, nLayer: 28, stride: 2048}
	h, files := makeShare(b, model, g)
	layout := filepath.Join(dir, "r.json")
	if err := os.WriteFile(layout, headerJSON(b, h), 0o600); err != nil {
		b.Fatal(err)
	}
	r := &provider.Runner{Path: simBin, Timeout: time.Minute}
	for _, n := range []int{251, 3189, 12722} {
		tokens := make([]int, n)
		for i := range tokens {
			tokens[i] = simkv.WordBase + i%100
		}
		tokFile := filepath.Join(dir, fmt.Sprintf("%d.tokens", n))
		if err := provider.WriteTokens(tokFile, tokens); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("file/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := r.RunFile(context.Background(), tokFile, modelPath, filepath.Join(dir, "r.bin")); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("shared/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := r.RunShared(context.Background(), tokFile, modelPath, layout, files); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWriteShared measures the mapping and record writes alone.
func BenchmarkWriteShared(b *testing.B) {
	_, model := writeModel(b, b.TempDir(), "a")
	h, files := makeShare(b, model, geometry{nCtx: 16384, nLayer: 28, stride: 2048})
	for _, n := range []int{251, 3189, 12722} {
		tokens := make([]int, n)
		for i := range tokens {
			tokens[i] = simkv.WordBase + i%100
		}
		targets, err := Plan(&h, n, true)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			for b.Loop() {
				if err := WriteShared(files, targets, model, tokens, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
