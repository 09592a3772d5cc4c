package event

import (
	"bytes"
	"slices"
	"strconv"
	"sync"
	"testing"
)

// lineSink records the lines it is handed, and the events' seq.
type lineSink struct {
	mu    sync.Mutex
	seqs  []uint64
	lines [][]byte
	plain int // calls of Emit (not EmitLine)
}

func (s *lineSink) Emit(e *Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.plain++
	s.seqs = append(s.seqs, e.Seq)
	s.lines = append(s.lines, append(e.AppendJSON(nil), '\n'))
}

func (s *lineSink) EmitLine(e *Event, line []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seqs = append(s.seqs, e.Seq)
	s.lines = append(s.lines, line)
}

// memCommitter is a Committer whose lines become durable only when a
// Commit runs: it checks that no sink after it sees a line before that.
type memCommitter struct {
	lineSink
	mu2      sync.Mutex
	appended uint64
	durable  uint64
	commits  int
	waits    bool
}

func (c *memCommitter) AppendLine(e *Event, line []byte) uint64 {
	c.EmitLine(e, line)
	if !c.waits {
		return 0
	}
	c.mu2.Lock()
	defer c.mu2.Unlock()
	c.appended++
	return c.appended
}

func (c *memCommitter) Commit(t uint64) {
	c.mu2.Lock()
	defer c.mu2.Unlock()
	if t > c.durable {
		c.durable = c.appended // one "fsync" for everything appended so far
		c.commits++
	}
}

func (c *memCommitter) isDurable(n int) bool {
	c.mu2.Lock()
	defer c.mu2.Unlock()
	return uint64(n) <= c.durable
}

// afterSink checks, as each line arrives, that the committer made it durable.
type afterSink struct {
	lineSink
	c     *memCommitter
	early int
}

func (s *afterSink) EmitLine(e *Event, line []byte) {
	if s.c.waits && !s.c.isDurable(int(e.Seq)) {
		s.mu.Lock()
		s.early++
		s.mu.Unlock()
	}
	s.lineSink.EmitLine(e, line)
}

// TestRecorderEncodesOnceInSeqOrder: 8 goroutines emit at once; every sink
// sees every event in seq order, the LineSinks get the very same bytes (one
// encoding), a plain Sink still gets the event, the bytes are AppendJSON's,
// and a sink after a waiting Committer sees an event only once it is
// durable.
func TestRecorderEncodesOnceInSeqOrder(t *testing.T) {
	for _, waits := range []bool{false, true} {
		t.Run("committer waits="+strconv.FormatBool(waits), func(t *testing.T) {
			first, plain := new(lineSink), new(lineSink)
			c := &memCommitter{waits: waits}
			after := &afterSink{c: c}
			rec := NewRecorder("n1", first, plain, c, after)
			rec.before[1] = SinkFunc(plain.Emit) // hide EmitLine: a plain Sink
			const workers, each = 8, 200
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						rec.Emit(&Event{RequestID: "r-" + strconv.Itoa(w) + "-" + strconv.Itoa(i), Route: "plain",
							Event: "forward", From: "received", To: "forwarding"})
					}
				}()
			}
			wg.Wait()
			want := make([]uint64, workers*each)
			for i := range want {
				want[i] = uint64(i + 1)
			}
			for name, s := range map[string]*lineSink{"first": first, "plain": plain, "committer": &c.lineSink,
				"after": &after.lineSink} {
				if !slices.Equal(s.seqs, want) {
					t.Fatalf("%s saw seqs out of order or missing (%d of %d)", name, len(s.seqs), len(want))
				}
			}
			for i := range want {
				l := first.lines[i]
				if &l[0] != &c.lines[i][0] || &l[0] != &after.lines[i][0] {
					t.Fatalf("seq %d: the sinks got different buffers: encoded more than once", i+1)
				}
				if !bytes.Equal(l, plain.lines[i]) {
					t.Fatalf("seq %d: line %q, AppendJSON %q", i+1, l, plain.lines[i])
				}
				if e, err := Parse(l); err != nil || e.Seq != uint64(i+1) || e.Node != "n1" || e.Boot != rec.Boot {
					t.Fatalf("line %q: %+v %v", l, e, err)
				}
			}
			if plain.plain != len(want) || first.plain != 0 {
				t.Fatalf("Emit calls: plain sink %d, line sink %d", plain.plain, first.plain)
			}
			if after.early != 0 {
				t.Fatalf("%d events reached the sink after the committer before they were durable", after.early)
			}
			if waits {
				t.Logf("%d commits for %d events", c.commits, len(want))
			}
		})
	}
}

func TestRecorderShutdown(t *testing.T) {
	var m Mem
	rec := NewRecorder("n1", &m)
	rec.Emit(&Event{Event: "decoder.ready"})
	rec.Shutdown(2)
	evs := m.Events()
	if len(evs) != 2 || evs[1].Event != Shutdown || evs[1].Seq != 2 || evs[1].InFlight == nil || *evs[1].InFlight != 2 {
		t.Fatalf("%+v", evs)
	}
	line := evs[1].AppendJSON(nil)
	if !bytes.Contains(line, []byte(`"event":"eventlog.shutdown"`)) || !bytes.HasSuffix(line, []byte(`,"in_flight":2}`)) {
		t.Fatalf("%s", line)
	}
}
