package job

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/fanin-ml/fanin/wire"
)

func validSpec() Spec {
	return Spec{
		ID:       "resnet-7",
		Tensors:  []Tensor{{Name: "conv", Shape: []int{64, 3, 7, 7}}, {Name: "bias", Shape: []int{64}}},
		Ranks:    8,
		Function: Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}},
	}
}

func TestValidateSpecificErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		edit  func(*Spec)
		field string
		msg   string
	}{
		{"bad id", func(s *Spec) { s.ID = "Has.Dots" }, "id", "a-z, 0-9"},
		{"no tensors", func(s *Spec) { s.Tensors = nil }, "tensors", "at least one"},
		{"zero dim", func(s *Spec) { s.Tensors[0].Shape[1] = 0 }, "tensors[0].shape[1]", "must be >= 1, got 0"},
		{"dup tensor", func(s *Spec) { s.Tensors[1].Name = "conv" }, "tensors[1].name", "duplicate"},
		{"no ranks", func(s *Spec) { s.Ranks = 0 }, "ranks", "must be 1..4096, got 0"},
		{"ssp", func(s *Spec) { s.Sync = "ssp" }, "staleness", "ssp needs a staleness bound of 1..16 steps, got 0"},
		{"ssp far", func(s *Spec) { s.Sync, s.Staleness = "ssp", 17 }, "staleness", "got 17"},
		{"bsp staleness", func(s *Spec) { s.Staleness = 2 }, "staleness", "bsp does not take one"},
		{"asp staleness", func(s *Spec) { s.Sync, s.Staleness = "asp", 1 }, "staleness", "asp does not take one"},
		{"sync", func(s *Spec) { s.Sync = "lockstep" }, "sync", "must be bsp, ssp or asp"},
		{"function", func(s *Spec) { s.Function.Name = "adamx" }, "function", `unknown function "adamx"`},
		{"hyper", func(s *Spec) { s.Function.Hyper = map[string]float64{"lr": -1} }, "function", "lr"},
		{"shard small", func(s *Spec) { s.ShardSize = 1024 }, "shard_size", "must be 4 KiB..8 MiB"},
		{"shard big", func(s *Spec) { s.ShardSize = 9 << 20 }, "shard_size", "got 9 MiB"},
		{"shard odd", func(s *Spec) { s.ShardSize = 4097 * 2 }, "shard_size", "multiple of 4"},
		{"upload shards", func(s *Spec) {
			s.Init.Kind, s.ShardSize, s.Tensors = "upload", 4<<10, []Tensor{{Name: "w", Shape: []int{1024, 4097}}}
		}, "shard_size", "gives 4097 shards, more than 4096 for init upload"},
		{"storage", func(s *Spec) { s.Storage = "disk" }, "storage", "memory or file"},
		{"replicas", func(s *Spec) { s.Replicas = 2 }, "replicas", "1, 3 or 5"},
		{"init", func(s *Spec) { s.Init.Kind = "xavier" }, "init.kind", "zeros, uniform, normal or upload"},
		{"priority", func(s *Spec) { s.Priority = "urgent" }, "priority", `must be high, normal or low, got "urgent"`},
		{"priority case", func(s *Spec) { s.Priority = "High" }, "priority", `got "High"`},
		{"param_dtype f16", func(s *Spec) { s.ParamDtype = "f16" }, "param_dtype", "±65504 would become Inf"},
		{"param_dtype", func(s *Spec) { s.ParamDtype = "fp8" }, "param_dtype", `must be f32 (default) or bf16, got "fp8"`},
		{"param_dtype case", func(s *Spec) { s.ParamDtype = "BF16" }, "param_dtype", `got "BF16"`},
		{"gradients", func(s *Spec) { s.Gradients = "core" }, "gradients", `must be stored (default) or direct, got "core"`},
		{"gradients ssp", func(s *Spec) { s.Sync, s.Staleness, s.Gradients = "ssp", 2, "direct" }, "gradients", "direct is offered for bsp only: ssp applies"},
		{"gradients asp", func(s *Spec) { s.Sync, s.Gradients = "asp", "direct" }, "gradients", "direct is offered for bsp only: asp applies"},
		{"gradient_streams negative", func(s *Spec) { s.GradientStreams = -1 }, "gradient_streams", "must be 1..64, got -1"},
		{"gradient_streams many", func(s *Spec) { s.GradientStreams = 65 }, "gradient_streams", "must be 1..64, got 65"},
		{"gradient_streams direct", func(s *Spec) { s.Gradients, s.GradientStreams = "direct", 2 }, "gradient_streams", "gradients: direct has no gradient stream"},
		{"gradient_streams beyond shards", func(s *Spec) { s.GradientStreams = 64 }, "gradient_streams", "64 streams for "},
		{"gradient_streams shards", func(s *Spec) {
			s.GradientStreams, s.ShardSize, s.Tensors = 2, 4<<10, []Tensor{{Name: "w", Shape: []int{1024, 4097}}}
		}, "shard_size", "gives 4097 shards, more than 4096 with gradient_streams"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := validSpec()
			s.Normalize()
			c.edit(&s)
			err := s.Validate()
			var se *SpecError
			if !errors.As(err, &se) || !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("got %v, want a *SpecError", err)
			}
			for _, f := range se.Fields {
				if f.Field == c.field && strings.Contains(f.Msg, c.msg) {
					return
				}
			}
			t.Fatalf("got %v, want field %s with %q", err, c.field, c.msg)
		})
	}
	s := validSpec()
	s.Normalize()
	if err := s.Validate(); err != nil {
		t.Fatalf("valid spec refused: %v", err)
	}
}

