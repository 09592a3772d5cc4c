// Package jsonexact unmarshals JSON objects into Go structs the way
// llama.cpp's nlohmann::json looks keys up: a key matches a field's JSON name
// exactly (byte for byte: no case folding, no Unicode folding), and a key
// that appears more than once keeps its last value.
//
// encoding/json matches keys case-insensitively with Unicode simple folding,
// so {"id_slot":0,"ID_SLOT":1} or {"id_slot":0,"id_ſlot":1} (U+017F folds to
// 's') read as id_slot 1 there and as 0 in llama-server: a proxy that checks
// "id_slot" and a server that reads another key disagree on the slot.
//
// Unmarshal walks structs, pointers to structs and slices of structs itself
// and hands every other value (numbers, strings, bools, maps,
// json.RawMessage) to encoding/json, whose map keys are exact already.
package jsonexact

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// Unmarshal parses data into v (a non-nil pointer) with exact key matching
// at every level. Keys without a matching field are ignored, as
// encoding/json ignores them. Errors wrap encoding/json's with the path of
// the field ("messages[1].role: …").
func Unmarshal(data []byte, v any) error { return unmarshal(data, v, false) }

// UnmarshalStrict is Unmarshal that also refuses, at every level, a key no
// field is named exactly (ErrUnknownKey): "FD_INDEX" is an unknown key, not
// fd_index.
func UnmarshalStrict(data []byte, v any) error { return unmarshal(data, v, true) }

// ErrUnknownKey: UnmarshalStrict met a key without a field of that exact name.
var ErrUnknownKey = errors.New("jsonexact: unknown key")

func unmarshal(data []byte, v any, strict bool) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("jsonexact: Unmarshal needs a non-nil pointer, got %T", v)
	}
	return (&walker{strict: strict}).set(bytes.TrimSpace(data), rv.Elem())
}

type walker struct{ strict bool }

func isNull(data []byte) bool { return string(data) == "null" }

var rawType = reflect.TypeFor[json.RawMessage]()

func (w *walker) set(data []byte, rv reflect.Value) error {
	t := rv.Type()
	if t == rawType || !needsWalk(t) {
		return json.Unmarshal(data, rv.Addr().Interface())
	}
	switch t.Kind() {
	case reflect.Pointer:
		if isNull(data) {
			rv.SetZero()
			return nil
		}
		if rv.IsNil() {
			rv.Set(reflect.New(t.Elem()))
		}
		return w.set(data, rv.Elem())
	case reflect.Slice:
		if isNull(data) {
			rv.SetZero()
			return nil
		}
		var items []json.RawMessage
		if err := json.Unmarshal(data, &items); err != nil {
			return err
		}
		s := reflect.MakeSlice(t, len(items), len(items))
		for i, it := range items {
			if err := w.set(bytes.TrimSpace(it), s.Index(i)); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
		rv.Set(s)
		return nil
	case reflect.Struct:
		if isNull(data) {
			return nil
		}
		var m map[string]json.RawMessage // exact keys; a duplicate keeps the last
		if err := json.Unmarshal(data, &m); err != nil {
			return err
		}
		known := 0
		for i := range t.NumField() {
			f := t.Field(i)
			name, ok := fieldName(f)
			if !ok {
				continue
			}
			raw, ok := m[name]
			if !ok {
				continue
			}
			known++
			if err := w.set(bytes.TrimSpace(raw), rv.Field(i)); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		if w.strict && known < len(m) {
			for k := range m {
				if !hasField(t, k) {
					return fmt.Errorf("%w %q", ErrUnknownKey, k)
				}
			}
		}
		return nil
	}
	return json.Unmarshal(data, rv.Addr().Interface())
}

// needsWalk reports whether t holds a struct that encoding/json would match
// keys of (directly, through pointers or in slices).
func needsWalk(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
		t = t.Elem()
	}
	return t.Kind() == reflect.Struct && !reflect.PointerTo(t).Implements(reflect.TypeFor[json.Unmarshaler]())
}

func hasField(t reflect.Type, key string) bool {
	for i := range t.NumField() {
		if name, ok := fieldName(t.Field(i)); ok && name == key {
			return true
		}
	}
	return false
}

// fieldName is the JSON name of f, or false when encoding/json skips it.
func fieldName(f reflect.StructField) (string, bool) {
	if !f.IsExported() {
		return "", false
	}
	tag := f.Tag.Get("json")
	if tag == "-" {
		return "", false
	}
	name, _, _ := strings.Cut(tag, ",")
	if name == "" {
		name = f.Name
	}
	return name, true
}
