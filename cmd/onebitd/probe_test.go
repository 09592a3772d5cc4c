package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onebitd/onebitd/internal/decodersim"
	"github.com/onebitd/onebitd/probe"
)

// probeSim is an in-process simulator for the probe command's tests.
func probeSim(t *testing.T, lax bool) string {
	t.Helper()
	c := decodersim.DefaultConfig()
	c.ModelPath = filepath.Join(t.TempDir(), "model.gguf")
	if err := os.WriteFile(c.ModelPath, []byte("probe command test model"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.NCtx = 1024
	c.SlotSavePath = t.TempDir()
	c.LaxShareID = lax
	srv, err := decodersim.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	return ts.URL
}

func TestProbeCommand(t *testing.T) {
	good, lax := probeSim(t, false), probeSim(t, true)
	tests := []struct {
		name string
		args []string
		code int
		out  []string // in stdout
		err  string   // in stderr
	}{
		{"conformant", []string{"--decoder-url", good}, 0, []string{"PASS  ", "reused share_id refused", "conformant"}, ""},
		{"lax", []string{"--decoder-url", lax}, 1, []string{"FAIL  ", "ACCEPTED", "NOT conformant"}, ""},
		{"no url", nil, 2, nil, "--decoder-url is required"},
		{"bad url", []string{"--decoder-url", "localhost:1"}, 2, nil, "bad decoder URL"},
		{"stray argument", []string{"--decoder-url", good, "x"}, 2, nil, `unexpected argument "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := probeRun(context.Background(), tt.args, &stdout, &stderr)
			if code != tt.code {
				t.Errorf("exit %d, want %d\n%s%s", code, tt.code, stdout.String(), stderr.String())
			}
			for _, s := range tt.out {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			if !strings.Contains(stderr.String(), tt.err) {
				t.Errorf("stderr lacks %q: %s", tt.err, stderr.String())
			}
		})
	}
}

func TestProbeCommandJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := probeRun(context.Background(), []string{"--decoder-url", probeSim(t, true), "--slot", "0", "--json"}, &stdout, &stderr); code != 1 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var rep probe.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, stdout.String())
	}
	if rep.OK {
		t.Error("ok true for a lax decoder")
	}
	var failed []string
	for _, c := range rep.Checks {
		if c.Status == probe.Fail {
			failed = append(failed, c.Name)
		}
	}
	if strings.Join(failed, ",") != strings.Join(probe.ShareIDChecks, ",") {
		t.Errorf("failed %v, want exactly %v", failed, probe.ShareIDChecks)
	}
}
