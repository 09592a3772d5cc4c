package handoff

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/fdpass"
)

// fakeDecoder is an in-process decoder: Share really dials the share socket
// and sends the message with fdpass.Send (or whatever the case's share func
// does instead), Adopt and Restore answer what the case says. Its region
// fds are real memfds.
type fakeDecoder struct {
	t   *testing.T
	fds []int // the decoder's KV regions (memfds), closed at cleanup

	// share replaces the default (send a valid message, answer a share_id);
	// it returns the HTTP answer's error.
	share      func(d *fakeDecoder, ctx context.Context, socket string) error
	adoptErr   func(d *fakeDecoder, ctx context.Context) error
	restoreErr func(d *fakeDecoder, ctx context.Context) error
	cancel     context.CancelFunc // the client's: a case may leave mid-step

	mu       sync.Mutex
	held     []*net.UnixConn // connections kept open until cleanup
	nextID   int64
	adopted  []int64
	restored []string
	slotDir  string
}

var _ Decoder = (*fakeDecoder)(nil)

func newFakeDecoder(t *testing.T, nfds int, slotDir string) *fakeDecoder {
	d := &fakeDecoder{t: t, slotDir: slotDir}
	for i := range nfds {
		fd, err := unix.MemfdCreate(fmt.Sprintf("kv-%d", i), unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		d.fds = append(d.fds, fd)
		if err := unix.Ftruncate(fd, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// closeHeld closes the connections the decoder kept open.
func (d *fakeDecoder) closeHeld() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.held {
		c.Close()
	}
	d.held = nil
}

// close releases everything the decoder holds.
func (d *fakeDecoder) close() {
	d.closeHeld()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, fd := range d.fds {
		unix.Close(fd)
	}
	d.fds = nil
}

func (d *fakeDecoder) Share(ctx context.Context, _ int, socket string) (decoder.ShareReply, error) {
	do := d.share
	if do == nil {
		do = sendValid
	}
	if err := do(d, ctx, socket); errors.Is(err, errNoIDAnswer) {
		return decoder.ShareReply{}, nil // a 200 without share_id
	} else if err != nil {
		return decoder.ShareReply{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nextID++
	id := d.nextID
	return decoder.ShareReply{ShareID: &id}, nil
}

func (d *fakeDecoder) AdoptJSON(ctx context.Context, _ int, tokens json.RawMessage, shareID int64) error {
	if d.adoptErr != nil {
		if err := d.adoptErr(d, ctx); err != nil {
			return err
		}
	}
	var toks []int
	if err := json.Unmarshal(tokens, &toks); err != nil {
		return &decoder.APIError{Server: "decoder", Op: "adopt", Status: 400, Message: "tokens: " + err.Error()}
	}
	for i, fd := range d.fds { // the provider wrote into these very regions
		b := make([]byte, len(regionMark))
		if _, err := unix.Pread(fd, b, 0); err != nil || string(b) != regionMark {
			return &decoder.APIError{Server: "decoder", Op: "adopt", Status: 500, Message: fmt.Sprintf("region fd %d holds %q", i, b)}
		}
	}
	d.mu.Lock()
	d.adopted = append(d.adopted, shareID)
	d.mu.Unlock()
	return nil
}

func (d *fakeDecoder) Restore(ctx context.Context, _ int, filename string) (decoder.RestoreReply, error) {
	if d.restoreErr != nil {
		if err := d.restoreErr(d, ctx); err != nil {
			return decoder.RestoreReply{}, err
		}
	}
	b, err := os.ReadFile(d.slotDir + "/" + filename)
	if err != nil {
		return decoder.RestoreReply{}, &decoder.APIError{Server: "decoder", Op: "restore", Status: 400, Message: err.Error()}
	}
	d.mu.Lock()
	d.restored = append(d.restored, filename)
	d.mu.Unlock()
	return decoder.RestoreReply{Filename: filename, NRead: int64(len(b))}, nil
}

func (d *fakeDecoder) hold(c *net.UnixConn) {
	d.mu.Lock()
	d.held = append(d.held, c)
	d.mu.Unlock()
}

// Share behaviours.

// sendValid sends a valid message with every region fd and answers OK.
func sendValid(d *fakeDecoder, _ context.Context, socket string) error {
	return d.sendFrame(socket, frameOf(shareHeader(len(d.fds))), d.fds)
}

// sendFrame dials and writes stream with fds in one sendmsg, then closes.
func (d *fakeDecoder) sendFrame(socket string, stream []byte, fds []int) error {
	_, err := d.sendFrameWait(socket, stream, fds, false)
	return err
}

// sendFrameWait is sendFrame; with consumed it returns only once the
// receiver has read every byte (SIOCOUTQ is 0), or after 10 s.
func (d *fakeDecoder) sendFrameWait(socket string, stream []byte, fds []int, consumed bool) (bool, error) {
	c, err := fdpass.Dial(socket, 5*time.Second)
	if err != nil {
		return false, err
	}
	defer c.Close()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(stream, oob, nil); err != nil {
		return false, fmt.Errorf("fake decoder: send: %w", err)
	}
	if !consumed {
		return false, nil
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return false, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		var ierr error
		rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) })
		if ierr != nil {
			return false, ierr
		}
		if n == 0 {
			return true, nil
		}
		time.Sleep(time.Millisecond) // polling interval
	}
	return false, nil
}

// sendConsumed sends a valid message and returns once onebitd has read it:
// a decoder whose share fails after the message arrived (when the answer
// overtakes the message, the kernel or fdpass closes the fds instead, and
// the count is not this process's to make).
func sendConsumed(d *fakeDecoder, _ context.Context, socket string) error {
	ok, err := d.sendFrameWait(socket, frameOf(shareHeader(len(d.fds))), d.fds, true)
	if err == nil && !ok {
		err = fmt.Errorf("fake decoder: the message was not read within 10s")
	}
	return err
}

// sendRaw sends stream (length prefix included) with every region fd.
func sendRaw(stream []byte) func(*fakeDecoder, context.Context, string) error {
	return func(d *fakeDecoder, _ context.Context, socket string) error {
		return d.sendFrame(socket, stream, d.fds)
	}
}

// sendHeader sends a well-framed header with every region fd.
func sendHeader(hdr string) func(*fakeDecoder, context.Context, string) error {
	return sendRaw(frameOf([]byte(hdr)))
}

// errNoIDAnswer makes Share answer 200 without a share_id.
var errNoIDAnswer = errors.New("answer without share_id")

// noConnect answers OK and never connects.
func noConnect(*fakeDecoder, context.Context, string) error { return nil }

// connectSilent connects, sends nothing, answers OK.
func connectSilent(d *fakeDecoder, _ context.Context, socket string) error {
	c, err := fdpass.Dial(socket, 5*time.Second)
	if err != nil {
		return err
	}
	d.hold(c)
	return nil
}

// answer sends nothing and answers with err.
func answer(err error) func(*fakeDecoder, context.Context, string) error {
	return func(*fakeDecoder, context.Context, string) error { return err }
}

// then runs first, then answers with err.
func then(first func(*fakeDecoder, context.Context, string) error, err error) func(*fakeDecoder, context.Context, string) error {
	return func(d *fakeDecoder, ctx context.Context, socket string) error {
		if ferr := first(d, ctx, socket); ferr != nil {
			return ferr
		}
		return err
	}
}

// hangUntilDone waits for ctx (the share timeout) and answers its error.
func hangUntilDone(_ *fakeDecoder, ctx context.Context, _ string) error {
	<-ctx.Done()
	return fmt.Errorf("fake decoder: share: %w", ctx.Err())
}

// clientLeaves cancels the client's context and waits for the step's ctx
// to end, as an HTTP call does when its request's context is cancelled.
func clientLeaves(op string) func(*fakeDecoder, context.Context, string) error {
	return func(d *fakeDecoder, ctx context.Context, _ string) error {
		d.cancel()
		<-ctx.Done()
		return fmt.Errorf("Post \"http://decoder/slots/0?action=%s\": %w", op, ctx.Err())
	}
}

// clientLeavesAfter runs first (which answers OK), then the client leaves.
func clientLeavesAfter(first func(*fakeDecoder, context.Context, string) error) func(*fakeDecoder, context.Context, string) error {
	return func(d *fakeDecoder, ctx context.Context, socket string) error {
		if err := first(d, ctx, socket); err != nil {
			return err
		}
		d.cancel()
		return nil
	}
}

// stranger has another process (this test binary) connect and send a valid
// message before the decoder does; the decoder then sends its own.
func stranger(d *fakeDecoder, ctx context.Context, socket string) error {
	cmd := exec.Command(os.Args[0], "-helper", "connect", socket)
	out, err := cmd.CombinedOutput() // returns when the handoff hung up on it
	if err != nil {
		return fmt.Errorf("stranger: %v: %s", err, out)
	}
	// The decoder's own connection waits in the backlog: never accepted.
	return sendValid(d, ctx, socket)
}

// removeSocket sends a valid message, then removes the socket file, as an
// operator cleaning the slot dir by hand would.
func removeSocket(d *fakeDecoder, ctx context.Context, socket string) error {
	if err := sendConsumed(d, ctx, socket); err != nil {
		return err
	}
	return os.Remove(socket)
}

// frameOf is the length prefix and hdr.
func frameOf(hdr []byte) []byte {
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(hdr))), hdr...)
}

// apiErr is the decoder's HTTP error answer for op.
func apiErr(op string, status int, typ, msg string) error {
	return &decoder.APIError{Server: "decoder", Op: op, Status: status, Type: typ, Message: msg}
}

// refuse is Adopt/Restore answering err.
func refuse(err error) func(*fakeDecoder, context.Context) error {
	return func(*fakeDecoder, context.Context) error { return err }
}

// lateAnswer is Adopt/Restore answering only when the step's deadline passed.
func lateAnswer(op string) func(*fakeDecoder, context.Context) error {
	return func(_ *fakeDecoder, ctx context.Context) error {
		<-ctx.Done()
		return fmt.Errorf("Post \"http://decoder/slots/0?action=%s\": %w", op, ctx.Err())
	}
}

// leaves is Adopt/Restore when the client leaves during the call.
func leaves(op string) func(*fakeDecoder, context.Context) error {
	return func(d *fakeDecoder, ctx context.Context) error {
		d.cancel()
		<-ctx.Done()
		return fmt.Errorf("Post \"http://decoder/slots/0?action=%s\": %w", op, ctx.Err())
	}
}
