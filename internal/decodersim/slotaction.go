package decodersim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/onebitd/onebitd/decoder"
	"github.com/onebitd/onebitd/fdpass"
	"github.com/onebitd/onebitd/internal/simfault"
	"github.com/onebitd/onebitd/internal/simkv"
)

// shareDialTimeout bounds the connect to a share socket.
const shareDialTimeout = 5 * time.Second

// handleSlotAction is POST /slots/{id}?action=save|restore|erase|share|adopt.
// Checks run in upstream's order: slot save path (501), slot id (400),
// action (400), then the action's body.
func (s *Server) handleSlotAction(w http.ResponseWriter, r *http.Request) {
	if s.cfg.SlotSavePath == "" {
		writeError(w, apiErr(errNotSupported, "This server does not support slots action. Start it with `--slot-save-path`"))
		return
	}
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil {
		writeError(w, apiErr(errInvalidRequest, "Invalid slot ID"))
		return
	}
	var act func(*http.Request, int) (any, *apiError)
	switch r.URL.Query().Get("action") {
	case "save":
		act = s.slotSave
	case "restore":
		act = s.slotRestore
	case "erase":
		act = s.slotErase
	case "share":
		act = s.slotShare
	case "adopt":
		act = s.slotAdopt
	default:
		writeError(w, apiErr(errInvalidRequest, "Invalid action"))
		return
	}
	// Upstream wraps an id past the end onto another slot; the sim refuses it.
	if id < 0 || id >= s.cfg.NParallel {
		writeError(w, apiErr(errInvalidRequest, "Invalid slot ID: %d (total_slots is %d)", id, s.cfg.NParallel))
		return
	}
	v, e := act(r, id)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// filenameBody reads {"filename": "…"} like upstream: invalid JSON or a
// missing or non-string filename is a 500, an unsafe name a 400.
func filenameBody(r *http.Request) (string, *apiError) {
	var body map[string]json.RawMessage
	if e := readBody(r, &body); e != nil {
		return "", e
	}
	raw, ok := body["filename"]
	if !ok {
		return "", apiErr(errServer, "[json.exception.out_of_range.403] key 'filename' not found")
	}
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		return "", apiErr(errServer, "[json.exception.type_error.302] type must be string, but is %s", jsonKind(raw))
	}
	if !decoder.ValidFilename(name) {
		return "", apiErr(errInvalidRequest, "Invalid filename")
	}
	return name, nil
}

func jsonKind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "null"
	}
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

type saveReply struct {
	IDSlot   int    `json:"id_slot"`
	Filename string `json:"filename"`
	NSaved   int    `json:"n_saved"`
	NWritten int64  `json:"n_written"`
	Timings  struct {
		SaveMs float64 `json:"save_ms"`
	} `json:"timings"`
}

// slotSave writes the slot's tokens and cells, read from KV memory, to a
// temp file in the slot save path and renames it into place: every buffer's
// cells (a full state, n_cells x cell size bytes, as llama-server writes),
// or layer 0's records with --compact.
func (s *Server) slotSave(r *http.Request, id int) (any, *apiError) {
	name, e := filenameBody(r)
	if e != nil {
		return nil, e
	}
	sl, err := s.sched.acquire(r.Context(), id, nil)
	if err != nil {
		return nil, apiErr(errServer, "request cancelled while waiting for slot %d", id)
	}
	defer s.sched.release(sl)
	t0 := time.Now()
	write := func(w io.Writer) error {
		n := len(sl.tokens)
		_, err := simkv.WriteFullState(w, s.modelHash, sl.tokens, s.cfg.NLayer, int(s.kv.stride),
			func(b int) []byte { return s.kv.bufSlot(b, id, n) })
		return err
	}
	if s.cfg.Compact {
		st := simkv.State{Tokens: sl.tokens, K: make([][]byte, len(sl.tokens)), V: make([][]byte, len(sl.tokens))}
		for i := range sl.tokens {
			st.K[i], st.V[i] = s.kv.cellK(id, i), s.kv.cellV(id, i)
		}
		write = func(w io.Writer) error { return simkv.WriteState(w, s.modelHash, st) }
	}
	n, err := writeFileAtomic(s.cfg.SlotSavePath+name, write)
	if err != nil {
		s.log.Warn("slot save failed", attrSlot, id, attrPath, name, attrError, err)
		return nil, apiErr(errServer, "Unable to save slot: %v", err)
	}
	rep := saveReply{IDSlot: id, Filename: name, NSaved: len(sl.tokens), NWritten: n}
	rep.Timings.SaveMs = msSince(t0)
	s.log.Info("slot saved", attrSlot, id, attrPath, name, "n_saved", rep.NSaved)
	return rep, nil
}

