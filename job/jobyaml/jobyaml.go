// Package jobyaml decodes job specs, and the other documents fanin's HTTP API takes, written in
// JSON or YAML, as strictly as package job decodes JSON. It is the YAML half of package job, kept
// apart so that what a worker links holds no YAML parser: the gateway and the CLI import it.
package jobyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	yaml3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"

	"github.com/fanin-ml/fanin/job"
)

// Parse decodes a spec from JSON or YAML, rejecting unknown fields, then normalizes and validates
// it (job.ParseJSON).
//
// It is strict: one document only (no trailing data, no second YAML document), no key given twice
// (JSON and YAML would silently keep the last), no unknown field.
func Parse(data []byte) (*job.Spec, error) {
	js, err := toJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", job.ErrInvalidSpec, err)
	}
	return job.ParseJSON(js)
}

// DecodeStrict decodes one JSON or YAML document into v as strictly as Parse decodes a spec: no
// key given twice in one object, no unknown field, nothing after the document. The gateway decodes
// every request body with it.
func DecodeStrict(data []byte, v any) error {
	js, err := toJSON(data)
	if err != nil {
		return err
	}
	return job.DecodeStrictJSON(js, v)
}

// toJSON turns a document in JSON or YAML into JSON, refusing what a lenient decoder would accept
// silently: an empty document, data after the first document, and keys given twice (JSON's are
// refused by job.DecodeStrictJSON).
func toJSON(data []byte) ([]byte, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, errors.New("the spec is empty: send a job spec in JSON or YAML")
	}
	if trimmed[0] == '{' {
		return trimmed, nil
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
