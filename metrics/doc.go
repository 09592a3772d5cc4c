// Package metrics is onebitd's Prometheus exposition (/metrics), on its own
// prometheus.Registry.
//
// Most series are derived from the event stream: Metrics is an event.Sink,
// fed by the daemon's event.Recorder like the event log and the bus.
//
//	onebitd_requests_total{route,outcome}          a request ended (outcome done|failed); route is
//	                                                its final route: plain, file, shared or fallback
//	onebitd_handoff_phase_seconds{route,phase}     histogram, 50µs … 60s: phase is the transition
//	                                                (listen, share, prefill, adopt, restore, fallback,
//	                                                forward, finish, fail) and its duration is the
//	                                                elapsed_us between that event and the request's
//	                                                previous one; phase "handoff" is the elapsed_us of
//	                                                the event that leaves the handoff (receipt to
//	                                                adopted, restored or fallback)
//	onebitd_fallbacks_total{step,reason_class}     step is one of machine's Step names ("other" for
//	                                                anything else); reason_class is one of the
//	                                                Class* constants, never the reason's text
//	onebitd_inflight_requests                       requests seen and not ended
//	onebitd_decoder_restarts_total                  decoder.starting events after the first one
//	onebitd_provider_restarts_total                 provider.starting events after the first one
//
// Read from the daemon through Config's functions (nil reads 0):
//
//	onebitd_slots_busy, onebitd_queue_depth, onebitd_events_published_total,
//	onebitd_events_dropped_total, onebitd_eventlog_lost_total
//
// And onebitd_build_info{version,revision,goversion} 1, the Go collector
// (go_*) and the process collector (process_*).
//
// No label carries a request id, a share id, a node name or free text: the
// label values are the fixed vocabularies of package machine and of this
// package, so the number of series is bounded whatever the daemon sees.
package metrics
