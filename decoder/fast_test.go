package decoder

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestParseTokens(t *testing.T) {
	tests := []struct {
		raw  string
		want []int // nil: not accepted (json.Unmarshal decides)
	}{
		{`{"tokens":[1,2,3]}`, []int{1, 2, 3}},
		{" {\n\"tokens\" : [ 1 , -2 ,0 ] }\n", []int{1, -2, 0}},
		{`{"tokens":[]}`, []int{}},
		{`{"tokens":[1.0]}`, nil},
		{`{"tokens":[1e3]}`, nil},
		{`{"tokens":[01]}`, nil},
		{`{"tokens":[1,]}`, nil},
		{`{"tokens":[{"id":1,"piece":"a"}]}`, nil},
		{`{"tokens":[1],"extra":true}`, nil},
		{`{"Tokens":[1]}`, nil},
		{`{"tokens":null}`, nil},
		{`{"tokens":[1]} x`, nil},
		{`{"tokens":[12345678901234567890]}`, nil},
		{`{"tokens":[1`, nil},
	}
	for _, tt := range tests {
		got, ok := parseTokens([]byte(tt.raw))
		if ok != (tt.want != nil) {
			t.Errorf("parseTokens(%q) ok = %v", tt.raw, ok)
			continue
		}
		if ok && !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseTokens(%q) = %v, want %v", tt.raw, got, tt.want)
		}
	}
}

// FuzzParseTokens: what parseTokens accepts, json.Unmarshal reads the same.
func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{`{"tokens":[1,2,3]}`, `{"tokens":[]}`, ` {"tokens" : [ -0 , 7 ] } `, `{"tokens":[1.5]}`,
		`{"tokens":[999999999999999999]}`, `{"tokens":[1],"tokens":[2]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := parseTokens(raw)
		if !ok {
			return
		}
		var ref tokensReply
		if err := json.Unmarshal(raw, &ref); err != nil {
			t.Fatalf("parseTokens accepted %q, json.Unmarshal refuses: %v", raw, err)
		}
		if !reflect.DeepEqual(got, ref.Tokens) {
			t.Fatalf("%q: parseTokens = %v, json.Unmarshal = %v", raw, got, ref.Tokens)
		}
	})
}

func benchTokens(n int) []int {
	toks := make([]int, n)
	for i := range toks {
		toks[i] = 1000 + i%100
	}
	return toks
}

func BenchmarkParseTokens(b *testing.B) {
	raw, _ := json.Marshal(tokensReply{Tokens: benchTokens(12722)})
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := parseTokens(raw); !ok {
			b.Fatal("not accepted")
		}
	}
}

func BenchmarkUnmarshalTokens(b *testing.B) {
	raw, _ := json.Marshal(tokensReply{Tokens: benchTokens(12722)})
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var r tokensReply
		if err := json.Unmarshal(raw, &r); err != nil {
			b.Fatal(err)
		}
	}
}
