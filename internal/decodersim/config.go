package decodersim

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/onebitd/onebitd/internal/simkv"
)

// Config is the simulator's configuration; the field comments name the
// llama-server flag (or the sim's own flag) that sets each one.
type Config struct {
	Host             string        // --host (a path ending in .sock: a unix socket)
	Port             int           // --port (0: pick a free port)
	NCtx             int           // -c, --ctx-size (total cells; 0: the model's 4096)
	NParallel        int           // -np, --parallel (slots)
	SlotSavePath     string        // --slot-save-path (empty: slot actions answer 501)
	ModelPath        string        // -m, --model (required, readable file)
	FlashAttn        string        // -fa, --flash-attn: on, off or auto (auto counts as on)
	NBatch           int           // -b, --batch-size
	NUbatch          int           // -ub, --ubatch-size (clamped to NBatch, as llama.cpp does)
	CacheTypeK       string        // -ctk, --cache-type-k
	CacheTypeV       string        // -ctv, --cache-type-v
	NoSlots          bool          // --no-slots: GET /slots answers 501
	Recurrent        bool          // --recurrent: share answers 501 "no shareable region"
	ChunkSize        int64         // --chunk-size: most bytes per memfd chunk
	CellSize         int           // --cell-size: KV bytes per cell over all layers, K and V
	NLayer           int           // --n-layer
	LoadingDelay     time.Duration // --loading-delay: answer 503 "Loading model" this long
	TokenDelay       time.Duration // --token-delay: sleep per generated token
	LaxShareID       bool          // --lax-share-id: TEST SWITCH, adopt ignores share_id validity
	ShareNoSend      bool          // --share-no-connect: TEST SWITCH, share answers 200 but never connects
	APIKeys          []string      // --api-key (comma-separated) and --api-key-file (one a line)
	Compact          bool          // --compact: cells, state files hold layer 0's records only (small, fast tests)
	PromptMsPerToken float64       // --prompt-ms-per-token: simulated prompt evaluation time per token
	FaultFromPrompt  bool          // --fault-from-prompt: TEST SWITCH, a prompt's FAULT:<name> marker injects that fault (internal/simfault)
	FaultDelay       time.Duration // --fault-delay: how long the share-slow fault waits before it connects
}

// Defaults that are not llama-server's.
const (
	DefaultChunkSize  = 1 << 30         // 1 GiB, the fork's largest region
	DefaultFaultDelay = 2 * time.Second // --fault-delay
	defaultNCtxTrain  = 4096            // what -c 0 means for the sim model
	maxNCtx           = 1 << 22
	maxNLayer         = 1024
)

// KV cache types llama.cpp accepts for -ctk/-ctv.
var kvTypes = []string{"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}

// DefaultConfig is llama-server's defaults plus the sim's.
func DefaultConfig() Config {
	return Config{
		Host:       "127.0.0.1",
		Port:       8080,
		NCtx:       4096,
		NParallel:  1,
		FlashAttn:  "auto",
		NBatch:     2048,
		NUbatch:    512,
		CacheTypeK: "f16",
		CacheTypeV: "f16",
		ChunkSize:  DefaultChunkSize,
		FaultDelay: DefaultFaultDelay,
		CellSize:   simkv.DefaultCellSize,
		NLayer:     simkv.DefaultNLayer,
	}
}

// ParseArgs parses llama-server style arguments (both -x and --x spellings,
// "--x v" and "--x=v") into a validated Config. An unknown flag or a stray
// argument is an error naming it; -h prints the usage to out and returns
// flag.ErrHelp.
func ParseArgs(args []string, out io.Writer) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("onebit-decoder-sim", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned; usage only for -h
	str := func(p *string, usage string, names ...string) {
		for _, n := range names {
			fs.StringVar(p, n, *p, usage)
		}
	}
	num := func(p *int, usage string, names ...string) {
		for _, n := range names {
			fs.IntVar(p, n, *p, usage)
		}
	}
	str(&c.Host, "address to listen on", "host")
	num(&c.Port, "port to listen on (0: pick a free one)", "port")
	num(&c.NCtx, "context size in cells, shared by the slots", "c", "ctx-size")
	num(&c.NParallel, "number of slots", "np", "parallel")
	str(&c.SlotSavePath, "directory of slot state files (enables slot actions)", "slot-save-path")
	str(&c.ModelPath, "model file (required; any readable file)", "m", "model")
	str(&c.FlashAttn, "flash attention: on, off or auto", "fa", "flash-attn")
	num(&c.NBatch, "logical batch size", "b", "batch-size")
	num(&c.NUbatch, "physical batch size", "ub", "ubatch-size")
	str(&c.CacheTypeK, "KV cache type of K", "ctk", "cache-type-k")
	str(&c.CacheTypeV, "KV cache type of V", "ctv", "cache-type-v")
	fs.BoolVar(&c.NoSlots, "no-slots", false, "disable GET /slots")
	fs.BoolVar(&c.Recurrent, "recurrent", false, "simulate a recurrent cache: share answers 501")
	fs.Func("chunk-size", "most bytes per memfd chunk (suffixes K, M, G, KiB, MiB, GiB; default 1GiB)", func(s string) error {
		n, err := parseBytes(s)
		c.ChunkSize = n
		return err
	})
	num(&c.CellSize, "KV bytes per cell over all layers, K and V", "cell-size")
	num(&c.NLayer, "number of layers", "n-layer")
	fs.DurationVar(&c.LoadingDelay, "loading-delay", 0, "answer 503 Loading model for this long after start")
	fs.DurationVar(&c.TokenDelay, "token-delay", 0, "sleep this long per generated token")
	fs.BoolVar(&c.LaxShareID, "lax-share-id", false, "TEST SWITCH: adopt ignores share_id validity")
	fs.BoolVar(&c.ShareNoSend, "share-no-connect", false, "TEST SWITCH: share answers with a share_id but never connects to the socket")
	fs.BoolVar(&c.Compact, "compact", false, "write, save and restore layer 0's records only, not full cells (fast tests; not llama-server's costs)")
	fs.Float64Var(&c.PromptMsPerToken, "prompt-ms-per-token", 0, "spend at least this long per evaluated prompt token (reported in timings.prompt_ms)")
	fs.BoolVar(&c.FaultFromPrompt, "fault-from-prompt", false, "TEST SWITCH: a prompt's FAULT:<name> marker injects that fault into its request (see internal/simfault)")
	fs.DurationVar(&c.FaultDelay, "fault-delay", c.FaultDelay, "with --fault-from-prompt: how long a share-slow share waits before it connects")
	fs.Func("api-key", "API keys, comma-separated: every endpoint but /health and the model list needs one", func(s string) error {
		c.APIKeys = append(c.APIKeys, splitKeys(s)...)
		return nil
	})
	fs.Func("api-key-file", "file of API keys, one a line", func(s string) error {
		keys, err := readKeyFile(s)
		c.APIKeys = append(c.APIKeys, keys...)
		return err
	})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(out, "usage: onebit-decoder-sim -m MODEL [llama-server flags]\n")
			fs.SetOutput(out)
			fs.PrintDefaults()
			return c, err
		}
		return c, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%w: unexpected argument %q", ErrConfig, fs.Arg(0))
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

// parseBytes parses "1073741824", "1G", "512MiB".
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("not a positive byte count: %q", s)
	}
	return n * mult, nil
}

