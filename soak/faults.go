package soak

import "github.com/onebitd/onebitd/internal/simfault"

// outcome is how a request ended.
type outcome int

const (
	outIdentical  outcome = iota // answered, text identical to the plain answer
	outCleanError                // a llama-server-shaped error (the decoder itself failed)
	outClientLeft                // the client hung up mid-stream, as told
	outViolation                 // anything else
)

// harness is what the harness itself does to a request.
type harness int

const (
	hNone        harness = iota
	hClientGone          // leave after the first stream event
	hKillDecoder         // SIGKILL the decoder after the first stream event
)

// Fault is one kind of fault the soak injects.
type Fault struct {
	Name     string         // the table's row
	Marker   simfault.Fault // the prompt's marker (None: no marker)
	Harness  harness
	Shared   bool     // shared route only
	Expect   outcome  // the only acceptable outcome
	Fallback bool     // the handoff must fall back (the route header says fallback)
	Steps    []string // a fallback's failed step must be one of these (the event log's "step")
}

var (
	atProvider = []string{"provider"}
	atSlotOp   = []string{"share", "restore"}
	atReceive  = []string{"receive"}
)

// Faults is every row of the table, in order.
var Faults = []Fault{
	{Name: "none", Expect: outIdentical},
	{Name: "provider fails", Marker: simfault.ProvFail, Expect: outIdentical, Fallback: true, Steps: atProvider},
	{Name: "provider hangs", Marker: simfault.ProvHang, Expect: outIdentical, Fallback: true, Steps: atProvider},
	{Name: "provider slow (succeeds)", Marker: simfault.ProvSlow, Expect: outIdentical},
	{Name: "provider writes, then fails", Marker: simfault.ProvWriteThenFail, Expect: outIdentical, Fallback: true, Steps: atProvider},
	{Name: "provider keeps writing", Marker: simfault.ProvKeepWriting, Expect: outIdentical, Fallback: true, Steps: atProvider},
	{Name: "decoder 500 on share/restore", Marker: simfault.Dec500, Expect: outIdentical, Fallback: true, Steps: atSlotOp},
	{Name: "decoder 501 on share/restore", Marker: simfault.Dec501, Expect: outIdentical, Fallback: true, Steps: atSlotOp},
	{Name: "decoder refuses the share_id", Marker: simfault.AdoptRefused, Shared: true, Expect: outIdentical, Fallback: true, Steps: []string{"adopt"}},
	{Name: "slow share (past the accept deadline)", Marker: simfault.ShareSlow, Shared: true, Expect: outIdentical, Fallback: true, Steps: []string{"receive", "share"}},
	{Name: "share never connects", Marker: simfault.ShareNoConnect, Shared: true, Expect: outIdentical, Fallback: true, Steps: atReceive},
	{Name: "share sends 253 fds", Marker: simfault.ShareExtraFDs, Shared: true, Expect: outIdentical, Fallback: true, Steps: atReceive},
	{Name: "share header is garbage", Marker: simfault.ShareGarbage, Shared: true, Expect: outIdentical, Fallback: true, Steps: atReceive},
	{Name: "decoder 500 on the completion", Marker: simfault.Gen500, Expect: outCleanError},
	{Name: "client gone mid-stream", Marker: simfault.GenSlow, Harness: hClientGone, Expect: outClientLeft},
	{Name: "decoder killed mid-stream", Marker: simfault.GenSlow, Harness: hKillDecoder, Expect: outCleanError},
}

// noneCopies is how many fault-free requests a deck holds.
const noneCopies = 4
