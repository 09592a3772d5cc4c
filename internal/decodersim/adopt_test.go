package decodersim

import (
	"reflect"
	"testing"
)

// slowAdopt is the general path alone.
func slowAdopt(raw []byte, lax bool) ([]int, int64, *string, *apiError) {
	var body adoptBody
	if e := decodeBody(raw, &body); e != nil {
		return nil, 0, nil, e
	}
	toks, id, e := parseAdopt(body, lax)
	return toks, id, body.LayoutHash, e
}

func TestFastAdopt(t *testing.T) {
	tests := []struct {
		body string
		fast bool // the fast path takes it
	}{
		{`{"tokens":[1,1000,1099],"share_id":7}`, true},
		{` { "tokens" : [ 1 , 2 ] , "share_id" : 3 , "layout_hash" : "00ff" } `, true},
		{`{"share_id":3,"tokens":[]}`, true},
		{`{"tokens":[1],"share_id":null}`, true},
		{`{"tokens":[1],"share_id":1,"share_id":2}`, true},
		{`{"tokens":[1],"tokens":[2,3],"share_id":1}`, true},
		{`{"tokens":[-0, 5]}`, true},
		{`{"tokens":[1.5],"share_id":1}`, false},
		{`{"tokens":[1e3],"share_id":1}`, false},
		{`{"tokens":[01],"share_id":1}`, false},
		{`{"tokens":[12345678901],"share_id":1}`, false},
		{`{"Tokens":[1],"share_id":1}`, false},
		{`{"tok\u0065ns":[1],"share_id":1}`, false},
		{`{"tokens":[1],"share_id":"1"}`, false},
		{`{"tokens":[1],"share_id":1,"extra":true}`, false},
		{`{"tokens":[1],"share_id":1}x`, false},
		{`{"tokens":[1,],"share_id":1}`, false},
		{`{"share_id":1}`, false},
		{`{}`, false},
		{`[]`, false},
		{``, false},
	}
	for _, tc := range tests {
		_, ok := fastAdopt([]byte(tc.body))
		if ok != tc.fast {
			t.Errorf("%s: fast path %v, want %v", tc.body, ok, tc.fast)
		}
		for _, lax := range []bool{false, true} {
			sameAdopt(t, []byte(tc.body), lax)
		}
	}
}

// sameAdopt checks that the fast and general paths agree on raw.
func sameAdopt(t *testing.T, raw []byte, lax bool) {
	t.Helper()
	if _, ok := fastAdopt(raw); !ok {
		return
	}
	ft, fid, fh, fe := parseAdoptBody(raw, lax)
	st, sid, sh, se := slowAdopt(raw, lax)
	if len(ft) == 0 && len(st) == 0 {
		ft, st = nil, nil
	}
	if !reflect.DeepEqual(ft, st) || fid != sid || !reflect.DeepEqual(fh, sh) || !reflect.DeepEqual(fe, se) {
		t.Errorf("%q lax %v: fast (%v %d %v %v), general (%v %d %v %v)", raw, lax, ft, fid, fh, fe, st, sid, sh, se)
	}
}

// FuzzAdoptBody: an adopt body is outside bytes. Whatever the fast path
// accepts, the general path reads the same way.
func FuzzAdoptBody(f *testing.F) {
	f.Add([]byte(`{"tokens":[1,1000,1099],"share_id":7,"layout_hash":"ab"}`))
	f.Add([]byte(`{"tokens":[-0],"share_id":null}`))
	f.Add([]byte(`{"tokens":[123456789],"share_id":1,"share_id":2}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		sameAdopt(t, raw, false)
		sameAdopt(t, raw, true)
	})
}