// countWriter counts bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// writeFileAtomic writes path through a temp file in the same directory and
// renames it into place; on any error the temp file is removed.
func writeFileAtomic(path string, write func(io.Writer) error) (n int64, err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	cw := &countWriter{w: f}
	if err := write(cw); err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return 0, err
	}
	return cw.n, nil
}

type restoreReply struct {
	IDSlot    int    `json:"id_slot"`
	Filename  string `json:"filename"`
	NRestored int    `json:"n_restored"`
	NRead     int64  `json:"n_read"`
	Timings   struct {
		RestoreMs float64 `json:"restore_ms"`
	} `json:"timings"`
}

// slotRestore loads a state file into the slot's cells. A failure clears the
// slot, as upstream does.
func (s *Server) slotRestore(r *http.Request, id int) (any, *apiError) {
	name, e := filenameBody(r)
	if e != nil {
		return nil, e
	}
	if e := slotActionFault(s.takeFault(), "restore"); e != nil {
		return nil, e
	}
	sl, err := s.sched.acquire(r.Context(), id, nil)
	if err != nil {
		return nil, apiErr(errServer, "request cancelled while waiting for slot %d", id)
	}
	defer s.sched.release(sl)
	t0 := time.Now()
	sl.touchKV()
	sl.truncate(0)
	toks, n, err := s.restoreFile(id, s.cfg.SlotSavePath+name)
	if err != nil {
		s.log.Warn("slot restore failed", attrSlot, id, attrPath, name, attrError, err)
		return nil, apiErr(errInvalidRequest, "Unable to restore slot: %v", err)
	}
	sl.setTokens(toks)
	rep := restoreReply{IDSlot: id, Filename: name, NRestored: len(toks), NRead: n}
	rep.Timings.RestoreMs = msSince(t0)
	s.log.Info("slot restored", attrSlot, id, attrPath, name, "n_restored", rep.NRestored)
	return rep, nil
}

// restoreFile reads the state file at path into slot id's cells and returns
// its tokens and the bytes read. A full state (version 2) must have this
// decoder's geometry; it is read whole and checked, then copied into every
// buffer. A compact one (version 1) fills layer 0's records. On error the
// caller keeps the slot empty.
func (s *Server) restoreFile(id int, path string) ([]int, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	sr, err := simkv.NewStateReader(f, s.modelHash)
	if err != nil {
		return nil, 0, err
	}
	n := len(sr.Tokens)
	switch {
	case n > s.kv.slotCells:
		return nil, 0, fmt.Errorf("the state holds %d tokens, more than the slot's %d cells", n, s.kv.slotCells)
	case sr.Version == 2 && (sr.NLayer != s.cfg.NLayer || int64(sr.Stride) != s.kv.stride):
		return nil, 0, fmt.Errorf("the state has %d layers of %d bytes per cell, this decoder %d of %d", sr.NLayer, sr.Stride, s.cfg.NLayer, s.kv.stride)
	}
	if e := checkTokens(sr.Tokens); e != nil {
		return nil, 0, e
	}
	if sr.Version == 2 {
		// As llama.cpp's llama_state_seq_load_file: the whole file into
		// memory first, checked, then copied into the cells.
		per := n * int(s.kv.stride)
		data := make([]byte, 2*s.cfg.NLayer*per)
		if err := sr.Buffers(func(b int) []byte { return data[b*per : (b+1)*per] }); err != nil {
			return nil, 0, err
		}
		for b := range s.kv.bufs {
			copy(s.kv.bufSlot(b, id, n), data[b*per:(b+1)*per])
		}
		return sr.Tokens, sr.BytesRead(), nil
	}
	k, v, err := sr.Records()
	if err != nil {
		return nil, 0, err
	}
	for i := range n {
		copy(s.kv.cellK(id, i), k[i])
		copy(s.kv.cellV(id, i), v[i])
	}
	return sr.Tokens, sr.BytesRead(), nil
}

// slotErase forgets the slot's cached tokens.
func (s *Server) slotErase(r *http.Request, id int) (any, *apiError) {
	sl, err := s.sched.acquire(r.Context(), id, nil)
	if err != nil {
		return nil, apiErr(errServer, "request cancelled while waiting for slot %d", id)
	}
	defer s.sched.release(sl)
	n := len(sl.tokens)
	sl.truncate(0)
	return struct {
		IDSlot  int `json:"id_slot"`
		NErased int `json:"n_erased"`
	}{id, n}, nil
}

