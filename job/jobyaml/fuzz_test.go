package jobyaml_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/job/jobyaml"
)

// FuzzParse feeds the spec parser arbitrary bytes (JSON, YAML, or neither). Nothing panics; a
// refusal wraps ErrInvalidSpec; an accepted spec validates, its layout covers every element once
// in contiguous shards no larger than shard_size, and it survives a round trip through JSON.
//
//	go test -run '^$' -fuzz FuzzParse -fuzztime 30s ./job/jobyaml
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"id: tiny\ntensors: [{name: w, shape: [4]}]\nranks: 2\nfunction: {name: sgd, hyper: {lr: 0.5}}\nshard_size: 4KiB\n",
		`{"id":"resnet-7","tensors":[{"name":"conv","shape":[64,3,7,7]},{"name":"bias","shape":[64]}],"ranks":8,"function":{"name":"adam","hyper":{"lr":0.001}},"init":{"kind":"normal","seed":1,"scale":0.01},"shard_size":"1MiB","storage":"file","replicas":3}`,
		`{"id":"x","tensors":[{"name":"w","shape":[1000,1000]}],"ranks":1,"function":{"name":"fedavg"},"shard_size":8388608}`,
		`{"id":"x","colour":1}`,
		"id: [",
		`{"id":"Has.Dots","tensors":[],"ranks":0,"sync":"asp","function":{"name":"lbfgs"}}`,
		`{"id":"x","tensors":[{"name":"w","shape":[0,-1]}],"ranks":99999,"function":{"name":"sgd","hyper":{"lr":-1}},"shard_size":"1.5MiB"}`,
		"a: &a [*a, *a]\nb: *a\n",
		`{"id":"x"} {"id":"y"}`,
		"",
		"null",
		`{"id":"x","id":"y","tensors":[{"name":"w","shape":[4],"name":"v"}]}`,
		"id: x\nid: y\n",
		"id: x\n---\nid: y\n",
		`{"id":"x","tensors":[{"name":"w","shape":[4]}],"ranks":1,"function":{"name":"sgd","hyper":{"lr":1e300}},"init":{"kind":"normal","scale":1e39}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 64<<10 || hugeLayout(data) {
			t.Skip() // see hugeLayout
		}
		s, err := jobyaml.Parse(data)
		if err != nil {
			if !errors.Is(err, job.ErrInvalidSpec) {
				t.Fatalf("error %v does not wrap job.ErrInvalidSpec", err)
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("accepted spec does not validate: %v", err)
		}
		l := s.Layout()
		off := 0
		for i, sh := range l.Shards {
			if sh.ID != i || sh.Off != off || sh.Len < 1 || int64(sh.Bytes()) > int64(s.ShardSize) && len(sh.Pieces) != 1 {
				t.Fatalf("shard %d: %+v (offset %d, shard_size %d)", i, sh, off, s.ShardSize)
			}
			n := 0
			for _, p := range sh.Pieces {
				n += p.Len
			}
			if n != sh.Len {
				t.Fatalf("shard %d: pieces hold %d elements, the shard %d", i, n, sh.Len)
			}
			off += sh.Len
		}
		if off != l.Elements || l.Elements != s.NumElements() {
			t.Fatalf("layout covers %d of %d elements", off, s.NumElements())
		}
		js, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		again, err := jobyaml.Parse(js)
		if err != nil {
			t.Fatalf("round trip of %s: %v", js, err)
		}
		if !reflect.DeepEqual(normalHyper(again), normalHyper(s)) {
			t.Fatalf("round trip changed the spec:\n%+v\n%+v", s, again)
		}
	})
}

// hugeLayout screens out specs whose layout would have more than a million shards: Validate
// builds the layout before it counts the shards, so such a spec costs seconds and a gigabyte each
// (the gateway refuses them before parsing; see gateway.minShards).
func hugeLayout(data []byte) bool {
	var s job.Spec
	js, err := yaml.YAMLToJSON(data)
	if err != nil || json.Unmarshal(js, &s) != nil {
		return false
	}
	target := int64(s.ShardSize) / 4
	if target <= 0 {
		target = job.DefaultShardSize / 4
	}
	var n int64
	for _, t := range s.Tensors {
		e := int64(1)
		for _, d := range t.Shape {
			if d < 1 || e > job.MaxElements/int64(d) {
				e = 0
				break
			}
			e *= int64(d)
		}
		n += e / target
	}
	return n > 1<<16
}

func normalHyper(s *job.Spec) *job.Spec {
	c := *s
	if len(c.Function.Hyper) == 0 {
		c.Function.Hyper = nil
	}
	return &c
}
