package provjob

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair is a connected unix stream socket pair.
func pair(t testing.TB) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conv := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conv(fds[0]), conv(fds[1])
}

func memfd(t testing.TB) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("job", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "job")
	t.Cleanup(func() { f.Close() })
	return f
}

const layout = `{"version":1,"layout_hash":"ab","regions":[]}`

func sharedJob() *Job {
	return &Job{Version: 1, Route: RouteShared, Tokens: []int{1, 1000, 1001}, Model: "/m.gguf", Start: 1, Layout: []byte(layout)}
}

func TestSendReadJob(t *testing.T) {
	a, b := pair(t)
	files := []*os.File{memfd(t), memfd(t)}
	deadline := time.Now().Add(5 * time.Second)
	if err := SendJob(a, sharedJob(), files, deadline); err != nil {
		t.Fatal(err)
	}
	j, got, err := ReadJob(b, deadline)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseFiles(got)
	if j.Route != RouteShared || j.Start != 1 || len(j.Tokens) != 3 || string(j.Layout) != layout || len(got) != 2 {
		t.Fatalf("job %+v with %d fds", j, len(got))
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(got[0].Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if flags, _ := unix.FcntlInt(got[0].Fd(), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC == 0 {
		t.Error("received fd is not close-on-exec")
	}
	if err := WriteReply(b, Reply{OK: true, NTokens: 2, PrefillMs: 1.5}, deadline); err != nil {
		t.Fatal(err)
	}
	r, err := ReadReply(a, deadline)
	if err != nil || !r.OK || r.NTokens != 2 || r.PrefillMs != 1.5 {
		t.Fatalf("reply %+v %v", r, err)
	}

	// A large file job (12 722 tokens) crosses several segments.
	big := &Job{Version: 1, Route: RouteFile, Tokens: make([]int, 12722), Model: "/m", State: "/s/x.bin"}
	for i := range big.Tokens {
		big.Tokens[i] = 100000 + i
	}
	errc := make(chan error, 1)
	go func() { errc <- SendJob(a, big, nil, deadline) }()
	j, got, err = ReadJob(b, deadline)
	if err != nil || len(j.Tokens) != 12722 || j.Tokens[12721] != 112721 || len(got) != 0 {
		t.Fatalf("big job: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestReadFrameErrors(t *testing.T) {
	frame := func(n uint32, body string) []byte {
		return append(binary.LittleEndian.AppendUint32(nil, n), body...)
	}
	tests := []struct {
		name   string
		send   func(t *testing.T, a *net.UnixConn)
		maxFDs int
		want   error
	}{
		{"short", func(t *testing.T, a *net.UnixConn) { a.Write(frame(10, "{}")); a.CloseWrite() }, 1, ErrShort},
		{"zero length", func(t *testing.T, a *net.UnixConn) { a.Write(frame(0, "")) }, 1, ErrShort},
		{"too large", func(t *testing.T, a *net.UnixConn) { a.Write(frame(MaxJobLen+1, "")) }, 1, ErrTooLarge},
		{"timeout", func(t *testing.T, a *net.UnixConn) { a.Write(frame(10, "{")) }, 1, ErrTimeout},
		{"too many fds", func(t *testing.T, a *net.UnixConn) {
			a.WriteMsgUnix(frame(2, "{}"), unix.UnixRights(int(memfd(t).Fd()), int(memfd(t).Fd())), nil)
		}, 1, ErrCtrunc},
		{"stray fds", func(t *testing.T, a *net.UnixConn) {
			a.Write(frame(2, "{"))
			a.WriteMsgUnix([]byte("}"), unix.UnixRights(int(memfd(t).Fd())), nil)
		}, 1, ErrStrayFDs},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t)
			before := openFDs(t)
			tc.send(t, a)
			_, files, err := ReadFrame(b, MaxJobLen, tc.maxFDs, time.Now().Add(200*time.Millisecond))
			if !errors.Is(err, tc.want) || files != nil {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if after := openFDs(t); after > before+2 { // the test's own memfds
				t.Errorf("%d fds open after the error, %d before", after, before)
			}
		})
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name string
		body string
		nfds int
		want error
		msg  string
	}{
		{"shared", `{"version":1,"route":"shared","tokens":[1,2],"model":"m","start":2,"layout":{"a":1}}`, 1, nil, ""},
		{"file", `{"version":1,"route":"file","tokens":[1],"model":"m","state":"/x.bin"}`, 0, nil, ""},
		{"version 2", `{"version":2,"route":"file","new":true}`, 0, ErrVersion, "got 2"},
		{"version string", `{"version":"2"}`, 0, ErrVersion, ""},
		{"no version", `{"route":"file","tokens":[1],"model":"m","state":"/x"}`, 0, ErrVersion, "got 0"},
		{"unknown key", `{"version":1,"route":"file","tokens":[1],"model":"m","state":"/x","x":1}`, 0, ErrBadJob, `unknown key "x"`},
		{"folded key", `{"version":1,"route":"file","Tokens":[1],"model":"m","state":"/x"}`, 0, ErrBadJob, `unknown key "Tokens"`},
		{"no tokens", `{"version":1,"route":"file","tokens":[],"model":"m","state":"/x"}`, 0, ErrBadJob, "no tokens"},
		{"negative token", `{"version":1,"route":"file","tokens":[-1],"model":"m","state":"/x"}`, 0, ErrBadJob, "not a token id"},
		{"huge token", `{"version":1,"route":"file","tokens":[4294968296],"model":"m","state":"/x"}`, 0, ErrBadJob, "not a token id"},
		{"no model", `{"version":1,"route":"file","tokens":[1],"state":"/x"}`, 0, ErrBadJob, "no model"},
		{"start past end", `{"version":1,"route":"shared","tokens":[1],"model":"m","start":2,"layout":{}}`, 1, ErrBadJob, "start 2"},
		{"file with start", `{"version":1,"route":"file","tokens":[1,2],"model":"m","start":1,"state":"/x"}`, 0, ErrBadJob, "whole prompt"},
		{"file relative state", `{"version":1,"route":"file","tokens":[1],"model":"m","state":"x"}`, 0, ErrBadJob, "absolute"},
		{"file with fds", `{"version":1,"route":"file","tokens":[1],"model":"m","state":"/x"}`, 1, ErrFDMismatch, ""},
		{"shared without fds", `{"version":1,"route":"shared","tokens":[1],"model":"m","layout":{}}`, 0, ErrFDMismatch, ""},
		{"shared without layout", `{"version":1,"route":"shared","tokens":[1],"model":"m"}`, 1, ErrBadJob, "layout object"},
		{"shared layout not object", `{"version":1,"route":"shared","tokens":[1],"model":"m","layout":[1]}`, 1, ErrBadJob, "layout object"},
		{"bad route", `{"version":1,"route":"disk","tokens":[1],"model":"m"}`, 0, ErrBadJob, "route"},
		{"not json", `{`, 0, ErrBadJob, ""},
		{"null", `null`, 0, ErrBadJob, ""},
		{"wrong type", `{"version":1,"route":"file","tokens":"x","model":"m","state":"/x"}`, 0, ErrBadJob, "tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.body), tc.nfds)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err %v, want %v containing %q", err, tc.want, tc.msg)
			}
		})
	}
}

