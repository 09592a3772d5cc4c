// Package dashboard is onebitd's live dashboard: a Hub that consumes handoff
// events (in process as an event.Sink, or from NATS with Subscribe) and an
// http.Handler that serves the page and its API. The page is embedded (no
// CDN, no npm, works offline) and written in plain JavaScript.
//
// # Routes (Handler)
//
//	GET /ui/                 the page (index.html, app.js, style.css)
//	GET /api/events          Server-Sent Events, see below
//	GET /api/requests/{id}   {"request_id", "timelines": [{node, boot, slot, route, outcome,
//	                         elapsed_us, events: [event…]}]}: the events `onebitd replay
//	                         --request ID` prints, for every node that had that id; 404 once the
//	                         request left the hub's memory (then use replay on the event log)
//
//	GET /api/session         204 when the API may be read, 401 when a key is wanted
//	POST /api/session        form field key: opens a session (cookie onebitd_dashboard,
//	                         HttpOnly, SameSite=Strict, 12h) when Config.CheckKey accepts it
//
// With Config.CheckKey set (API keys on), /api/* needs the session cookie
// or the key in "Authorization: Bearer KEY" / "X-Api-Key: KEY" (scripts);
// the page (/ui/, static files without data) stays open and asks for the
// key, because a browser's EventSource cannot send an Authorization header.
//
// The page finds the API relative to its own URL, so the handler can be
// mounted under any prefix (StripPrefix) as long as /ui/ and /api/ share it.
//
// # /api/events
//
// Frames (the "event:" field):
//
//	snapshot  first frame, and again after a resync: {"epoch", "seq", "requests": [[event…]…],
//	          "lifecycle": [event…], "points": [[n_tokens, handoff_us, route, node]…], "stats"}
//	ev        one event (id "<epoch>-<seq>"), the same JSON as on NATS and in the event log
//	stats     at most every StatsInterval while something changed: counts per route and outcome,
//	          per fallback step and reason, per node (events, seq gaps, lifecycle state),
//	          requests evicted from memory, NATS drops, payloads that were not events, and this
//	          client's own dropped frames and resyncs
//
// The NATS subscriber (Subscribe) takes every message on onebit.>: events,
// and the event log loss reports the daemon publishes on
// onebit.<node>.eventlog.lost (an eventlog.Loss), counted per node as
// eventlog_lost. Anything else is counted as bad_payloads.
//
// A client that reconnects with Last-Event-ID (EventSource does it by
// itself) gets the ev frames it missed if the hub still holds them
// (Config.History) and the epoch matches, else a new snapshot.
//
// # Bounds
//
// The hub keeps at most Config.MaxRequests requests (oldest first out; they
// stay in the counts), Config.History frames for resume, a fixed number of
// lifecycle events, chart points and distinct fallback reasons. Each client
// has a queue of Config.ClientBuffer frames; a client that falls behind
// loses its queue, counts what it lost (shown on the page) and is resynced
// with a fresh snapshot, so a slow browser never holds the hub's memory. The
// page caps its rows the same way and summarises the ones it let go.
package dashboard
