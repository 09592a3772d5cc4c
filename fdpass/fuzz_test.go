package fdpass

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"reflect"
	"testing"
	"time"
)

// sentinels in the order classify tries them.
var sentinels = []error{
	ErrAcceptTimeout, ErrReceiveTimeout, ErrCtrunc, ErrTrunc, ErrShortMessage,
	ErrHeaderTooLarge, ErrBadHeader, ErrVersion, ErrRegion, ErrStrayFDs, ErrControl,
}

// classify returns the sentinel err wraps, or err itself.
func classify(err error) error {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return s
		}
	}
	return err
}

// fuzzSeeds are byte streams for both fuzz targets (also in testdata/fuzz).
func fuzzSeeds(t testing.TB) [][]byte {
	h1, h3 := testHeader(1, 2), testHeader(3, 56)
	v2 := testHeader(1, 2)
	v2.Version = 2
	return [][]byte{
		frame(mustJSON(t, h1)),
		frame(mustJSON(t, h3)),
		frame(mustJSON(t, v2)),
		append(frame(mustJSON(t, h1)), "trailing"...),
		frame(mustJSON(t, h1))[:20],
		frame([]byte(`{"version":1}`)),
		frame([]byte(`{"version":1,"layout_hash":"ab","regions":[{"fd_index":0,"offset":0,"size":4096,"kind":"k","layer":0,"cell_stride":4096}]}`)),
		frame([]byte(`{"version":1,"extra":true}`)),
		frame([]byte(`null`)),
		prefixOnly(0),
		prefixOnly(MaxHeaderLen + 1),
		{1, 0},
		nil,
	}
}

// FuzzParseFrame hits the pure parser: length prefix, JSON, validation.
func FuzzParseFrame(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		for nfds := range uint8(4) {
			f.Add(s, nfds)
		}
	}
	f.Fuzz(func(t *testing.T, stream []byte, nfds uint8) {
		checkParse(t, stream, int(nfds%5))
	})
}

// checkParse runs parseFrame and checks the invariants of its result.
func checkParse(t *testing.T, stream []byte, nfds int) (Header, []byte, error) {
	h, raw, err := parseFrame(stream, nfds)
	if err != nil {
		if c := classify(err); c == err {
			t.Fatalf("parseFrame error %v wraps no sentinel", err)
		}
		return h, raw, err
	}
	n := binary.LittleEndian.Uint32(stream)
	if !bytes.Equal(raw, stream[4:4+n]) {
		t.Fatalf("raw is not the %d header bytes", n)
	}
	if verr := h.Validate(nfds); verr != nil {
		t.Fatalf("parsed header fails Validate: %v", verr)
	}
	// Round trip: what we accept, we can encode and accept again unchanged.
	enc, eerr := Encode(&h)
	if eerr != nil {
		t.Fatal(eerr)
	}
	if len(enc) <= MaxHeaderLen {
		h2, _, err2 := parseFrame(frame(enc), nfds)
		if err2 != nil || !reflect.DeepEqual(h, h2) {
			t.Fatalf("round trip: %v\n%+v\n%+v", err2, h, h2)
		}
	}
	return h, raw, nil
}

// FuzzReceive sends the bytes over a real socketpair with nfds fds (of
// /dev/null, so region sizes are not checked against a file) and checks that
// Receive agrees with parseFrame, and that no fd is left open on any error.
func FuzzReceive(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		for nfds := range uint8(4) {
			f.Add(s, nfds)
		}
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { null.Close() })
	const maxFDs = 3
	f.Fuzz(func(t *testing.T, stream []byte, nfds8 uint8) {
		nfds := int(nfds8 % (maxFDs + 2)) // maxFDs+1 exercises MSG_CTRUNC
		if len(stream) == 0 {
			nfds = 0 // a stream socket cannot carry fds without a byte
		}
		wantH, wantRaw, wantErr := checkParse(t, stream, min(nfds, maxFDs))
		switch {
		case nfds > maxFDs && len(stream) > 0:
			wantErr = ErrCtrunc
		case wantErr != nil:
			wantErr = classify(wantErr)
		}

		r, s, err := newSocketPair()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		fds := make([]int, nfds)
		for i := range fds {
			fds[i] = int(null.Fd())
		}
		base := fdCount(t)
		sent := make(chan error, 1)
		go func() {
			err := rawSend(s, stream, fds)
			s.CloseWrite()
			sent <- err
		}()
		msg, err := r.Receive(time.Now().Add(10*time.Second), maxFDs)
		r.Close() // unblocks a sender the receiver stopped reading
		<-sent    // EPIPE is expected when Receive stopped early

		if wantErr != nil {
			if msg != nil || classify(err) != wantErr {
				t.Fatalf("Receive = %v, %v; parseFrame says %v", msg != nil, err, wantErr)
			}
		} else {
			if err != nil {
				t.Fatalf("Receive: %v; parseFrame accepted", err)
			}
			if !reflect.DeepEqual(msg.Header, wantH) || !bytes.Equal(msg.Raw, wantRaw) || len(msg.Files) != nfds {
				t.Fatalf("Receive and parseFrame disagree")
			}
			if n := msg.Close(); n != nfds {
				t.Fatalf("Close = %d, want %d", n, nfds)
			}
		}
		if got := fdCount(t); got != base-1 { // -1: r is closed
			t.Fatalf("fd count %d, want %d", got, base-1)
		}
	})
}