// Validate checks c and normalises it (-c 0, -ub > -b, the slot save path's
// trailing separator). It does not read the model.
func (c *Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...)
	}
	if c.ModelPath == "" {
		return bad("-m/--model is required")
	}
	if c.NCtx == 0 {
		c.NCtx = defaultNCtxTrain
	}
	if c.NUbatch > c.NBatch {
		c.NUbatch = c.NBatch
	}
	switch {
	case c.Port < 0 || c.Port > 65535:
		return bad("--port %d is not a port number", c.Port)
	case c.NCtx < 0 || c.NCtx > maxNCtx:
		return bad("-c %d is outside [0, %d]", c.NCtx, maxNCtx)
	case c.NParallel < 1 || c.NParallel > c.NCtx:
		return bad("-np %d must be at least 1 and at most -c (%d)", c.NParallel, c.NCtx)
	case c.FlashAttn != "on" && c.FlashAttn != "off" && c.FlashAttn != "auto":
		return bad("-fa %q: want on, off or auto", c.FlashAttn)
	case c.NBatch < 1 || c.NUbatch < 1:
		return bad("-b %d and -ub %d must be positive", c.NBatch, c.NUbatch)
	case !validKVType(c.CacheTypeK):
		return bad("-ctk %q: want one of %s", c.CacheTypeK, strings.Join(kvTypes, ", "))
	case !validKVType(c.CacheTypeV):
		return bad("-ctv %q: want one of %s", c.CacheTypeV, strings.Join(kvTypes, ", "))
	case c.NLayer < 1 || c.NLayer > maxNLayer:
		return bad("--n-layer %d is outside [1, %d]", c.NLayer, maxNLayer)
	case c.ChunkSize < pageSize:
		return bad("--chunk-size %d is smaller than a page (%d)", c.ChunkSize, pageSize)
	case c.LoadingDelay < 0 || c.TokenDelay < 0 || c.FaultDelay < 0 || c.PromptMsPerToken < 0 || c.PromptMsPerToken > 1e6:
		return bad("delays must not be negative")
	}
	if c.CellSize <= 0 || c.CellSize%(2*c.NLayer) != 0 {
		return bad("--cell-size %d is not a positive multiple of 2 x --n-layer (%d)", c.CellSize, 2*c.NLayer)
	}
	stride := c.stride()
	if stride < simkv.RecordSize || (stride%pageSize != 0 && pageSize%stride != 0) {
		return bad("--cell-size %d gives %d bytes per cell per layer and kind; it must be at least %d and divide or be a multiple of %d",
			c.CellSize, stride, simkv.RecordSize, pageSize)
	}
	if c.slotCells() == 0 {
		return bad("-c %d / -np %d leaves less than one page of cells (%d) per slot", c.NCtx, c.NParallel, c.cellUnit())
	}
	if c.SlotSavePath != "" {
		fi, err := os.Stat(c.SlotSavePath)
		if err != nil || !fi.IsDir() {
			return bad("--slot-save-path: not a directory: %s", c.SlotSavePath)
		}
		c.SlotSavePath = filepath.Clean(c.SlotSavePath) + string(filepath.Separator)
	}
	return nil
}

// slotCells is n_ctx / n_parallel rounded down to whole pages of cells, so
// that every slot's region in a buffer is page aligned (a share maps it).
// With the default geometry that is an even number: -c 8192 -np 6 gives 1364
// cells per slot where llama-server has 1365.
func (c *Config) slotCells() int {
	n := c.NCtx / c.NParallel
	return n - n%c.cellUnit()
}

// cellUnit is the number of cells in one page of a buffer (at least 1).
func (c *Config) cellUnit() int { return max(1, pageSize/int(c.stride())) }

// stride is the bytes of one cell in one (layer, kind) buffer.
func (c *Config) stride() int64 { return int64(c.CellSize / (2 * c.NLayer)) }

// flashAttn is the effective flash attention setting (auto counts as on).
func (c *Config) flashAttn() bool { return c.FlashAttn != "off" }

func validKVType(t string) bool {
	for _, k := range kvTypes {
		if t == k {
			return true
		}
	}
	return false
}
