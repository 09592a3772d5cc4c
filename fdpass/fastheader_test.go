package fdpass

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"
)

// strictHeader is encoding/json's strict decode, the reference of fastHeader.
func strictHeader(raw []byte) (Header, error) {
	var h Header
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return Header{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return Header{}, io.ErrUnexpectedEOF
	}
	return h, nil
}

func TestFastHeader(t *testing.T) {
	canon := string(mustJSON(t, testHeader(3, 56)))
	tests := []struct {
		name   string
		raw    string
		accept bool
	}{
		{"canonical 56 regions", canon, true},
		{"whitespace around everything", " \n{ \"version\" : 1 ,\t\"regions\" : [ { \"fd_index\" : 0 } ] }\r\n ", true},
		{"empty object", `{}`, true},
		{"empty regions", `{"regions":[]}`, true},
		{"negative and zero", `{"version":-0,"n_ctx":-5,"flash_attn":false}`, true},
		{"escaped string", `{"layout_hash":"a\u0062"}`, false},
		{"non-ASCII string", `{"kv_type_k":"fé"}`, false},
		{"duplicate key", `{"version":1,"version":2}`, false},
		{"key in another case", `{"Version":1}`, false},
		{"unknown key", `{"versio":1}`, false},
		{"unknown region key", `{"regions":[{"fd":1}]}`, false},
		{"null value", `{"version":null}`, false},
		{"null regions", `{"regions":null}`, false},
		{"fraction", `{"version":1.0}`, false},
		{"exponent", `{"version":1e0}`, false},
		{"leading zero", `{"version":01}`, false},
		{"int overflow", `{"regions":[{"offset":9223372036854775808}]}`, false},
		{"int64 extremes", `{"regions":[{"offset":-9223372036854775808,"size":9223372036854775807}]}`, true},
		{"negative overflow", `{"regions":[{"size":-9223372036854775809}]}`, false},
		{"trailing data", `{"version":1} {}`, false},
		{"trailing comma", `{"version":1,}`, false},
		{"not an object", `[1]`, false},
		{"top-level null", `null`, false},
		{"truncated", canon[:len(canon)/2], false},
		{"bool as string", `{"flash_attn":"true"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, ok := fastHeader([]byte(tt.raw))
			if ok != tt.accept {
				t.Fatalf("fastHeader accepted = %v, want %v", ok, tt.accept)
			}
			if !ok {
				return
			}
			want, err := strictHeader([]byte(tt.raw))
			if err != nil {
				t.Fatalf("fastHeader accepted what encoding/json refuses: %v", err)
			}
			if !reflect.DeepEqual(h, want) {
				t.Fatalf("fastHeader = %+v, encoding/json = %+v", h, want)
			}
		})
	}
}

// FuzzFastHeader: whatever fastHeader accepts, encoding/json's strict decode
// accepts with an identical Header (so the fast path never changes a
// decision or a value).
func FuzzFastHeader(f *testing.F) {
	f.Add(mustJSON(f, testHeader(3, 56)))
	f.Add(mustJSON(f, testHeader(1, 2)))
	for _, s := range []string{`{}`, `{"regions":[]}`, `{"version":1,"version":2}`, `{"Version":1}`, `{"n_ctx":-0}`,
		`{"layout_hash":"a\"b"}`, `{"regions":[{"fd_index":0,"offset":4096,"size":4096,"kind":"k","layer":0,"cell_stride":64}]}`,
		strings.Repeat(" ", 3) + `{"flash_attn":true}` + "\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		h, ok := fastHeader(raw)
		if !ok {
			return
		}
		want, err := strictHeader(raw)
		if err != nil {
			t.Fatalf("fastHeader accepted %q, encoding/json refuses: %v", raw, err)
		}
		if !reflect.DeepEqual(h, want) {
			t.Fatalf("%q: fastHeader = %+v, encoding/json = %+v", raw, h, want)
		}
	})
}
