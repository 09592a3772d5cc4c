// Package schemas holds the JSON Schemas (draft 2020-12) of the formats
// onebitd exchanges with other programs, embedded, and validates documents
// against them:
//
//   - KindEvent, event.json: a handoff event (NATS payload, event log line);
//   - KindShareHeader, share-header.json: the share message header;
//   - KindTokens, tokens.json: the tokens file given to a provider.
//
// The schema files are the published contract; the Go types (event.Event,
// fdpass.Header) and their tests keep to them.
package schemas

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Schema kinds: the names Validate takes, and the files' base names.
const (
	KindEvent       = "event"
	KindShareHeader = "share-header"
	KindTokens      = "tokens"
)

// Kinds lists every schema kind.
var Kinds = []string{KindEvent, KindShareHeader, KindTokens}

// baseURL is the $id prefix of every schema.
const baseURL = "https://github.com/onebitd/onebitd/schemas/"

// Errors of Validate.
var (
	// ErrUnknownKind: no schema of that name.
	ErrUnknownKind = errors.New("schemas: unknown schema kind")
	// ErrNotJSON: the document is not JSON.
	ErrNotJSON = errors.New("schemas: document is not JSON")
	// ErrInvalid: the document does not satisfy the schema; the wrapped
	// *jsonschema.ValidationError says where and why.
	ErrInvalid = errors.New("schemas: document does not match the schema")
)

//go:embed *.json
var files embed.FS

// FS is the schema files, for serving or copying.
func FS() embed.FS { return files }

var compiled = sync.OnceValues(compile)

// compile compiles every embedded schema, with format assertions on and no
// loading from anywhere but the embedded files.
func compile() (map[string]*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	c.UseLoader(refuseLoader{})
	for _, kind := range Kinds {
		raw, err := files.ReadFile(kind + ".json")
		if err != nil {
			return nil, fmt.Errorf("schemas: %w", err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("schemas: %s.json: %w", kind, err)
		}
		if err := c.AddResource(baseURL+kind+".json", doc); err != nil {
			return nil, fmt.Errorf("schemas: %s.json: %w", kind, err)
		}
	}
	out := make(map[string]*jsonschema.Schema, len(Kinds))
	for _, kind := range Kinds {
		s, err := c.Compile(baseURL + kind + ".json")
		if err != nil {
			return nil, fmt.Errorf("schemas: compile %s.json: %w", kind, err)
		}
		out[kind] = s
	}
	return out, nil
}

// refuseLoader keeps the compiler from reading files or the network: every
// schema is embedded.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schemas: %s is not an embedded schema", url)
}

// Schema returns the compiled schema of kind.
func Schema(kind string) (*jsonschema.Schema, error) {
	all, err := compiled()
	if err != nil {
		return nil, err
	}
	s, ok := all[kind]
	if !ok {
		return nil, fmt.Errorf("%w %q (have %v)", ErrUnknownKind, kind, Kinds)
	}
	return s, nil
}

// Validate checks one JSON document against the schema of kind.
func Validate(kind string, doc []byte) error {
	s, err := Schema(kind)
	if err != nil {
		return err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotJSON, err)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%w %s: %w", ErrInvalid, kind, err)
	}
	return nil
}
