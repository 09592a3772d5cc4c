package eventlog

import (
	"errors"
	"fmt"
	"io"
	"iter"
	"os"

	"github.com/onebitd/onebitd/event"
)

// Record is one event and where it was read: a file and line, or a stream
// name and message sequence.
type Record struct {
	Source string
	Line   int
	Offset int64 // bytes of Source consumed through this record (progress)
	Event  event.Event
}

// Source is a sequence of records; a non-nil error ends it.
type Source = iter.Seq2[Record, error]

// Files streams the events of the logs at paths, in order. A torn last line
// of a file is not an error: it is passed to onTorn (if not nil) and the next
// file follows. A file that cannot be read or holds a bad line ends the
// sequence with that error.
func Files(paths []string, onTorn func(TornTail)) Source {
	return func(yield func(Record, error) bool) {
		for _, path := range paths {
			f, err := os.Open(path)
			if err != nil {
				yield(Record{Source: path}, fmt.Errorf("eventlog: %w", err))
				return
			}
			r := NewReader(f, path)
			for {
				e, err := r.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					f.Close()
					yield(Record{Source: path, Line: r.Line()}, err)
					return
				}
				if !yield(Record{Source: path, Line: r.Line(), Offset: r.Offset(), Event: e}, nil) {
					f.Close()
					return
				}
			}
			f.Close()
			if t := r.Torn(); !t.IsZero() && onTorn != nil {
				onTorn(t)
			}
		}
	}
}

// Replay feeds every record of src to a and returns a's report. It stops at
// the first error of src and returns it with the report so far (Finish is
// still called).
func Replay(src Source, a *Auditor) (Report, error) {
	source := "\x00"
	for rec, err := range src {
		if err != nil {
			return a.Finish(), err
		}
		if rec.Source != source {
			source = rec.Source
			a.SetSource(source)
		}
		a.Add(rec.Line, rec.Event)
	}
	return a.Finish(), nil
}
