package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// MaxInitScale bounds init.scale: uniform values lie within ±scale and normal ones within about
// ±8.6 scale (the largest Box-Muller deviate of 53-bit uniforms), and all must be finite float32.
const MaxInitScale = math.MaxFloat32 / 9

// ParseJSON decodes a spec from JSON, rejecting unknown fields, then normalizes and validates it.
//
// It is strict: one JSON object only (no trailing data), no key given twice in one object
// (encoding/json would silently keep the last), no unknown field. Package job/jobyaml parses a
// spec written in JSON or YAML (the gateway takes both) and keeps the YAML parser out of this
// package, which every worker links.
func ParseJSON(data []byte) (*Spec, error) {
	var s Spec
	if err := DecodeStrictJSON(data, &s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSpec, err)
	}
	s.Normalize()
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// DecodeStrictJSON decodes one JSON value, an object, into v as strictly as ParseJSON decodes a
// spec: no key given twice in one object, no unknown field, nothing after the value.
func DecodeStrictJSON(data []byte, v any) error {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return errors.New("the document is empty: send one JSON object")
	}
	if trimmed[0] == '{' {
		if err := checkJSON(trimmed); err != nil {
			return err
		}
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if _, ok := errors.AsType[*json.SyntaxError](err); ok {
			return fmt.Errorf("not JSON: %v", err)
		}
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the document: one JSON value only")
	}
	return nil
}

// checkJSON refuses a JSON document with a key given twice in one object, or anything after it.
func checkJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		keys   map[string]bool
		object bool
		key    bool // in an object: the next token is a key
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("not JSON: %v", err)
		}
		if len(stack) == 0 && (tok != json.Delim('{') || dec.InputOffset() != 1) {
			return errors.New("trailing data after the spec: one JSON object only")
		}
		top := len(stack) - 1
		switch tok {
		case json.Delim('{'):
			if top >= 0 && stack[top].object {
				stack[top].key = true
			}
			stack = append(stack, frame{keys: map[string]bool{}, object: true, key: true})
			continue
		case json.Delim('['):
			if top >= 0 && stack[top].object {
				stack[top].key = true
			}
			stack = append(stack, frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:top]
			if len(stack) == 0 {
				if dec.More() || len(bytes.TrimSpace(data[dec.InputOffset():])) > 0 {
					return errors.New("trailing data after the spec: one JSON object only")
				}
				return nil
			}
			continue
		}
		if top >= 0 && stack[top].object {
			if stack[top].key {
				k, _ := tok.(string)
				if stack[top].keys[k] {
					return fmt.Errorf("the key %q is given twice in one object", k)
				}
				stack[top].keys[k] = true
			}
			stack[top].key = !stack[top].key
		}
	}
}
