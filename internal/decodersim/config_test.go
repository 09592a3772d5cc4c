package decodersim

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseArgs(t *testing.T) {
	model := writeModel(t, "m")
	dir := t.TempDir()
	tests := []struct {
		name  string
		args  []string
		check func(Config) bool
		err   string // substring; "" = success
	}{
		{"defaults", []string{"-m", model}, func(c Config) bool {
			return c.Host == "127.0.0.1" && c.Port == 8080 && c.NCtx == 4096 && c.NParallel == 1 && c.FlashAttn == "auto" &&
				c.NBatch == 2048 && c.NUbatch == 512 && c.CacheTypeK == "f16" && c.ChunkSize == 1<<30 && c.NLayer == 28 && c.SlotSavePath == ""
		}, ""},
		{"llama-server spellings", []string{"--model=" + model, "-c", "8192", "-np", "4", "-fa", "off", "-b", "1024", "-ub", "256",
			"-ctk", "q8_0", "--cache-type-v", "q8_0", "--port", "0", "--host", "0.0.0.0", "--slot-save-path", dir}, func(c Config) bool {
			return c.NCtx == 8192 && c.NParallel == 4 && !c.flashAttn() && c.NBatch == 1024 && c.NUbatch == 256 && c.CacheTypeK == "q8_0" &&
				c.CacheTypeV == "q8_0" && c.Port == 0 && c.Host == "0.0.0.0" && strings.HasSuffix(c.SlotSavePath, "/")
		}, ""},
		{"sim flags", []string{"-m", model, "--recurrent", "--chunk-size", "512MiB", "--loading-delay", "2s", "--token-delay", "5ms", "--lax-share-id", "--no-slots",
			"--compact", "--prompt-ms-per-token", "0.25"},
			func(c Config) bool {
				return c.Recurrent && c.ChunkSize == 512<<20 && c.LoadingDelay == 2*time.Second && c.TokenDelay == 5*time.Millisecond && c.LaxShareID && c.NoSlots &&
					c.Compact && c.PromptMsPerToken == 0.25
			}, ""},
		{"negative prompt time", []string{"-m", model, "--prompt-ms-per-token", "-1"}, nil, "must not be negative"},
		{"-c 0 is the model's context", []string{"-m", model, "-c", "0"}, func(c Config) bool { return c.NCtx == 4096 }, ""},
		{"ubatch clamped to batch", []string{"-m", model, "-b", "256", "-ub", "512"}, func(c Config) bool { return c.NUbatch == 256 }, ""},
		{"no model", []string{"-c", "512"}, nil, "-m/--model is required"},
		{"unknown flag", []string{"-m", model, "--mlock"}, nil, "flag provided but not defined: -mlock"},
		{"stray argument", []string{"-m", model, "extra"}, nil, `unexpected argument "extra"`},
		{"bad fa", []string{"-m", model, "-fa", "yes"}, nil, `-fa "yes": want on, off or auto`},
		{"bad kv type", []string{"-m", model, "-ctk", "f8"}, nil, `-ctk "f8"`},
		{"bad chunk size", []string{"-m", model, "--chunk-size", "lots"}, nil, "not a positive byte count"},
		{"np larger than ctx", []string{"-m", model, "-c", "4", "-np", "8"}, nil, "-np 8"},
		{"slot cells rounded to pages", []string{"-m", model, "-c", "8192", "-np", "6"}, func(c Config) bool { return c.slotCells() == 1364 }, ""},
		{"less than a page per slot", []string{"-m", model, "-c", "5", "-np", "5"}, nil, "less than one page of cells (2) per slot"},
		{"bad cell size", []string{"-m", model, "--cell-size", "1000"}, nil, "--cell-size 1000"},
		{"tiny stride", []string{"-m", model, "--cell-size", "56", "--n-layer", "28"}, nil, "must be at least 32"},
		{"save path not a dir", []string{"-m", model, "--slot-save-path", model}, nil, "not a directory"},
		{"bad port", []string{"-m", model, "--port", "70000"}, nil, "--port 70000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseArgs(tc.args, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrConfig) {
					t.Fatalf("err %v, want ErrConfig containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Errorf("config %+v", c)
			}
		})
	}
	if _, err := ParseArgs([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestNewErrors(t *testing.T) {
	c := DefaultConfig()
	c.ModelPath = t.TempDir() // a directory is not a readable model file
	if _, err := New(c, nil); !errors.Is(err, ErrModel) {
		t.Errorf("directory as model: %v", err)
	}
	c.ModelPath = "/nonexistent/model.gguf"
	if _, err := New(c, nil); !errors.Is(err, ErrModel) {
		t.Errorf("missing model: %v", err)
	}
}

func TestPlanKV(t *testing.T) {
	tests := []struct {
		nCtx       int
		chunk      int64
		wantChunks []int64
		err        string
	}{
		{20480, 1 << 30, []int64{25 * 40 << 20, 25 * 40 << 20, 6 * 40 << 20}, ""},
		{512, 1 << 30, []int64{56 << 20}, ""},
		{4096, 16 << 20, repeat(16<<20, 28), ""},
		{20480, 32 << 20, nil, "more than --chunk-size"},
		{512, 4096, nil, "more than --chunk-size"},
		{4096, 8 << 20, nil, "one share message carries at most 253 fds"}, // with 200 layers
	}
	for _, tc := range tests {
		nLayer := 28
		if tc.chunk == 8<<20 {
			nLayer = 200
		}
		g, err := planKV(tc.nCtx, nLayer, 2048, tc.chunk)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("-c %d chunk %d: err %v, want %q", tc.nCtx, tc.chunk, err, tc.err)
			}
			continue
		}
		if err != nil || len(g.chunkSizes) != len(tc.wantChunks) {
			t.Errorf("-c %d chunk %d: %v %v, want %v", tc.nCtx, tc.chunk, g.chunkSizes, err, tc.wantChunks)
			continue
		}
		for i := range g.chunkSizes {
			if g.chunkSizes[i] != tc.wantChunks[i] {
				t.Errorf("-c %d: chunks %v, want %v", tc.nCtx, g.chunkSizes, tc.wantChunks)
			}
		}
		for b, off := range g.offsets {
			if off%pageSize != 0 {
				t.Errorf("-c %d: buffer %d at unaligned offset %d", tc.nCtx, b, off)
			}
		}
	}
}

func repeat(v int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = v
	}
	return out
}
