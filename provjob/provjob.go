package provjob

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/internal/jsonexact"
)

// Version is the only job version this package speaks.
const Version = 1

// Limits.
const (
	MaxTokens    = 1 << 24  // tokens of one job
	MaxJobLen    = 16 << 24 // bytes of a job body (MaxTokens ids of up to 10 digits, plus the layout)
	MaxLayoutLen = 64 << 10 // bytes of the layout object (fdpass.MaxHeaderLen)
	MaxReplyLen  = 64 << 10 // bytes of a reply body
	MaxReasonLen = 1024     // bytes of a reply's reason
	MaxFDs       = 253      // fds of one job (SCM_MAX_FD)
)

// Routes.
const (
	RouteShared = "shared"
	RouteFile   = "file"
)

// Errors. Every error of this package wraps one of them, with the facts.
var (
	ErrBadJob     = errors.New("provjob: the job is not valid")
	ErrVersion    = errors.New("provjob: the job speaks another version")
	ErrBadReply   = errors.New("provjob: the provider's reply is not valid")
	ErrTooLarge   = errors.New("provjob: the message is larger than accepted")
	ErrShort      = errors.New("provjob: the peer closed the connection before the whole message")
	ErrTimeout    = errors.New("provjob: the peer did not send the whole message in time")
	ErrCtrunc     = errors.New("provjob: more fds arrived than accepted (kernel set MSG_CTRUNC)")
	ErrStrayFDs   = errors.New("provjob: fds arrived after the start of the message")
	ErrFDMismatch = errors.New("provjob: the job's fds do not match its route")
)

// Job is one prefill job (see doc.go).
type Job struct {
	Version int             `json:"version"`
	Route   string          `json:"route"`
	Tokens  []int           `json:"tokens"`
	Model   string          `json:"model"`
	Start   int             `json:"start,omitempty"`
	Layout  json.RawMessage `json:"layout,omitempty"`
	State   string          `json:"state,omitempty"`
}

// Reply is the provider's answer to a job (see doc.go).
type Reply struct {
	OK        bool    `json:"ok"`
	NTokens   int     `json:"n_tokens,omitempty"`
	PrefillMs float64 `json:"prefill_ms,omitempty"`
	Reason    string  `json:"reason,omitempty"`
}

var jobKeys = map[string]bool{"version": true, "route": true, "tokens": true, "model": true, "start": true, "layout": true, "state": true}

// Validate checks j for a job carrying nfds fds.
func (j *Job) Validate(nfds int) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadJob}, a...)...)
	}
	if j.Version != Version {
		return fmt.Errorf("%w: got %d, want %d", ErrVersion, j.Version, Version)
	}
	switch {
	case len(j.Tokens) == 0:
		return bad("no tokens")
	case len(j.Tokens) > MaxTokens:
		return bad("%d tokens, at most %d", len(j.Tokens), MaxTokens)
	case j.Model == "":
		return bad("no model")
	case j.Start < 0 || j.Start > len(j.Tokens):
		return bad("start %d outside 0..%d", j.Start, len(j.Tokens))
	}
	for i, t := range j.Tokens {
		if t < 0 || t > math.MaxInt32 {
			return bad("token %d at index %d is not a token id", t, i)
		}
	}
	switch j.Route {
	case RouteShared:
		l := bytes.TrimSpace(j.Layout)
		switch {
		case len(l) == 0 || l[0] != '{':
			return bad("the shared route needs a layout object")
		case len(l) > MaxLayoutLen:
			return bad("layout of %d bytes, at most %d", len(l), MaxLayoutLen)
		case j.State != "":
			return bad("the shared route takes no state file")
		case nfds == 0:
			return fmt.Errorf("%w: a shared job without region fds", ErrFDMismatch)
		}
	case RouteFile:
		switch {
		case !filepath.IsAbs(j.State):
			return bad("the file route needs an absolute state path, got %q", j.State)
		case len(j.Layout) > 0:
			return bad("the file route takes no layout")
		case j.Start != 0:
			return bad("the file route always hands over the whole prompt (start %d)", j.Start)
		case nfds != 0:
			return fmt.Errorf("%w: a file job with %d fds", ErrFDMismatch, nfds)
		}
	default:
		return bad("route %q: want shared or file", j.Route)
	}
	return nil
}

