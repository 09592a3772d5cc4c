package metrics_test

import (
	"net/http"

	"github.com/onebitd/onebitd/event"
	"github.com/onebitd/onebitd/metrics"
)

// The daemon's /metrics: the series derived from events come from the
// recorder; the rest are read at scrape time from the functions given.
func Example() {
	var slotsBusy, queued, published, dropped, lost func() float64 // from slots.Pool, bus.Stats, eventlog.Writer
	m := metrics.New(metrics.Config{
		Version:         "v1.2.3",
		SlotsBusy:       slotsBusy,
		QueueDepth:      queued,
		EventsPublished: published,
		EventsDropped:   dropped,
		EventlogLost:    lost,
	})
	rec := event.NewRecorder("node-a" /* event log, bus, …, */, m)
	_ = rec

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler()) // behind handlers.RequireKey when API keys are on
	_ = mux
}
