package daemon

import (
	"context"

	"encoding/json"
	"github.com/onebitd/onebitd/handlers"
	"net/http"
	"time"
)

// mux is the daemon's HTTP surface: its own /health (the decoder's answer
// with onebitd's details), /metrics (unless --metrics-listen gives it its
// own listener) and the dashboard (/ui/, /api/), in front of the handlers'
// front. /metrics is behind the client API keys like the rest; the
// dashboard's page is open and its data (/api/) asks for a key.
func (d *Daemon) mux() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /health", d.health)
	m.HandleFunc("GET /v1/health", d.health)
	if d.opts.MetricsListen == "" {
		m.Handle("GET /metrics", handlers.RequireKey(d.keys, d.metrics.Handler()))
	}
	ui := d.hub.Handler()
	m.Handle("/ui/", ui)
	m.Handle("/api/", ui)
	m.Handle("/", d.front)
	return m
}

// Details are onebitd's part of /health: what an operator checks first.
type Details struct {
	Route           string `json:"route"`
	Slots           int    `json:"slots"`
	SlotsFree       int    `json:"slots_free"`
	Queued          int    `json:"queued"`
	InFlight        int    `json:"in_flight"`
	EventsPublished uint64 `json:"events_published"`
	EventsDropped   uint64 `json:"events_dropped"`
	EventLogLost    uint64 `json:"eventlog_lost"`
	Decoder         string `json:"decoder"`
	Provider        string `json:"provider,omitempty"`
}

// HealthDetails returns the daemon's details now.
func (d *Daemon) HealthDetails() Details {
	st := d.pool.Stats()
	det := Details{Route: string(d.route), Slots: st.Slots, SlotsFree: st.Free, Queued: st.Waiting,
		InFlight: d.inflight.count(), Decoder: "ok"}
	if d.bus != nil {
		bs := d.bus.Stats()
		det.EventsPublished, det.EventsDropped = bs.Published, bs.Dropped
	}
	if d.elog != nil {
		det.EventLogLost = d.elog.Stats().Lost
	}
	if d.warm != nil {
		det.Provider = "ok"
		if err := d.warm.Ready(); err != nil {
			det.Provider = err.Error()
		}
	}
	return det
}

// health answers as llama-server does (200 {"status":"ok"}, or 503 in its
// error shape while the decoder is loading or restarting) and adds
// onebitd's details under "onebitd". It stays open without an API key.
func (d *Daemon) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	err := d.dec.Health(ctx)
	if err == nil && d.launched != nil {
		err = d.launched.Ready()
	}
	det := d.HealthDetails()
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	if err != nil {
		det.Decoder = err.Error()
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(map[string]any{
			"error":   map[string]any{"code": http.StatusServiceUnavailable, "message": "decoder unavailable: " + err.Error(), "type": "unavailable_error"},
			"onebitd": det,
		})
		return
	}
	json.NewEncoder(w).Encode(map[string]any{"status": "ok", "onebitd": det})
}
