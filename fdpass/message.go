package fdpass

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// MaxHeaderLen is the largest header length a receiver accepts. A 56-region
// header is about 6 KiB.
const MaxHeaderLen = 64 << 10

// prefixLen is the size of the little-endian uint32 length prefix.
const prefixLen = 4

// Message is one received share message. The receiver owns Files: hand them
// to a provider (exec.Cmd.ExtraFiles) and call Close when the handoff ends,
// on every path.
type Message struct {
	Header Header     // parsed and validated
	Raw    []byte     // the header JSON verbatim (written to <stem>.json for the provider)
	Files  []*os.File // region fds in fd_index order, close-on-exec set
}

// Close closes every file of m that is still open and returns how many it
// closed (files closed elsewhere are not counted). It is idempotent and safe
// on a nil Message.
func (m *Message) Close() int {
	if m == nil {
		return 0
	}
	n := 0
	for _, f := range m.Files {
		if f != nil && f.Close() == nil {
			n++
		}
	}
	return n
}

// checkLength applies the limits to a length prefix.
func checkLength(n uint32) error {
	switch {
	case n == 0:
		return fmt.Errorf("%w: the length prefix is 0", ErrBadHeader)
	case n > MaxHeaderLen:
		return fmt.Errorf("%w: %d bytes announced, at most %d accepted", ErrHeaderTooLarge, n, MaxHeaderLen)
	}
	return nil
}

// decodeHeader parses raw (the JSON after the length prefix) and validates it
// against nfds passed fds. Unknown fields are refused (a misspelt "fd_index"
// must not read as 0), and so is data after the object. When the strict
// decode fails, a lenient look at "version" decides whether to report
// ErrVersion instead: a newer decoder's header is a version mismatch, not bad
// JSON.
func decodeHeader(raw []byte, nfds int) (Header, error) {
	if h, ok := fastHeader(raw); ok {
		if err := h.Validate(nfds); err != nil {
			return Header{}, err
		}
		return h, nil
	}
	var h Header
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(&h)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = fmt.Errorf("data after the JSON object")
		}
	}
	if err != nil {
		var v struct {
			Version *int `json:"version"`
		}
		if json.Unmarshal(raw, &v) == nil && v.Version != nil && *v.Version != HeaderVersion {
			return Header{}, fmt.Errorf("%w: got version %d, want %d", ErrVersion, *v.Version, HeaderVersion)
		}
		return Header{}, fmt.Errorf("%w: %w", ErrBadHeader, err)
	}
	if err := h.Validate(nfds); err != nil {
		return Header{}, err
	}
	return h, nil
}

// parseFrame is the pure form of Receive's parsing, for tests and fuzzing:
// stream holds the bytes as they would arrive on the socket, nfds the number
// of fds that arrived with them. It returns the header and the raw JSON (a
// sub-slice of stream). Like Receive it ignores bytes after the message.
func parseFrame(stream []byte, nfds int) (Header, []byte, error) {
	if len(stream) < prefixLen {
		return Header{}, nil, fmt.Errorf("%w: got %d of %d length bytes", ErrShortMessage, len(stream), prefixLen)
	}
	n := binary.LittleEndian.Uint32(stream)
	if err := checkLength(n); err != nil {
		return Header{}, nil, err
	}
	body := stream[prefixLen:]
	if uint64(len(body)) < uint64(n) {
		return Header{}, nil, fmt.Errorf("%w: got %d of %d header bytes", ErrShortMessage, len(body), n)
	}
	raw := body[:n]
	h, err := decodeHeader(raw, nfds)
	if err != nil {
		return Header{}, nil, err
	}
	return h, raw, nil
}
