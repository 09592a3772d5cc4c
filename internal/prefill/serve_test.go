package prefill

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onebitd/onebitd/provjob"
)

// TestServe: the warm mode runs file-route jobs (the state file the decoder
// restores), refuses shared-route ones, and stops with its context.
func TestServe(t *testing.T) {
	w := newWorld(t, nil)
	toks := tokenize(t, w.decoder.URL, prompt)
	sock := filepath.Join(t.TempDir(), "provider.sock")
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, sock, Config{PrefillURL: w.prefill.URL}, func() { close(ready) })
	}()
	<-ready

	state := filepath.Join(w.slotDir, "warm1.bin")
	rep, err := provjob.Call(sock, &provjob.Job{Version: provjob.Version, Route: "file", Tokens: toks, Model: w.model, State: state}, nil, time.Now().Add(30*time.Second))
	if err != nil || !rep.OK || rep.NTokens != len(toks) || rep.PrefillMs <= 0 {
		t.Fatalf("file job: %+v %v", rep, err)
	}
	if st, r := post(t, w.decoder.URL+"/slots/0?action=restore", map[string]any{"filename": "warm1.bin"}); st != 200 || int(r["n_restored"].(float64)) != len(toks) {
		t.Fatalf("restore of the warm job's state: %d %v", st, r)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v %v", fi, err)
	}

	rep, err = provjob.Call(sock, &provjob.Job{Version: provjob.Version, Route: "file", Tokens: toks, Model: "/other/model.gguf", State: state}, nil, time.Now().Add(30*time.Second))
	if err != nil || rep.OK || !strings.Contains(rep.Reason, "model") {
		t.Fatalf("another model: %+v %v", rep, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve does not stop with its context")
	}
}
