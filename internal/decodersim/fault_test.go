package decodersim

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/simfault"
	"github.com/onebitd/onebitd/internal/simkv"
)

// faultPrompt is a prompt that names f.
func faultPrompt(f simfault.Fault) string {
	return " the cache of " + simfault.Marker(f) + " the slot and the decoder"
}

// armed tokenizes a prompt naming f, as onebitd does before a handoff.
func armed(t *testing.T, s *simServer, f simfault.Fault) {
	t.Helper()
	if r := s.post("/tokenize", map[string]any{"content": faultPrompt(f), "add_special": true}); r.status != http.StatusOK {
		t.Fatalf("tokenize: %d %s", r.status, r.body)
	}
}

// TestShareFaults: with --fault-from-prompt, the share after the /tokenize
// of a prompt naming a slot-action fault takes that fault, once; the next
// share is clean again.
func TestShareFaults(t *testing.T) {
	cfg := testConfig(t)
	cfg.FaultFromPrompt = true
	cfg.FaultDelay = 300 * time.Millisecond
	s := startSim(t, cfg)
	for _, tc := range []struct {
		fault  simfault.Fault
		status int    // the share's answer
		conn   bool   // the decoder connects
		recv   error  // what receiving the message with maxFDs 64 gives
		slow   bool   // at least FaultDelay before the connection
		errTyp string // error type of a non-200 answer
	}{
		{fault: simfault.Dec500, status: 500, errTyp: "server_error"},
		{fault: simfault.Dec501, status: 501, errTyp: "not_supported_error"},
		{fault: simfault.ShareNoConnect, status: 200},
		{fault: simfault.ShareSlow, status: 200, conn: true, slow: true},
		{fault: simfault.ShareExtraFDs, status: 200, conn: true, recv: fdpass.ErrCtrunc},
		{fault: simfault.ShareGarbage, status: 200, conn: true, recv: fdpass.ErrBadHeader},
		{fault: simfault.ProvFail, status: 200, conn: true}, // not the decoder's: ignored
	} {
		t.Run(string(tc.fault), func(t *testing.T) {
			armed(t, s, tc.fault)
			l := listen(t)
			defer l.Close()
			t0 := time.Now()
			rc := postAsync(s, "/slots/0?action=share", map[string]string{"socket": l.Path()})
			wait := 300 * time.Millisecond // a connection that is not coming
			if tc.conn {
				wait = 10 * time.Second
			}
			conn, err := l.Accept(time.Now().Add(wait))
			if tc.conn != (err == nil) {
				t.Fatalf("accept: %v, want a connection: %v", err, tc.conn)
			}
			if err == nil {
				if tc.slow && time.Since(t0) < cfg.FaultDelay {
					t.Errorf("connected after %v, want at least %v", time.Since(t0), cfg.FaultDelay)
				}
				msg, err := conn.Receive(time.Now().Add(5*time.Second), 64)
				conn.Close()
				if !errors.Is(err, tc.recv) {
					t.Errorf("receive: %v, want %v", err, tc.recv)
				}
				if msg != nil {
					msg.Close()
				}
			}
			r := <-rc
			if r.status != tc.status {
				t.Fatalf("share answered %d %s, want %d", r.status, r.body, tc.status)
			}
			if tc.errTyp != "" {
				if _, typ, _ := r.errorOf(t); typ != tc.errTyp {
					t.Errorf("error type %q, want %q", typ, tc.errTyp)
				}
			}
			// Once: the next share (no tokenize in between) is clean.
			sh := share(t, s, 0)
			sh.msg.Close()
		})
	}
}