func TestReply(t *testing.T) {
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"ok":true,"n_tokens":3,"prefill_ms":1.5}`, true},
		{`{"ok":false,"reason":"layout hash mismatch"}`, true},
		{`{"ok":false}`, false},
		{`{"ok":true,"reason":"x"}`, false},
		{`{"OK":true}`, false},
		{`{"ok":true,"extra":1}`, false},
		{`{"ok":true,"n_tokens":-1}`, false},
		{`[]`, false},
	} {
		_, err := DecodeReply([]byte(tc.body))
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrBadReply) {
			t.Errorf("%s: %v", tc.body, err)
		}
	}
	long, err := EncodeReply(Reply{Reason: strings.Repeat("é", MaxReasonLen)})
	if err != nil || len(long) > MaxReasonLen+32 {
		t.Errorf("a long reason: %d bytes, %v", len(long), err)
	}
}

// FuzzDecode: a job is outside bytes for the provider. Decode never panics,
// and what it accepts encodes and decodes to the same job.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"version":1,"route":"shared","tokens":[1,2],"model":"m","start":1,"layout":{"a":1}}`), 1)
	f.Add([]byte(`{"version":1,"route":"file","tokens":[1],"model":"m","state":"/x.bin"}`), 0)
	f.Add([]byte(`{"version":1,"version":2}`), 0)
	f.Fuzz(func(t *testing.T, body []byte, nfds int) {
		nfds = min(max(nfds, 0), MaxFDs)
		j, err := Decode(body, nfds)
		if err != nil {
			return
		}
		again, err := Encode(j, nfds)
		if err != nil {
			t.Fatalf("accepted job does not encode: %v", err)
		}
		j2, err := Decode(again, nfds)
		if err != nil || j2.Route != j.Route || len(j2.Tokens) != len(j.Tokens) || j2.Start != j.Start || j2.State != j.State {
			t.Fatalf("round trip: %+v vs %+v (%v)", j2, j, err)
		}
	})
}

