package eventlog

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/machine"
)

// emitWalk emits the events of one successful shared-route request (at most
// max of them) through rec and returns how many it emitted.
func emitWalk(rec *event.Recorder, id string, slot int, shareID int64, start time.Time, max int) int {
	steps := []struct {
		ev       machine.Event
		from, to machine.State
	}{
		{machine.EvListen, machine.Received, machine.Listening},
		{machine.EvShare, machine.Listening, machine.Shared},
		{machine.EvPrefill, machine.Shared, machine.Prefilled},
		{machine.EvAdopt, machine.Prefilled, machine.Adopted},
		{machine.EvForward, machine.Adopted, machine.Forwarding},
		{machine.EvFinish, machine.Forwarding, machine.Done},
	}
	n := 0
	for i, s := range steps {
		if n == max {
			break
		}
		e := &event.Event{Time: start.Add(time.Duration(i) * time.Millisecond), RequestID: id, Slot: slot,
			Route: "shared", Event: string(s.ev), From: string(s.from), To: string(s.to),
			ElapsedUS: int64(i) * 1000}
		switch s.ev {
		case machine.EvShare:
			e.ShareID, e.NFDs, e.BytesMapped = &shareID, 56, 1<<30
		case machine.EvPrefill:
			e.NTokens = 512
			e.ProviderExit = new(int)
		case machine.EvAdopt:
			e.ShareID, e.NTokens = &shareID, 512
			e.Cleanup = &event.Cleanup{FDsClosed: 56, FilesRemoved: 3}
		case machine.EvForward:
			e.HTTPStatus = 0
		case machine.EvFinish:
			e.HTTPStatus = 200
		}
		rec.Emit(e)
		n++
	}
	return n
}

// appendFile appends s to the file at path.
func appendFile(t testing.TB, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// cpuTime is the process's user+system CPU time: on a shared machine,
// events per CPU-second is the honest throughput figure.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
