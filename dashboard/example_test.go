package dashboard_test

import (
	"net/http"

	"github.com/onebitd/onebitd/dashboard"
	"github.com/onebitd/onebitd/event"
)

// The in-process dashboard of `onebitd serve`: the hub is one more sink of
// the recorder, and its handler is mounted at /ui/ and /api/ beside the
// daemon's own routes. With API keys on, pass them as CheckKey instead of
// wrapping the handler in the front's key check (the page must load to ask
// for the key).
func Example() {
	keys := []string{"k1"} // --api-key-file
	hub := dashboard.NewHub(dashboard.Config{CheckKey: dashboard.KeyChecker(keys)})
	defer hub.Close() // before http.Server.Shutdown: ends the SSE streams

	rec := event.NewRecorder("node-a" /* event log, bus, metrics, …, */, hub)
	_ = rec // the daemon's machines emit through rec

	mux := http.NewServeMux()
	mux.Handle("/ui/", hub.Handler())
	mux.Handle("/api/", hub.Handler())
	_ = &http.Server{Handler: mux}
}
