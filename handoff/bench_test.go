package handoff

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/machine"
	"github.com/onebitd/onebitd/provider"
)

// benchDecoder is an in-process decoder: Share dials the socket and sends a
// 56-region header with 3 memfds (what the simulator sends for 2240 MiB of
// KV), Adopt and Restore answer at once. What a handoff costs on top of it
// is onebitd's own handling: socket, accept, peer check, header parse,
// files, cleanup and the transitions' events.
type benchDecoder struct {
	hdr []byte
	fds []int
	id  int64
}

func (d *benchDecoder) Share(_ context.Context, _ int, socket string) (decoder.ShareReply, error) {
	c, err := fdpass.Dial(socket, time.Second)
	if err != nil {
		return decoder.ShareReply{}, err
	}
	defer c.Close()
	if err := fdpass.Send(c, d.hdr, d.fds); err != nil {
		return decoder.ShareReply{}, err
	}
	d.id++
	id := d.id
	return decoder.ShareReply{ShareID: &id}, nil
}

func (d *benchDecoder) AdoptJSON(context.Context, int, json.RawMessage, int64) error { return nil }

func (d *benchDecoder) Restore(context.Context, int, string) (decoder.RestoreReply, error) {
	return decoder.RestoreReply{}, nil
}

// benchProvider succeeds without running anything (the file route's state
// file is not needed by benchDecoder).
type benchProvider struct{}

func (benchProvider) Prefill(context.Context, *Job) (provider.Result, error) {
	return provider.Result{}, nil
}

func benchHeader(b *testing.B) ([]byte, []int) {
	const nfds, nregions, chunk = 3, 56, 1 << 20
	h := fdpass.Header{Version: fdpass.HeaderVersion, LayoutHash: "0123456789abcdef", NCtx: 20480, NLayer: 28,
		KVTypeK: "f16", KVTypeV: "f16", FlashAttn: true, NBatch: 2048, NUbatch: 512}
	next := make([]int64, nfds)
	for i := range nregions {
		fd, kind := i%nfds, "k"
		if i%2 == 1 {
			kind = "v"
		}
		h.Regions = append(h.Regions, fdpass.Region{FDIndex: fd, Offset: next[fd], Size: 4096, Kind: kind, Layer: i / 2, CellStride: 64})
		next[fd] += 4096
	}
	raw, err := fdpass.Encode(&h)
	if err != nil {
		b.Fatal(err)
	}
	var fds []int
	for range nfds {
		fd, err := unix.MemfdCreate("bench", unix.MFD_CLOEXEC)
		if err != nil {
			b.Fatal(err)
		}
		if err := unix.Ftruncate(fd, chunk); err != nil {
			b.Fatal(err)
		}
		fds = append(fds, fd)
	}
	b.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	return raw, fds
}

// BenchmarkHandoff is one handoff per op (shared and file route, 251 and
// 12 722 tokens), the decoder and the provider in-process and instant, the
// events to a Recorder without sinks.
func BenchmarkHandoff(b *testing.B) {
	hdr, fds := benchHeader(b)
	for _, share := range []bool{true, false} {
		for _, n := range []int{251, 12722} {
			name := "file"
			if share {
				name = "shared"
			}
			b.Run(name+"/"+strconv.Itoa(n), func(b *testing.B) {
				dir := filepath.Join(b.TempDir(), "slots")
				if err := os.MkdirAll(dir, 0o700); err != nil {
					b.Fatal(err)
				}
				h := NewHandoff(Config{SlotDir: dir, Model: "m.gguf", Share: share, CheckPeerCreds: true, PeerUID: os.Getuid()},
					&benchDecoder{hdr: hdr, fds: fds}, benchProvider{}, nil)
				if err := h.Listen(); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { h.Close() })
				tokens := make([]int, n)
				for i := range tokens {
					tokens[i] = 1000 + i%100
				}
				rec := event.NewRecorder("bench")
				route := machine.RouteFile
				if share {
					route = machine.RouteShared
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					m := machine.New("r"+strconv.Itoa(i), 0, route, rec, nil)
					if reason := h.Run(context.Background(), m, tokens); reason != "" {
						b.Fatal(reason)
					}
				}
			})
		}
	}
}
