package handoff

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/provider"
)

// The test binary doubles as the provider and as a stranger process that
// connects to a share socket: with GO_WANT_HELPER_PROCESS=1 and "-helper" as
// its first argument it runs helperMain instead of the tests. A provider's
// Runner.Args are "-helper MODE ARG"; the provider contract's args follow.
const helperEnv = "GO_WANT_HELPER_PROCESS"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" && len(os.Args) > 1 && os.Args[1] == "-helper" {
		os.Exit(helperMain(os.Args[2:]))
	}
	os.Setenv(helperEnv, "1")                // inherited by the helpers the tests start
	os.Setenv("GORACE", "atexit_sleep_ms=0") // a -race child otherwise sleeps 1s on exit
	if err := provider.CloseOnExecInherited(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

// Provider modes of the helper (the second word of Runner.Args).
const (
	provOK        = "ok"         // write the regions / the state file, exit 0
	provFail      = "fail"       // a reason on stderr, exit 3
	provWriteFail = "write-fail" // write the regions / part of the state file, exit 1
	provHang      = "hang"       // write its pid to ARG (and a .tmp state), sleep until killed
)

// helperStderr is the last stderr line of provFail: the fallback reason's tail.
const helperStderr = "the NPU is busy"

// regionMark is what a provider writes at the start of every region fd.
const regionMark = "prefilled"

func helperMain(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "helper: want MODE ARG")
		return 2
	}
	mode, arg, contract := args[0], args[1], flags(args[2:])
	switch mode {
	case "connect":
		return connectAndWait(arg)
	case provOK:
		if err := prefill(contract, false); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case provFail:
		fmt.Fprintf(os.Stderr, "loading the model\n%s\n\n", helperStderr)
		return 3
	case provWriteFail:
		if err := prefill(contract, true); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		fmt.Fprintln(os.Stderr, "wrote the regions, then lost the device")
		return 1
	case provHang:
		if st := contract["--state"]; st != "" {
			os.WriteFile(st+".tmp", []byte("half a state"), 0o600)
		}
		if err := writeAtomic(arg, strconv.Itoa(os.Getpid())); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		time.Sleep(time.Hour)
	}
	fmt.Fprintf(os.Stderr, "helper: unknown mode %q\n", mode)
	return 2
}

// flags reads the provider contract's "--name value" pairs.
func flags(args []string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(args); i += 2 {
		m[args[i]] = args[i+1]
	}
	return m
}

// prefill does a provider's work: regionMark into every region fd (shared
// route) or a state file (file route); half of it when partial.
func prefill(c map[string]string, partial bool) error {
	if st := c["--state"]; st != "" {
		if partial {
			return os.WriteFile(st, []byte("half"), 0o600) // the file, no rename
		}
		return writeAtomic(st, "state of "+c["--tokens"])
	}
	for _, s := range strings.Split(c["--fds"], ",") {
		fd, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("--fds %q: %w", c["--fds"], err)
		}
		if _, err := unix.Pwrite(fd, []byte(regionMark), 0); err != nil {
			return fmt.Errorf("write region fd %d: %w", fd, err)
		}
	}
	return nil
}

func writeAtomic(path, content string) error {
	if err := os.WriteFile(path+".tmp", []byte(content), 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// connectAndWait is a stranger: it connects to the share socket, sends a
// valid share message with its own memfd, and waits for the other end to
// hang up.
func connectAndWait(socket string) int {
	fd, err := unix.MemfdCreate("stranger", unix.MFD_CLOEXEC)
	if err == nil {
		err = unix.Ftruncate(fd, 1<<20)
	}
	var c *net.UnixConn
	if err == nil {
		c, err = fdpass.Dial(socket, 10*time.Second)
	}
	if err == nil {
		defer c.Close()
		err = fdpass.Send(c, shareHeader(1), []int{fd})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "stranger:", err)
		return 1
	}
	var one [1]byte
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	c.Read(one[:])
	return 0
}

// shareHeader is a valid header for nfds memfds of at least 1 MiB: two
// 4 KiB regions (k and v) per fd.
func shareHeader(nfds int) []byte {
	h := fdpass.Header{Version: fdpass.HeaderVersion, LayoutHash: "0123456789abcdef", NCtx: 512, NLayer: 2,
		KVTypeK: "f16", KVTypeV: "f16", FlashAttn: true, NBatch: 2048, NUbatch: 512}
	for i := range nfds {
		h.Regions = append(h.Regions,
			fdpass.Region{FDIndex: i, Offset: 0, Size: 4096, Kind: "k", Layer: i % 2, CellStride: 64},
			fdpass.Region{FDIndex: i, Offset: 4096, Size: 4096, Kind: "v", Layer: i % 2, CellStride: 64})
	}
	b, err := fdpass.Encode(&h)
	if err != nil {
		panic(err)
	}
	return b
}