// Encode validates j (for nfds fds) and returns its body.
func Encode(j *Job, nfds int) ([]byte, error) {
	if err := j.Validate(nfds); err != nil {
		return nil, err
	}
	b, err := json.Marshal(j)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadJob, err)
	}
	if len(b) > MaxJobLen {
		return nil, fmt.Errorf("%w: a job of %d bytes, at most %d", ErrTooLarge, len(b), MaxJobLen)
	}
	return b, nil
}

// Decode parses a job body (outside bytes) that arrived with nfds fds and
// validates it.
func Decode(body []byte, nfds int) (*Job, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(body, &keys); err != nil || keys == nil {
		// A newer sender's job is a version mismatch, not bad JSON.
		return nil, fmt.Errorf("%w: not a JSON object: %v", ErrBadJob, err)
	}
	var j Job
	if err := jsonexact.Unmarshal(body, &j); err != nil {
		if v, ok := keys["version"]; ok && string(bytes.TrimSpace(v)) != "1" {
			return nil, fmt.Errorf("%w: got %s, want %d", ErrVersion, truncate(v, 16), Version)
		}
		return nil, fmt.Errorf("%w: %v", ErrBadJob, err)
	}
	if j.Version != Version {
		return nil, fmt.Errorf("%w: got %d, want %d", ErrVersion, j.Version, Version)
	}
	for k := range keys {
		if !jobKeys[k] {
			return nil, fmt.Errorf("%w: unknown key %q", ErrBadJob, truncate([]byte(k), 32))
		}
	}
	if err := j.Validate(nfds); err != nil {
		return nil, err
	}
	return &j, nil
}

