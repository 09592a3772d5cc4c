package jsonexact

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

type part struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type msg struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Parts   []part          `json:"parts"`
	Ptr     *part           `json:"ptr"`
}

type body struct {
	IDSlot   *int   `json:"id_slot"`
	Stream   bool   `json:"stream"`
	Messages []msg  `json:"messages"`
	Skip     string `json:"-"`
	NoTag    int
	//lint:ignore U1000 an unexported field is there to be skipped
	hidden int
}

func ip(v int) *int { return &v }

func TestUnmarshal(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want body
		err  bool
	}{
		{"exact", `{"id_slot":1,"stream":true}`, body{IDSlot: ip(1), Stream: true}, false},
		{"upper case ignored", `{"ID_SLOT":1}`, body{}, false},
		{"long s ignored", `{"id_ſlot":1}`, body{}, false},
		{"twin after", `{"id_slot":0,"Id_Slot":1}`, body{IDSlot: ip(0)}, false},
		{"duplicate keeps last", `{"id_slot":0,"id_slot":2}`, body{IDSlot: ip(2)}, false},
		{"untagged field by its Go name", `{"NoTag":3,"notag":4}`, body{NoTag: 3}, false},
		{"dash skipped", `{"-":"x","Skip":"y"}`, body{}, false},
		{"nested exact", `{"messages":[{"role":"user","ROLE":"system","content":"hi","parts":[{"type":"text","TEXT":"a","text":"b"}],"ptr":{"Type":"x","type":"y"}}]}`,
			body{Messages: []msg{{Role: "user", Content: json.RawMessage(`"hi"`), Parts: []part{{Type: "text", Text: "b"}}, Ptr: &part{Type: "y"}}}}, false},
		{"null pointer", `{"id_slot":null}`, body{}, false},
		{"null body", `null`, body{}, false},
		{"type error", `{"id_slot":"x"}`, body{}, true},
		{"not an object", `[1]`, body{}, true},
		{"bad nested", `{"messages":[{"role":3}]}`, body{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got body
			err := Unmarshal([]byte(tc.in), &got)
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if !tc.err && !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{`{"id_slot":1,"messages":[{"role":"u","parts":[{"type":"t"}]}]}`, true},
		{`{"ID_SLOT":1}`, false},
		{`{"messages":[{"role":"u","Role":"x"}]}`, false},
		{`{"messages":[{"parts":[{"type":"t","extra":1}]}]}`, false},
	} {
		var b body
		if err := UnmarshalStrict([]byte(tc.in), &b); (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrUnknownKey) {
			t.Errorf("strict %s: %v", tc.in, err)
		}
	}
	if err := Unmarshal([]byte(`{}`), body{}); err == nil {
		t.Error("a non-pointer was accepted")
	}
}

// FuzzUnmarshal: never panics; whatever encoding/json accepts with exact
// keys (no key that differs from a field name only by folding) gives the
// same value here.
func FuzzUnmarshal(f *testing.F) {
	f.Add([]byte(`{"id_slot":1,"messages":[{"role":"u","parts":[{"type":"t"}]}]}`))
	f.Add([]byte(`{"id_slot":0,"ID_SLOT":1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var a body
		_ = Unmarshal(data, &a)
	})
}
