package benchharness

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLlamaSection runs section d with the decoder simulator as
// LLAMA_SERVER (it takes llama-server's flags; the model is any file it
// hashes) at a tiny scale: both stacks start, every file-route request
// restores with prompt_n 1 and the same text as plain, and the table has a
// row per prompt length. Without LLAMA_SERVER the section is skipped with a
// line in the report; with it but no MODEL it is refused; a llama-server
// that does not start fails the section alone, with a line in the report.
func TestLlamaSection(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and starts processes")
	}
	bin := t.TempDir()
	for _, c := range []string{"onebitd", "onebit-decoder-sim", "onebit-prefill"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, c), "./cmd/"+c)
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", c, err, out)
		}
	}
	model := filepath.Join(t.TempDir(), "fake.gguf")
	if err := os.WriteFile(model, []byte("GGUF-SIM a model the simulator hashes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sim := filepath.Join(bin, "onebit-decoder-sim")
	sizes := []int{150, 700, 1600}

	tests := []struct {
		name    string
		llama   LlamaConfig
		wantErr error
		want    []string // in the report
	}{
		{name: "skipped without LLAMA_SERVER", want: []string{LlamaSectionTitle, "Skipped: LLAMA_SERVER is not set"}},
		{name: "no model", llama: LlamaConfig{Server: sim}, wantErr: ErrLlamaConfig},
		{name: "llama-server that does not start", llama: LlamaConfig{Server: "/bin/false", Model: model},
			want: []string{LlamaSectionTitle, "**Failed** (`/bin/false`", "exited before it was ready"}},
		{name: "simulator", llama: LlamaConfig{Server: sim, Model: model, Ctx: 4096, Args: []string{"--cell-size", "1792"}, Sizes: sizes, NPredict: 6, Rounds: 3},
			want: []string{LlamaSectionTitle, "| target tokens |", "-c 4096 -fa off --cell-size 1792"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			start := time.Now()
			res, err := Run(ctx, Config{BinDir: bin, WorkDir: t.TempDir(), Sections: []string{"llama"}, Llama: tt.llama})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Run = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var md strings.Builder
			if err := res.Markdown(&md); err != nil {
				t.Fatal(err)
			}
			t.Logf("took %s\n%s", time.Since(start).Round(time.Millisecond), md.String())
			for _, s := range tt.want {
				if !strings.Contains(md.String(), s) {
					t.Errorf("report lacks %q", s)
				}
			}
			l := res.Llama
			switch tt.llama.Server {
			case "":
				if l == nil || l.Skipped == "" || len(l.Rows) != 0 {
					t.Fatalf("section ran without LLAMA_SERVER: %+v", l)
				}
				return
			case "/bin/false":
				if l == nil || l.Failed == "" || len(l.Rows) != 0 {
					t.Fatalf("a llama-server that exits did not fail the section: %+v", l)
				}
				return
			}
			if len(l.Rows) != len(sizes) {
				t.Fatalf("%d rows, want %d", len(l.Rows), len(sizes))
			}
			// The table: a header, its rule, a line per size, all with the header's columns.
			var table []string
			for _, line := range strings.Split(md.String(), "\n") {
				if strings.HasPrefix(line, "| target tokens |") || len(table) > 0 && strings.HasPrefix(line, "|") {
					table = append(table, line)
				} else if len(table) > 0 {
					break
				}
			}
			if len(table) != 2+len(sizes) {
				t.Fatalf("table has %d lines, want %d:\n%s", len(table), 2+len(sizes), strings.Join(table, "\n"))
			}
			cols := strings.Count(table[0], "|")
			for _, line := range table[1:] {
				if got := strings.Count(line, "|"); got != cols {
					t.Errorf("line %q has %d bars, header %d", line, got, cols)
				}
			}
			for i, row := range l.Rows {
				if row.Target != sizes[i] {
					t.Errorf("row %d target %d, want %d", i, row.Target, sizes[i])
				}
				if row.FilePromptN != [2]int{1, 1} {
					t.Errorf("%d tokens: file-route prompt_n %v, want 1", row.Target, row.FilePromptN)
				}
				if row.Fallbacks != 0 || row.FileTTFT.N != 3 || row.PlainTTFT.N != 3 || row.Restore.N != 3 || row.Prefill.N != 3 || row.Added.N != 3 {
					t.Errorf("%d tokens: %d fallbacks, samples plain %d file %d restore %d prefill %d added %d, want 0 and 3s",
						row.Target, row.Fallbacks, row.PlainTTFT.N, row.FileTTFT.N, row.Restore.N, row.Prefill.N, row.Added.N)
				}
				if row.Compared != 3 || row.Matched != row.Compared {
					t.Errorf("%d tokens: text matched plain in %d of %d rounds", row.Target, row.Matched, row.Compared)
				}
				// Each prompt is sized with the decoder's tokenizer: within half a
				// sentence (the sim's tokens are mostly bytes) of the target, and
				// the plain route evaluated all of it (a different first word per
				// request: nothing reused but BOS).
				if row.PlainTokens[0] < row.Target-100 || row.PlainTokens[1] > row.Target+100 || row.FileTokens != row.PlainTokens {
					t.Errorf("%d tokens: plain %v, file %v tokens", row.Target, row.PlainTokens, row.FileTokens)
				}
				if row.PlainPromptN[0] < row.PlainTokens[0]-1 {
					t.Errorf("%d tokens: plain prompt_n %v of %v tokens: a prefix was reused", row.Target, row.PlainPromptN, row.PlainTokens)
				}
				if row.Restore.Median <= 0 || row.PlainTTFT.Median <= 0 || row.FileTTFT.Median <= 0 {
					t.Errorf("%d tokens: restore %v, TTFT plain %v file %v", row.Target, row.Restore.Median, row.PlainTTFT.Median, row.FileTTFT.Median)
				}
			}
		})
	}
}

// TestReadLlamaStream reads llama-server's streamed /completion: text, the
// final event's timings, and the streams that are not a completed answer.
func TestReadLlamaStream(t *testing.T) {
	final := `data: {"content":"","stop":true,"timings":{"prompt_n":1,"cache_n":249}}` + "\n\n"
	tests := []struct {
		name        string
		in          string
		wantErr     error
		text        string
		promptN     int
		cacheN      int
		wantContent bool // a TTFT from an event with content
	}{
		{name: "answer", in: "data: {\"content\":\" The\",\"stop\":false}\n\n:\n\ndata: {\"content\":\" sea\",\"stop\":false}\r\n\r\n" + final,
			text: " The sea", promptN: 1, cacheN: 249, wantContent: true},
		{name: "empty first event (a partial UTF-8 token)", in: "data: {\"content\":\"\",\"stop\":false}\n\ndata: {\"content\":\"é\",\"stop\":false}\n\n" + final,
			text: "é", promptN: 1, cacheN: 249, wantContent: true},
		{name: "EOS first: no content", in: final, promptN: 1, cacheN: 249},
		{name: "no trailing newline", in: strings.TrimRight(final, "\n"), promptN: 1, cacheN: 249},
		{name: "events after the final one are ignored", in: final + "data: [DONE]\n\n", promptN: 1, cacheN: 249},
		{name: "error event", in: "data: {\"content\":\"a\",\"stop\":false}\n\ndata: {\"error\":{\"code\":500,\"message\":\"Invalid UTF-8\"}}\n\n", wantErr: ErrBadResponse},
		{name: "cut short", in: "data: {\"content\":\"a\",\"stop\":false}\n\n", wantErr: ErrBadResponse},
		{name: "empty", in: "", wantErr: ErrBadResponse},
		{name: "malformed event", in: "data: {\"content\":\n\n" + final, wantErr: ErrBadResponse},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r llamaReply
			err := readLlamaStream(strings.NewReader(tt.in), time.Now(), &r)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.text != tt.text || r.promptN != tt.promptN || r.cacheN != tt.cacheN || r.ttft <= 0 {
				t.Fatalf("reply %+v, want text %q prompt_n %d cache_n %d and a ttft", r, tt.text, tt.promptN, tt.cacheN)
			}
		})
	}
}