// EncodeReply validates r and returns its body; the reason is cut to
// MaxReasonLen bytes.
func EncodeReply(r Reply) ([]byte, error) {
	if len(r.Reason) > MaxReasonLen {
		r.Reason = string(bytes.ToValidUTF8([]byte(r.Reason[:MaxReasonLen]), nil))
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

func (r *Reply) validate() error {
	switch {
	case r.OK && r.Reason != "":
		return fmt.Errorf("%w: ok with a reason", ErrBadReply)
	case !r.OK && r.Reason == "":
		return fmt.Errorf("%w: a failure without a reason", ErrBadReply)
	case r.NTokens < 0 || r.PrefillMs < 0 || math.IsNaN(r.PrefillMs) || math.IsInf(r.PrefillMs, 0):
		return fmt.Errorf("%w: n_tokens %d prefill_ms %v", ErrBadReply, r.NTokens, r.PrefillMs)
	case len(r.Reason) > MaxReasonLen:
		return fmt.Errorf("%w: a reason of %d bytes", ErrBadReply, len(r.Reason))
	}
	return nil
}

var replyKeys = map[string]bool{"ok": true, "n_tokens": true, "prefill_ms": true, "reason": true}

// DecodeReply parses a reply body (outside bytes).
func DecodeReply(body []byte) (Reply, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(body, &keys); err != nil || keys == nil {
		return Reply{}, fmt.Errorf("%w: not a JSON object: %v", ErrBadReply, err)
	}
	if _, ok := keys["ok"]; !ok {
		return Reply{}, fmt.Errorf("%w: no \"ok\"", ErrBadReply)
	}
	for k := range keys {
		if !replyKeys[k] {
			return Reply{}, fmt.Errorf("%w: unknown key %q", ErrBadReply, truncate([]byte(k), 32))
		}
	}
	var r Reply
	if err := jsonexact.Unmarshal(body, &r); err != nil {
		return Reply{}, fmt.Errorf("%w: %v", ErrBadReply, err)
	}
	if err := r.validate(); err != nil {
		return Reply{}, err
	}
	return r, nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// WriteFrame writes one frame: the length of body, body, and fds in one
// SCM_RIGHTS message with the first byte. The caller keeps its fds.
func WriteFrame(conn *net.UnixConn, body []byte, fds []int, deadline time.Time) error {
	if len(fds) > MaxFDs {
		return fmt.Errorf("%w: %d fds, at most %d", ErrTooLarge, len(fds), MaxFDs)
	}
	if err := conn.SetWriteDeadline(deadline); err != nil {
		return fmt.Errorf("provjob: set write deadline: %w", err)
	}
	buf := make([]byte, 4+len(body))
	binary.LittleEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, _, err := conn.WriteMsgUnix(buf, oob, nil)
	if err == nil && n < len(buf) {
		_, err = conn.Write(buf[n:])
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("%w: writing %d bytes", ErrTimeout, len(buf))
		}
		return fmt.Errorf("provjob: send %d bytes and %d fds: %w", len(buf), len(fds), err)
	}
	return nil
}

// ReadFrame reads one frame of at most maxLen body bytes and maxFDs fds
// (clamped to MaxFDs) before deadline (zero: none). On error every fd that
// arrived is closed; on success the caller owns files.
func ReadFrame(conn *net.UnixConn, maxLen, maxFDs int, deadline time.Time) (body []byte, files []*os.File, err error) {
	maxFDs = min(max(maxFDs, 0), MaxFDs)
	var fds []int
	defer func() {
		if err != nil {
			for _, fd := range fds {
				_ = unix.Close(fd)
			}
		}
	}()
	if err := conn.SetReadDeadline(deadline); err != nil {
		return nil, nil, fmt.Errorf("provjob: set read deadline: %w", err)
	}
	oob := make([]byte, unix.CmsgLen(4*maxFDs)) // CmsgLen, not CmsgSpace: see fdpass.Receive
	var prefix [4]byte
	got, segments := 0, 0
	read := func(p []byte) (int, error) {
		n, oobn, flags, _, err := conn.ReadMsgUnix(p, oob)
		if oobn > 0 {
			msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
			if perr != nil {
				return 0, fmt.Errorf("provjob: parse control message: %w", perr)
			}
			before := len(fds)
			for i := range msgs {
				if msgs[i].Header.Level == unix.SOL_SOCKET && msgs[i].Header.Type == unix.SCM_RIGHTS {
					rights, rerr := unix.ParseUnixRights(&msgs[i])
					if rerr != nil {
						return 0, fmt.Errorf("provjob: parse SCM_RIGHTS: %w", rerr)
					}
					fds = append(fds, rights...)
				}
			}
			if len(fds) > before && segments > 0 {
				return 0, fmt.Errorf("%w: %d fds with segment %d", ErrStrayFDs, len(fds)-before, segments+1)
			}
		}
		if n > 0 {
			segments++
		}
		switch {
		case errors.Is(err, io.EOF) || err == nil && n == 0:
			return 0, fmt.Errorf("%w: got %d bytes", ErrShort, got)
		case err != nil && errors.Is(err, os.ErrDeadlineExceeded):
			return 0, fmt.Errorf("%w (%d bytes so far)", ErrTimeout, got)
		case err != nil:
			return 0, fmt.Errorf("provjob: receive: %w", err)
		case flags&unix.MSG_CTRUNC != 0 || len(fds) > maxFDs:
			return 0, fmt.Errorf("%w: %d fds kept, the limit is %d", ErrCtrunc, len(fds), maxFDs)
		}
		got += n
		return n, nil
	}
	full := func(p []byte) error {
		for i := 0; i < len(p); {
			n, err := read(p[i:])
			if err != nil {
				return err
			}
			i += n
		}
		return nil
	}
	if err := full(prefix[:]); err != nil {
		return nil, nil, err
	}
	n := binary.LittleEndian.Uint32(prefix[:])
	switch {
	case n == 0:
		return nil, nil, fmt.Errorf("%w: the length prefix is 0", ErrShort)
	case uint64(n) > uint64(maxLen):
		return nil, nil, fmt.Errorf("%w: %d bytes announced, at most %d", ErrTooLarge, n, maxLen)
	}
	// Grow with the bytes that arrive: a large announced length does not
	// make a short message allocate for it.
	body = make([]byte, 0, min(int(n), 1<<20))
	for len(body) < int(n) {
		k := min(int(n)-len(body), 1<<20)
		start := len(body)
		body = append(body, make([]byte, k)...)
		if err := full(body[start:]); err != nil {
			return nil, nil, err
		}
	}
	files = make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), fmt.Sprintf("job-fd-%d", i))
	}
	return body, files, nil
}