// FuzzDecodeReply: a reply is outside bytes for onebitd.
func FuzzDecodeReply(f *testing.F) {
	f.Add([]byte(`{"ok":true,"n_tokens":3,"prefill_ms":1.5}`))
	f.Add([]byte(`{"ok":false,"reason":"x"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := DecodeReply(body)
		if err != nil {
			return
		}
		if _, err := EncodeReply(r); err != nil {
			t.Fatalf("accepted reply does not encode: %v", err)
		}
	})
}

// FuzzReadFrame: bytes as they arrive on the socket.
func FuzzReadFrame(f *testing.F) {
	f.Add(append(binary.LittleEndian.AppendUint32(nil, 2), "{}"...))
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Fuzz(func(t *testing.T, stream []byte) {
		a, b := pair(t)
		go func() { a.Write(stream); a.CloseWrite() }()
		body, files, err := ReadFrame(b, MaxReplyLen, 0, time.Now().Add(time.Second))
		CloseFiles(files)
		if err == nil && (len(stream) < 4 || int(binary.LittleEndian.Uint32(stream)) != len(body)) {
			t.Fatalf("accepted %d bytes from a stream of %d", len(body), len(stream))
		}
	})
}

// TestCall: one job through a listening socket; a peer that closes without
// a reply is ErrShort, one that never answers ErrTimeout.
func TestCall(t *testing.T) {
	path := t.TempDir() + "/p.sock"
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	behave := make(chan string, 3)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for mode := range behave {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			j, files, err := ReadJob(c, time.Now().Add(5*time.Second))
			CloseFiles(files)
			switch {
			case err != nil:
				WriteReply(c, Reply{Reason: err.Error()}, time.Now().Add(time.Second))
			case mode == "ok":
				WriteReply(c, Reply{OK: true, NTokens: len(j.Tokens) - j.Start}, time.Now().Add(time.Second))
			case mode == "silent":
				<-behave // hold the connection until the test is done
			}
			c.Close()
		}
	}()
	files := []*os.File{memfd(t)}
	behave <- "ok"
	if r, err := Call(path, sharedJob(), files, time.Now().Add(5*time.Second)); err != nil || !r.OK || r.NTokens != 2 {
		t.Fatalf("ok: %+v %v", r, err)
	}
	behave <- "close"
	if _, err := Call(path, sharedJob(), files, time.Now().Add(5*time.Second)); !errors.Is(err, ErrShort) {
		t.Fatalf("closed without a reply: %v", err)
	}
	behave <- "silent"
	if _, err := Call(path, sharedJob(), files, time.Now().Add(200*time.Millisecond)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("no reply: %v", err)
	}
	close(behave)
	ln.Close()
	<-done
	if _, err := Call(path, sharedJob(), files, time.Now().Add(time.Second)); err == nil {
		t.Fatal("a call with nobody listening succeeded")
	}
}