func TestParseJSONAndUnits(t *testing.T) {
	t.Parallel()
	s, err := ParseJSON([]byte(`{"id":"mlp","tensors":[{"name":"w","shape":[784,128]}],"ranks":4,
		"function":{"name":"adam","hyper":{"lr":0.001}},"shard_size":"256KiB","storage":"file"}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.ShardSize != 256<<10 || s.Sync != "bsp" || s.Replicas != 1 || s.Init.Kind != "zeros" || s.Priority != PriorityNormal {
		t.Fatalf("parsed %+v", s)
	}
	for _, c := range []struct {
		priority string
		class    int
	}{{"high", 1}, {"normal", 0}, {"low", -1}} {
		s, err := ParseJSON([]byte(`{"id":"x","tensors":[{"name":"w","shape":[4]}],"ranks":1,"function":{"name":"sum"},"priority":"` + c.priority + `"}`))
		if err != nil || s.Priority != c.priority || s.PriorityClass() != c.class {
			t.Fatalf("priority %s: got %+v, %v", c.priority, s, err)
		}
	}
	if (&Spec{}).PriorityClass() != 0 {
		t.Fatalf("a record stored before priorities existed must read as normal")
	}
	for _, c := range []struct {
		field string // the param_dtype key, or "" for none
		want  wire.Dtype
	}{{"", wire.F32}, {`,"param_dtype":"f32"`, wire.F32}, {`,"param_dtype":"bf16"`, wire.BF16}} {
		s, err := ParseJSON([]byte(`{"id":"x","tensors":[{"name":"w","shape":[4]}],"ranks":1,"function":{"name":"sum"}` + c.field + `}`))
		if err != nil || s.ParamsDtype() != c.want {
			t.Fatalf("param_dtype %q: got %+v, %v", c.field, s, err)
		}
		// A spec without param_dtype keeps its JSON: records stored before the field existed
		// and new f32 ones are byte-identical.
		if js, _ := json.Marshal(s); c.field == "" && strings.Contains(string(js), "param_dtype") {
			t.Fatalf("an f32 spec's JSON names param_dtype: %s", js)
		}
	}
	if _, err := ParseJSON([]byte(`{"id":"x","tensors":[{"name":"w","shape":[4]}],"ranks":1,"function":{"name":"sum"},"colour":"red"}`)); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Fatalf("unknown field: got %v", err)
	}
	if _, err := ParseJSON([]byte(`{"id":"x","shard_size":"lots"}`)); err == nil || !strings.Contains(err.Error(), "shard_size") {
		t.Fatalf("bad size: got %v", err)
	}
}

// Layout properties over random specs: every element in exactly one shard, shards contiguous and in
// order, none empty or over the target, tensors up to the target never split, deterministic.
func TestLayoutProperties(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 500; trial++ {
		s := Spec{ShardSize: ByteSize(4 * (1 + rng.IntN(5000)))}
		for i := range 1 + rng.IntN(12) {
			shape := []int{1 + rng.IntN(3000)}
			if rng.IntN(3) == 0 {
				shape = append(shape, 1+rng.IntN(40))
			}
			s.Tensors = append(s.Tensors, Tensor{Name: string(rune('a' + i)), Shape: shape})
		}
		target := int(s.ShardSize / 4)
		l := s.Layout()
		if l.Elements != s.NumElements() {
			t.Fatalf("trial %d: layout covers %d of %d elements", trial, l.Elements, s.NumElements())
		}
		next := 0
		for i, sh := range l.Shards {
			if sh.ID != i || sh.Off != next || sh.Len < 1 || sh.Len > target {
				t.Fatalf("trial %d: shard %+v breaks contiguity or the bound %d", trial, sh, target)
			}
			sum := 0
			for _, p := range sh.Pieces {
				sum += p.Len
			}
			if sum != sh.Len {
				t.Fatalf("trial %d: shard %d pieces cover %d of %d", trial, i, sum, sh.Len)
			}
			next += sh.Len
		}
		if next != l.Elements {
			t.Fatalf("trial %d: shards end at %d, want %d", trial, next, l.Elements)
		}
		for _, tn := range s.Tensors {
			if n := tn.Elements(); n <= target {
				pieces := 0
				for _, sh := range l.Shards {
					for _, p := range sh.Pieces {
						if p.Tensor == tn.Name {
							pieces++
						}
					}
				}
				if pieces != 1 {
					t.Fatalf("trial %d: tensor %s of %d <= %d elements split into %d pieces", trial, tn.Name, n, target, pieces)
				}
			}
		}
		if got := s.shardCount(); got != int64(len(l.Shards)) {
			t.Fatalf("trial %d: shardCount %d, layout has %d shards", trial, got, len(l.Shards))
		}
		again := s.Layout()
		if len(again.Shards) != len(l.Shards) || again.Shards[len(l.Shards)-1].Off != l.Shards[len(l.Shards)-1].Off {
			t.Fatalf("trial %d: layout is not stable", trial)
		}
	}
}

// Small tensors share a shard; a large one is split evenly.
func TestLayoutGroupsAndSplits(t *testing.T) {
	t.Parallel()
	s := Spec{ShardSize: 4096, Tensors: []Tensor{
		{Name: "a", Shape: []int{100}}, {Name: "b", Shape: []int{200}}, {Name: "c", Shape: []int{2500}}, {Name: "d", Shape: []int{10}},
	}}
	l := s.Layout()
	var got []int
	for _, sh := range l.Shards {
		got = append(got, sh.Len)
	}
	want := []int{300, 833, 833, 834, 10}
	if len(got) != len(want) {
		t.Fatalf("shard sizes %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("shard sizes %v, want %v", got, want)
		}
	}
}

// Init values depend on the element's global index only: any sharding gives the same vector.
func TestInitIndependentOfSharding(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"uniform", "normal"} {
		s := Spec{Init: Init{Kind: kind, Seed: 3, Scale: 0.5}}
		whole := make([]float32, 1000)
		s.InitShard(0, whole)
		part := make([]float32, 300)
		s.InitShard(450, part)
		for i := range part {
			if part[i] != whole[450+i] {
				t.Fatalf("%s: element %d differs between shardings", kind, 450+i)
			}
		}
		var nonzero int
		for _, v := range whole {
			if v != 0 {
				nonzero++
			}
			if v < -5 || v > 5 {
				t.Fatalf("%s: value %v out of any plausible range for scale 0.5", kind, v)
			}
		}
		if nonzero < 990 {
			t.Fatalf("%s: only %d of 1000 values non-zero", kind, nonzero)
		}
	}
}

func TestParseByteSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]ByteSize{"4096": 4096, "1MiB": 1 << 20, "256 KiB": 256 << 10, "4KB": 4000} {
		if got, err := ParseByteSize(in); err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-4", "1.5MiB", "9999999999999999GiB"} {
		if _, err := ParseByteSize(in); err == nil {
			t.Errorf("ParseByteSize(%q) accepted", in)
		}
	}
}

// A tiny spec that describes millions of shards is refused without building them.
// Not parallel: testing.AllocsPerRun counts the whole process's allocations.
func TestValidateManyShardsCheaply(t *testing.T) {
	s := validSpec()
	s.Normalize()
	s.Tensors = []Tensor{{Name: "w", Shape: []int{1 << 16, 1 << 15}}} // 2^31 elements
	s.ShardSize = MinShardSize
	allocs := testing.AllocsPerRun(1, func() { _ = s.Validate() })
	err := s.Validate()
	if err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("got %v, want too many shards", err)
	}
	if allocs > 1000 {
		t.Fatalf("validation allocated %v times: it built the layout", allocs)
	}
}

// ParseJSON refuses what a lenient decoder would accept silently, each with a specific error.
func TestParseJSONStrict(t *testing.T) {
	t.Parallel()
	const base = `{"id":"a","tensors":[{"name":"w","shape":[4]}],"ranks":1,"function":{"name":"sgd","hyper":{"lr":0.1}}}`
	if _, err := ParseJSON([]byte(base)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, spec, want string }{
		{"empty", "  \n", "the document is empty"},
		{"YAML", "id: a\ntensors: [{name: w, shape: [4]}]\nranks: 1\nfunction: {name: sgd, hyper: {lr: 0.1}}\n", "not JSON"},
		{"a JSON list", "[" + base + "]", "cannot unmarshal array"},
		{"a JSON list then garbage", "[" + base + "] x", "cannot unmarshal array"},
		{"a JSON string then more", `"a" "b"`, "cannot unmarshal string"},
		{"null then more", "null 1", "trailing data"},
		{"JSON then another object", base + ` {"id":"b"}`, "trailing data"},
		{"JSON then garbage", base + "garbage", "trailing data"},
		{"JSON then a YAML document", base + "\n---\nid: b\n", "trailing data"},
		{"duplicate JSON key", `{"id":"a","id":"b","tensors":[{"name":"w","shape":[4]}],"ranks":1,"function":{"name":"sgd","hyper":{"lr":0.1}}}`, `"id" is given twice`},
		{"duplicate nested JSON key", `{"id":"a","tensors":[{"name":"w","shape":[4],"name":"v"}],"ranks":1,"function":{"name":"sgd","hyper":{"lr":0.1}}}`, `"name" is given twice`},
		{"overflowing hyper-parameter", `{"id":"a","tensors":[{"name":"w","shape":[4]}],"ranks":1,"function":{"name":"sgd","hyper":{"lr":1e300}}}`, "(float32)"},
		{"initial parameters overflow", `{"id":"a","tensors":[{"name":"w","shape":[4]}],"ranks":1,"function":{"name":"sgd","hyper":{"lr":0.1}},"init":{"kind":"normal","scale":1e39}}`, "init.scale"},
	} {
		_, err := ParseJSON([]byte(c.spec))
		if err == nil || !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an invalid spec error containing %q", c.name, err, c.want)
		}
	}
	// The largest scale allowed gives finite initial parameters.
	s, err := ParseJSON([]byte(`{"id":"a","tensors":[{"name":"w","shape":[4096]}],"ranks":1,"function":{"name":"sgd","hyper":{"lr":0.1}},"init":{"kind":"normal","scale":3.78e37}}`))
	if err != nil {
		t.Fatal(err)
	}
	v := make([]float32, 4096)
	s.InitShard(0, v)
	for i, x := range v {
		if math.IsInf(float64(x), 0) || math.IsNaN(float64(x)) {
			t.Fatalf("element %d is %v", i, x)
		}
	}
}

// GradStreams is 1 for a stored job that asks for none or one (records from before the field),
// what it asks for beyond, and 0 for a direct job.
func TestGradStreams(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		gradients string
		asked     int
		want      int
	}{{"", 0, 1}, {"stored", 1, 1}, {"stored", 3, 3}, {"direct", 0, 0}} {
		s := validSpec()
		s.Gradients, s.GradientStreams = c.gradients, c.asked
		if got := s.GradStreams(); got != c.want {
			t.Errorf("gradients %q, gradient_streams %d: GradStreams() = %d, want %d", c.gradients, c.asked, got, c.want)
		}
	}
}
