package handlers

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestEncodeFields(t *testing.T) {
	tests := []struct {
		name, body string
	}{
		{"plain", `{"prompt":"the cache","n_predict":4}`},
		{"html and unicode kept", `{"prompt":"<b>&é</b>","stop":["\n"]}`},
		{"whitespace inside values", `{"messages":[ {"role" : "user", "content":"x"} ],"n":null}`},
		{"keys needing escapes", `{"a\"b":1,"tab\tkey":2,"é":3,"":4}`},
		{"empty", `{}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var fields map[string]json.RawMessage
			if err := json.Unmarshal([]byte(tt.body), &fields); err != nil {
				t.Fatal(err)
			}
			fields["id_slot"] = json.RawMessage("3")
			out := encodeFields(fields, len(tt.body))
			ref, err := json.Marshal(fields)
			if err != nil {
				t.Fatal(err)
			}
			var got, want any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("encodeFields wrote invalid JSON %s: %v", out, err)
			}
			if err := json.Unmarshal(ref, &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("encodeFields = %s, json.Marshal = %s", out, ref)
			}
		})
	}
}
