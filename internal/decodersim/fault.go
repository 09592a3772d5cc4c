package decodersim

import (
	"bytes"
	"time"

	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/simfault"
)

// Per-request faults (--fault-from-prompt, a TEST SWITCH; see package
// simfault). A completion's own faults (gen-slow, gen-500) and adopt-refused
// are read from the request's tokens. The faults of a share or restore are
// armed by /tokenize: its content's marker (or none) replaces the armed
// fault, and the next share or restore takes it. onebitd tokenizes every
// request before its handoff, so with one request at a time per simulator
// the fault hits the request that named it.

// genSlowTokenDelay is gen-slow's time per generated token.
const genSlowTokenDelay = 100 * time.Millisecond

// garbageHeader is what share-garbage sends instead of the share header.
var garbageHeader = []byte("\x00\xffnot a share header {")

// armFault remembers the slot-action fault named in text (or clears it).
func (s *Server) armFault(text string) {
	if !s.cfg.FaultFromPrompt {
		return
	}
	f := simfault.Find(text)
	if !f.SlotAction() {
		f = simfault.None
	}
	s.mu.Lock()
	s.armed = f
	s.mu.Unlock()
	if f != simfault.None {
		s.log.Info("fault armed", "fault", string(f))
	}
}

// takeFault returns the armed fault and clears it.
func (s *Server) takeFault() simfault.Fault {
	if !s.cfg.FaultFromPrompt {
		return simfault.None
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.armed
	s.armed = simfault.None
	if f != simfault.None {
		s.log.Info("fault injected", "fault", string(f))
	}
	return f
}

// tokensFault is the fault named by a request's own tokens.
func (s *Server) tokensFault(tokens []int) simfault.Fault {
	if !s.cfg.FaultFromPrompt {
		return simfault.None
	}
	f := simfault.FromTokens(tokens)
	if f != simfault.None {
		s.log.Info("fault injected", "fault", string(f))
	}
	return f
}

// slotActionFault is the answer of a share or restore that takes fault f
// before doing anything, or nil.
func slotActionFault(f simfault.Fault, action string) *apiError {
	switch f {
	case simfault.Dec500:
		return apiErr(errServer, "Unable to %s slot: simulated server error (fault dec-500)", action)
	case simfault.Dec501:
		if action == "share" {
			return apiErr(errNotSupported, "no shareable region")
		}
		return apiErr(errNotSupported, "This server does not support slots action. Start it with `--slot-save-path`")
	}
	return nil
}

// shareFaultMessage turns the share message into the one fault f sends:
// a header that is not JSON, or the fds repeated up to fdpass.MaxFDs.
func shareFaultMessage(f simfault.Fault, raw []byte, fds []int) ([]byte, []int) {
	switch f {
	case simfault.ShareGarbage:
		return bytes.Clone(garbageHeader), fds
	case simfault.ShareExtraFDs:
		many := make([]int, 0, fdpass.MaxFDs)
		for len(many) < fdpass.MaxFDs {
			many = append(many, fds[len(many)%len(fds)])
		}
		return raw, many
	}
	return raw, fds
}

// sleepFault waits d: a slow decoder does not notice that its caller left.
func sleepFault(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	<-t.C
}