// FuzzReadLlamaStream: any bytes a decoder sends are read without a panic,
// and an accepted stream has its final event's timings and a TTFT.
func FuzzReadLlamaStream(f *testing.F) {
	f.Add("data: {\"content\":\" a\",\"stop\":false}\n\ndata: {\"content\":\"\",\"stop\":true,\"timings\":{\"prompt_n\":1,\"cache_n\":9}}\n\n")
	f.Add("data: {\"error\":{\"code\":500}}\n\n")
	f.Add("data: \n\ndata: null\n\n: ping\n\n")
	f.Add("data: {\"stop\":true,\"error\":null}")
	f.Fuzz(func(t *testing.T, in string) {
		var r llamaReply
		if err := readLlamaStream(strings.NewReader(in), time.Now(), &r); err == nil && r.ttft <= 0 {
			t.Fatalf("accepted %q without a TTFT", in)
		} else if err != nil && !errors.Is(err, ErrBadResponse) {
			t.Fatalf("error %v is not ErrBadResponse", err)
		}
	})
}

// TestOnebitdStopped finds why onebitd stopped in its stderr tail.
func TestOnebitdStopped(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{`{"level":"INFO","msg":"nats server"}` + "\n" + `{"level":"ERROR","msg":"onebitd stopped","error":"decoder: exited\nits last lines"}`, "decoder: exited\nits last lines"},
		{`benchharness: process exited: onebitd: {"msg":"onebitd stopped","error":"bad flag"}`, "bad flag"},
		{`{"msg":"onebitd stopped"}`, ""},
		{`{"msg":"onebitd stopped","error":`, ""},
	}
	for _, tt := range tests {
		if got := onebitdStopped(tt.in); got != tt.want {
			t.Errorf("onebitdStopped(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
