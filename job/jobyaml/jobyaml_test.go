package jobyaml_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/job/jobyaml"
)

func TestParseYAMLAndUnits(t *testing.T) {
	t.Parallel()
	s, err := jobyaml.Parse([]byte(`
id: mlp
tensors:
  - {name: w, shape: [784, 128]}
ranks: 4
function: {name: adam, hyper: {lr: 0.001}}
shard_size: 256KiB
storage: file
`))
	if err != nil {
		t.Fatal(err)
	}
	if s.ShardSize != 256<<10 || s.Sync != "bsp" || s.Replicas != 1 || s.Init.Kind != "zeros" || s.Priority != job.PriorityNormal {
		t.Fatalf("parsed %+v", s)
	}
	if _, err := jobyaml.Parse([]byte("id: x\ntensors: [{name: w, shape: [4]}]\nranks: 1\nfunction: {name: sum}\ncolour: red\n")); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Fatalf("unknown field: got %v", err)
	}
}

// Parse refuses what a lenient decoder would accept silently, in JSON and in YAML, each with a
// specific error.
func TestParseStrict(t *testing.T) {
	t.Parallel()
	const base = `{"id":"a","tensors":[{"name":"w","shape":[4]}],"ranks":1,"function":{"name":"sgd","hyper":{"lr":0.1}}}`
	const yamlBase = "id: a\ntensors: [{name: w, shape: [4]}]\nranks: 1\nfunction: {name: sgd, hyper: {lr: 0.1}}\n"
	for _, ok := range []string{base, yamlBase, "\n  " + base + "\n"} {
		if _, err := jobyaml.Parse([]byte(ok)); err != nil {
			t.Fatalf("%q: %v", ok, err)
		}
	}
	for _, c := range []struct{ name, spec, want string }{
		{"empty", "  \n", "the spec is empty"},
		{"JSON then another object", base + ` {"id":"b"}`, "trailing data"},
		{"JSON then garbage", base + "garbage", "trailing data"},
		{"JSON then a YAML document", base + "\n---\nid: b\n", "trailing data"},
		{"two YAML documents", yamlBase + "---\nid: b\n", "one YAML document only"},
		{"duplicate JSON key", `{"id":"a","id":"b","tensors":[{"name":"w","shape":[4]}],"ranks":1,"function":{"name":"sgd","hyper":{"lr":0.1}}}`, `"id" is given twice`},
		{"duplicate nested JSON key", `{"id":"a","tensors":[{"name":"w","shape":[4],"name":"v"}],"ranks":1,"function":{"name":"sgd","hyper":{"lr":0.1}}}`, `"name" is given twice`},
		{"duplicate YAML key", "id: a\nid: b\n" + yamlBase[6:], `key "id" already set`},
		{"a YAML list", "- " + base + "\n", "cannot unmarshal array"},
		{"a YAML string", "resnet\n", "cannot unmarshal string"},
		{"YAML null", "~\n", "tensors"}, // an empty spec: every field missing
		{"not YAML", "id: [\n", "not JSON or YAML"},
		{"overflowing hyper-parameter", `{"id":"a","tensors":[{"name":"w","shape":[4]}],"ranks":1,"function":{"name":"sgd","hyper":{"lr":1e300}}}`, "(float32)"},
		{"initial parameters overflow", "id: a\ntensors: [{name: w, shape: [4]}]\nranks: 1\nfunction: {name: sgd, hyper: {lr: 0.1}}\ninit: {kind: normal, scale: 1e39}\n", "init.scale"},
	} {
		_, err := jobyaml.Parse([]byte(c.spec))
		if err == nil || !errors.Is(err, job.ErrInvalidSpec) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an invalid spec error containing %q", c.name, err, c.want)
		}
	}
}

// DecodeStrict takes any request body as Parse takes a spec: JSON or YAML, strictly.
func TestDecodeStrict(t *testing.T) {
	t.Parallel()
	type req struct {
		Workers int    `json:"workers"`
		Team    string `json:"team"`
	}
	for _, in := range []string{`{"workers": 3, "team": "a"}`, "workers: 3\nteam: a\n"} {
		var r req
		if err := jobyaml.DecodeStrict([]byte(in), &r); err != nil || r != (req{3, "a"}) {
			t.Errorf("%q: %+v, %v", in, r, err)
		}
	}
	for _, c := range []struct{ in, want string }{
		{`{"workers": 3, "workers": 4}`, `"workers" is given twice`},
		{"workers: 3\nworkers: 4\n", `key "workers" already set`},
		{"workers: 3\nteem: a\n", "teem"},
		{`{"workers": 3} {}`, "trailing data"},
		{"", "empty"},
	} {
		var r req
		if err := jobyaml.DecodeStrict([]byte(c.in), &r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error containing %q", c.in, err, c.want)
		}
	}
}
