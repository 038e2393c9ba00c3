package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	yaml3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// MaxInitScale bounds init.scale: uniform values lie within ±scale and normal ones within about
// ±8.6 scale (the largest Box-Muller deviate of 53-bit uniforms), and all must be finite float32.
const MaxInitScale = math.MaxFloat32 / 9

// DecodeStrict decodes one JSON or YAML document into v as strictly as Parse decodes a spec: no
// key given twice in one object, no unknown field, nothing after the document. The gateway decodes
// every request body with it.
func DecodeStrict(data []byte, v any) error {
	js, err := toJSON(data)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// toJSON turns a spec in JSON or YAML into JSON, refusing what a lenient decoder would accept
// silently: an empty document, data after the first document, and keys given twice.
func toJSON(data []byte) ([]byte, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, errors.New("the spec is empty: send a job spec in JSON or YAML")
	}
	if trimmed[0] == '{' {
		return trimmed, checkJSON(trimmed)
	}
	dec := yaml3.NewDecoder(bytes.NewReader(data))
	var doc yaml3.Node
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("not JSON or YAML: %v", err)
	}
	var next yaml3.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the spec: one YAML document only")
	}
	js, err := yaml.YAMLToJSONStrict(data) // strict: a mapping key given twice is an error
	if err != nil {
		return nil, fmt.Errorf("not JSON or YAML: %v", err)
	}
	return js, nil
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