// SendJob encodes j and sends it with files' fds (onebitd's side).
func SendJob(conn *net.UnixConn, j *Job, files []*os.File, deadline time.Time) error {
	body, err := Encode(j, len(files))
	if err != nil {
		return err
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	return WriteFrame(conn, body, fds, deadline)
}

// ReadJob reads and decodes one job (the provider's side). On error every
// received fd is closed; on success the caller owns files and must close
// them before it replies.
func ReadJob(conn *net.UnixConn, deadline time.Time) (*Job, []*os.File, error) {
	body, files, err := ReadFrame(conn, MaxJobLen, MaxFDs, deadline)
	if err != nil {
		return nil, nil, err
	}
	j, err := Decode(body, len(files))
	if err != nil {
		CloseFiles(files)
		return nil, nil, err
	}
	return j, files, nil
}

// WriteReply sends r (the provider's side).
func WriteReply(conn *net.UnixConn, r Reply, deadline time.Time) error {
	body, err := EncodeReply(r)
	if err != nil {
		return err
	}
	return WriteFrame(conn, body, nil, deadline)
}

// ReadReply reads and decodes the reply to a job (onebitd's side). A reply
// that carries fds is refused (they are closed).
func ReadReply(conn *net.UnixConn, deadline time.Time) (Reply, error) {
	body, files, err := ReadFrame(conn, MaxReplyLen, 0, deadline)
	if err != nil {
		return Reply{}, err
	}
	CloseFiles(files)
	return DecodeReply(body)
}

// CloseFiles closes every non-nil file and returns how many it closed.
func CloseFiles(files []*os.File) int {
	n := 0
	for _, f := range files {
		if f != nil && f.Close() == nil {
			n++
		}
	}
	return n
}

// Call is onebitd's side of one job: it connects to the warm provider's
// socket at path, sends j with files' fds, waits for the reply until
// deadline and closes the connection. files stay open (the caller closes
// its copies). A provider that closes the connection without a reply gives
// ErrShort, one that does not answer in time ErrTimeout: in both cases the
// job failed and the caller kills the provider's process group (DESIGN §2c)
// before it falls back.
func Call(path string, j *Job, files []*os.File, deadline time.Time) (Reply, error) {
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("unix", path)
	if err != nil {
		return Reply{}, fmt.Errorf("provjob: connect to the provider at %s: %w", path, err)
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	if err := SendJob(conn, j, files, deadline); err != nil {
		return Reply{}, err
	}
	return ReadReply(conn, deadline)
}

// ErrSocketInUse: another process serves on the warm provider's socket.
var ErrSocketInUse = errors.New("provjob: another process already serves on the socket")

// Listen is a warm provider's listener (DESIGN §2c): a unix socket at path,
// mode 0600. A socket file left by a killed provider (nobody answers on
// it) is replaced; a live one is refused with ErrSocketInUse; a file that
// is not a socket is never removed.
func Listen(path string) (*net.UnixListener, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	case fi.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("provjob: %s exists and is not a socket", path)
	default:
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: %s", ErrSocketInUse, path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("provjob: probe %s: %w", path, err)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("provjob: remove the stale socket: %w", err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