type shareReply struct {
	IDSlot      int   `json:"id_slot"`
	ShareID     int64 `json:"share_id"`
	NRegions    int   `json:"n_regions"`
	NFDs        int   `json:"n_fds"`
	BytesMapped int64 `json:"bytes_mapped"`
	Timings     struct {
		ShareMs float64 `json:"share_ms"`
	} `json:"timings"`
}

// slotShare sends the slot's KV regions to a unix socket (one message:
// header + chunk fds) and clears the slot: from now on its memory may be
// written by others, so the cached tokens no longer describe it.
func (s *Server) slotShare(r *http.Request, id int) (any, *apiError) {
	if s.cfg.Recurrent {
		return nil, apiErr(errNotSupported, "no shareable region")
	}
	var body struct {
		Socket *string `json:"socket"`
	}
	if e := readBody(r, &body); e != nil {
		return nil, e
	}
	switch {
	case body.Socket == nil || *body.Socket == "":
		return nil, apiErr(errInvalidRequest, "socket is required")
	case !filepath.IsAbs(*body.Socket):
		return nil, apiErr(errInvalidRequest, "socket must be an absolute path, got %q", *body.Socket)
	}
	fault := s.takeFault()
	if e := slotActionFault(fault, "share"); e != nil {
		return nil, e
	}
	sl, err := s.sched.acquire(r.Context(), id, nil)
	if err != nil {
		return nil, apiErr(errServer, "request cancelled while waiting for slot %d", id)
	}
	defer s.sched.release(sl)

	t0 := time.Now()
	h := fdpass.Header{
		Version:    fdpass.HeaderVersion,
		LayoutHash: s.layout.Hash(),
		NCtx:       s.cfg.NCtx,
		NLayer:     s.cfg.NLayer,
		KVTypeK:    s.cfg.CacheTypeK,
		KVTypeV:    s.cfg.CacheTypeV,
		FlashAttn:  s.cfg.flashAttn(),
		NBatch:     s.cfg.NBatch,
		NUbatch:    s.cfg.NUbatch,
		Regions:    s.kv.regions(id),
	}
	raw, err := fdpass.Encode(&h)
	if err != nil {
		return nil, apiErr(errServer, "unable to share slot %d: %v", id, err)
	}
	if fault == simfault.ShareSlow {
		sleepFault(s.cfg.FaultDelay)
	}
	if s.cfg.ShareNoSend || fault == simfault.ShareNoConnect { // TEST SWITCH: a decoder that says it shared but never connected
		sl.truncate(0)
		shareID := s.shareSeq.Add(1)
		sl.share = shareState{last: shareID}
		return shareReply{IDSlot: id, ShareID: shareID}, nil
	}
	conn, err := fdpass.Dial(*body.Socket, shareDialTimeout)
	if err != nil {
		s.log.Warn("slot share failed", attrSlot, id, attrPath, *body.Socket, attrError, err)
		return nil, apiErr(errServer, "unable to share slot %d: %v", id, err)
	}
	defer conn.Close()
	fds := s.kv.fds()
	raw, fds = shareFaultMessage(fault, raw, fds)
	// From here on the peer may hold the fds: the slot's cached tokens and
	// any earlier share are void whatever happens.
	sl.truncate(0)
	sl.share = shareState{}
	if err := fdpass.Send(conn, raw, fds); err != nil {
		s.log.Warn("slot share failed", attrSlot, id, attrPath, *body.Socket, attrError, err)
		return nil, apiErr(errServer, "unable to share slot %d: %v", id, err)
	}
	shareID := s.shareSeq.Add(1)
	sl.share = shareState{last: shareID}
	rep := shareReply{IDSlot: id, ShareID: shareID, NRegions: len(h.Regions), NFDs: len(fds)}
	for _, rg := range h.Regions {
		rep.BytesMapped += rg.Size
	}
	rep.Timings.ShareMs = msSince(t0)
	s.log.Info("slot shared", attrSlot, id, attrShareID, shareID, "n_regions", rep.NRegions, "n_fds", rep.NFDs)
	return rep, nil
}

// adoptBody is {"tokens": […], "share_id": N} plus an optional
// "layout_hash": the provider's idea of the layout, checked when present.
type adoptBody struct {
	Tokens     json.RawMessage `json:"tokens"`
	ShareID    json.RawMessage `json:"share_id"`
	LayoutHash *string         `json:"layout_hash"`
}