// TestFaultArmCleared: a /tokenize without a marker disarms, and without
// --fault-from-prompt a marker is plain text.
func TestFaultArmCleared(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint("fault-from-prompt=", on), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.FaultFromPrompt = on
			s := startSim(t, cfg)
			armed(t, s, simfault.Dec500)
			if on {
				s.post("/tokenize", map[string]any{"content": " the cache"})
			}
			sh := share(t, s, 0)
			sh.msg.Close()
			armed(t, s, simfault.Dec501)
			if on {
				s.post("/tokenize", map[string]any{})
			}
			name := "x.bin"
			if r := s.post("/slots/0?action=save", map[string]string{"filename": name}); r.status != 200 {
				t.Fatalf("save: %d %s", r.status, r.body)
			}
			if r := s.post("/slots/0?action=restore", map[string]string{"filename": name}); r.status != 200 {
				t.Fatalf("restore: %d %s", r.status, r.body)
			}
			// The completion faults need the switch too.
			r := s.post("/completion", map[string]any{"prompt": faultPrompt(simfault.Gen500), "n_predict": 2})
			if on != (r.status == 500) {
				t.Fatalf("gen-500 with the switch %v: %d %s", on, r.status, r.body)
			}
		})
	}
}

// TestRestoreFaults: dec-500 and dec-501 hit a restore too.
func TestRestoreFaults(t *testing.T) {
	cfg := testConfig(t)
	cfg.FaultFromPrompt = true
	s := startSim(t, cfg)
	s.complete(map[string]any{"prompt": " the cache of the slot", "n_predict": 1})
	if r := s.post("/slots/0?action=save", map[string]string{"filename": "a.bin"}); r.status != 200 {
		t.Fatalf("save: %d %s", r.status, r.body)
	}
	for _, tc := range []struct {
		fault  simfault.Fault
		status int
	}{{simfault.Dec500, 500}, {simfault.Dec501, 501}, {simfault.GenSlow, 200}} {
		armed(t, s, tc.fault)
		if r := s.post("/slots/0?action=restore", map[string]string{"filename": "a.bin"}); r.status != tc.status {
			t.Errorf("%s: restore answered %d %s, want %d", tc.fault, r.status, r.body, tc.status)
		}
	}
}

// TestAdoptRefusedFault: an adopt whose tokens name adopt-refused is refused
// with the share_id message, a valid share_id notwithstanding; the same
// share is then adopted with other tokens.
func TestAdoptRefusedFault(t *testing.T) {
	cfg := testConfig(t)
	cfg.FaultFromPrompt = true
	s := startSim(t, cfg)
	sh := share(t, s, 0)
	defer sh.msg.Close()
	bad := simkv.Tokenize(faultPrompt(simfault.AdoptRefused), true)
	r := s.post("/slots/0?action=adopt", map[string]any{"tokens": bad, "share_id": sh.reply.ShareID})
	if r.status != 400 {
		t.Fatalf("adopt of a refused prompt: %d %s", r.status, r.body)
	}
	if _, _, msg := r.errorOf(t); !strings.Contains(msg, "is not the pending share") {
		t.Errorf("message %q", msg)
	}
	good := simkv.Tokenize(" the cache", true)
	if r := s.post("/slots/0?action=adopt", map[string]any{"tokens": good, "share_id": sh.reply.ShareID}); r.status != 200 {
		t.Fatalf("adopt: %d %s", r.status, r.body)
	}
}

// TestGenFaults: gen-500 answers llama-server's error shape before
// generating; gen-slow spends genSlowTokenDelay per token and gives the
// same text.
func TestGenFaults(t *testing.T) {
	cfg := testConfig(t)
	cfg.FaultFromPrompt = true
	s := startSim(t, cfg)
	r := s.post("/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": faultPrompt(simfault.Gen500)}}})
	if code, typ, _ := r.errorOf(t); r.status != 500 || code != 500 || typ != "server_error" {
		t.Fatalf("gen-500: %d %s", r.status, r.body)
	}
	plain := startSim(t, testConfig(t))
	body := func() map[string]any {
		return map[string]any{"prompt": faultPrompt(simfault.GenSlow), "n_predict": 3}
	}
	want := plain.complete(body())
	t0 := time.Now()
	got := s.complete(body())
	if d := time.Since(t0); d < 3*genSlowTokenDelay {
		t.Errorf("gen-slow took %v for 3 tokens", d)
	}
	if got.Content != want.Content {
		t.Errorf("gen-slow text %q, plain %q", got.Content, want.Content)
	}
}
