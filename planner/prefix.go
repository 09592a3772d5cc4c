package planner

import "sync"

// Memory is the per-slot memory of the prompt tokens whose KV the decoder
// holds (doc.go, "Prefix memory"). It is safe for concurrent use.
type Memory struct {
	mu       sync.Mutex
	epoch    uint64 // bumped by ForgetAll
	identity int    // the decoder's, as last observed (Observe)
	slots    []slotMem
}

type slotMem struct {
	tokens    []int // confirmed: cells 0..len-1 hold these tokens' KV
	confirmed bool
	gen       uint64 // bumped by Take and Forget
}

// Ticket is a request's claim on a slot's memory, from Take to Confirm.
type Ticket struct {
	slot       int
	epoch, gen uint64
	identity   int
}

// NewMemory returns an empty memory of n slots.
func NewMemory(n int) *Memory { return &Memory{slots: make([]slotMem, n)} }

// Held is how many of tokens' first tokens slot holds, confirmed; 0 when
// it holds nothing trusted. The pool's slot choice uses it.
func (m *Memory) Held(slot int, tokens []int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if slot < 0 || slot >= len(m.slots) || !m.slots[slot].confirmed {
		return 0
	}
	return commonPrefix(m.slots[slot].tokens, tokens)
}

// Take claims slot for a request about to use it with tokens: it returns
// the confirmed prefix held (as Held) and makes the slot's memory
// unconfirmed, since the request is about to change what the slot holds.
// Only Confirm with the returned ticket makes it trusted again.
func (m *Memory) Take(slot int, tokens []int) (held int, t Ticket) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if slot < 0 || slot >= len(m.slots) {
		return 0, Ticket{slot: -1}
	}
	s := &m.slots[slot]
	if s.confirmed {
		held = commonPrefix(s.tokens, tokens)
	}
	s.confirmed, s.tokens = false, nil
	s.gen++
	return held, Ticket{slot: slot, epoch: m.epoch, gen: s.gen, identity: m.identity}
}

// Observe records the decoder's identity (the launched decoder's pid: it
// changes when the decoder restarts). A change forgets every slot, as
// ForgetAll, and reports true.
func (m *Memory) Observe(identity int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if identity == m.identity {
		return false
	}
	m.identity = identity
	m.forgetAll()
	return true
}

// Valid reports whether nothing forgot t's slot since Take and the decoder
// is still the one Take saw (identity, as Observe takes it): then the
// prefix Take returned was still in the slot's cells when Valid was called.
func (m *Memory) Valid(t Ticket, identity int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return t.slot >= 0 && t.slot < len(m.slots) && t.epoch == m.epoch && m.slots[t.slot].gen == t.gen &&
		identity == t.identity && identity == m.identity
}

// Confirm records that the slot of t now holds tokens, as the decoder's
// reply confirmed. It is ignored when anything forgot the slot (or every
// slot) since Take. tokens is kept: the caller must not modify it.
func (m *Memory) Confirm(t Ticket, tokens []int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t.slot < 0 || t.slot >= len(m.slots) || t.epoch != m.epoch {
		return false
	}
	s := &m.slots[t.slot]
	if s.gen != t.gen {
		return false
	}
	s.tokens, s.confirmed = tokens, true
	return true
}

// Forget drops what slot holds (an error, a fallback, any doubt).
func (m *Memory) Forget(slot int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if slot < 0 || slot >= len(m.slots) {
		return
	}
	s := &m.slots[slot]
	s.tokens, s.confirmed = nil, false
	s.gen++
}

// ForgetAll drops every slot's memory and voids every ticket in flight:
// the decoder restarted, or something outside onebitd's completion path
// may have evaluated tokens into some slot.
func (m *Memory) ForgetAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgetAll()
}

func (m *Memory) forgetAll() {
	m.epoch++
	for i := range m.slots {
		m.slots[i].tokens, m.slots[i].confirmed = nil, false
		m.slots[i].gen++
	}
}

func commonPrefix(a, b []int) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