// slotAdopt makes the slot's cache the given tokens, whose cells the
// provider wrote into the shared regions; nothing is copied. The share_id
// must be the slot's last share, not yet adopted (unless --lax-share-id).
func (s *Server) slotAdopt(r *http.Request, id int) (any, *apiError) {
	if s.cfg.Recurrent {
		return nil, apiErr(errNotSupported, "no shareable region")
	}
	toks, shareID, layoutHash, e := readAdopt(r, s.cfg.LaxShareID)
	if e != nil {
		return nil, e
	}
	if s.tokensFault(toks) == simfault.AdoptRefused {
		return nil, apiErr(errInvalidRequest, "share_id %d is not the pending share of slot %d", shareID, id)
	}
	if len(toks) > s.kv.slotCells {
		return nil, exceedContext(len(toks), s.kv.slotCells)
	}
	if layoutHash != nil && *layoutHash != s.layout.Hash() {
		return nil, apiErr(errInvalidRequest, "layout_hash %q does not match this decoder's layout %s", truncate(*layoutHash, 64), s.layout.Hash())
	}
	sl, err := s.sched.acquire(r.Context(), id, nil)
	if err != nil {
		return nil, apiErr(errServer, "request cancelled while waiting for slot %d", id)
	}
	defer s.sched.release(sl)
	t0 := time.Now()

	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.cfg.LaxShareID {
		if e := s.checkShareLocked(sl, shareID); e != nil {
			return nil, e
		}
	}
	if shareID != 0 && shareID == sl.share.last {
		sl.share.used = true
		s.adopted[shareID] = true
	}
	sl.setTokens(toks)
	rep := struct {
		IDSlot   int `json:"id_slot"`
		NAdopted int `json:"n_adopted"`
		Timings  struct {
			AdoptMs float64 `json:"adopt_ms"`
		} `json:"timings"`
	}{IDSlot: id, NAdopted: len(toks)}
	rep.Timings.AdoptMs = msSince(t0)
	s.log.Info("slot adopted", attrSlot, id, attrShareID, shareID, "n_adopted", len(toks))
	return rep, nil
}

// checkShareLocked refuses shareID unless it is sl's pending share. The
// answer is the same whatever the reason (already adopted, superseded,
// another slot's, void, never given): a caller learns nothing that helps
// guessing a valid id. The reason goes to the simulator's own log.
func (s *Server) checkShareLocked(sl *slot, shareID int64) *apiError {
	var why string
	switch {
	case s.adopted[shareID]:
		why = "already adopted"
	case shareID != sl.share.last:
		why = "not the slot's last share"
	case sl.share.void:
		why = "void: the slot's cells were written after the share"
	default:
		return nil
	}
	s.log.Warn("adopt refused", attrSlot, sl.id, attrShareID, shareID, "why", why)
	return apiErr(errInvalidRequest, "share_id %d is not the pending share of slot %d", shareID, sl.id)
}

// parseAdopt validates an adopt body. share_id is 0 when absent (only lax
// mode accepts that).
func parseAdopt(b adoptBody, lax bool) ([]int, int64, *apiError) {
	if len(b.Tokens) == 0 || string(b.Tokens) == "null" {
		return nil, 0, apiErr(errInvalidRequest, "tokens is required")
	}
	var nums []json.RawMessage
	if err := json.Unmarshal(b.Tokens, &nums); err != nil {
		return nil, 0, apiErr(errInvalidRequest, "tokens must be an array of token ids")
	}
	toks := make([]int, len(nums))
	for i, n := range nums {
		if n = bytes.TrimSpace(n); !isInteger(n) {
			return nil, 0, apiErr(errInvalidRequest, "tokens[%d] is not a token id: %s", i, truncate(string(n), 32))
		}
		toks[i] = tokenID(n)
	}
	return checkAdopt(toks, b.ShareID, lax)
}

// checkAdopt checks an adopt's token ids and share_id (raw JSON).
func checkAdopt(toks []int, rawShareID []byte, lax bool) ([]int, int64, *apiError) {
	if e := checkTokens(toks); e != nil {
		return nil, 0, e
	}
	var shareID int64
	switch raw := bytes.TrimSpace(rawShareID); {
	case len(raw) == 0 || string(raw) == "null":
		if !lax {
			return nil, 0, apiErr(errInvalidRequest, "share_id is required")
		}
	default:
		v, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil || v < 1 {
			if !lax {
				return nil, 0, apiErr(errInvalidRequest, "share_id must be a positive integer, got %s", truncate(string(raw), 32))
			}
			v = 0
		}
		shareID = v
	}
	return toks, shareID, nil
}
