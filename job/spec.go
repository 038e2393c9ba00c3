package job

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/wire"
)

// Spec is what a user submits to create a job. Zero fields take the defaults of Normalize.
type Spec struct {
	ID      string   `json:"id"`
	Tensors []Tensor `json:"tensors"`
	Ranks   int      `json:"ranks"`
	Sync    string   `json:"sync,omitempty"` // bsp (default), ssp or asp
	// Staleness is SSP's bound s: a worker may publish steps t+1..t+s before step t's parameters
	// arrive. Required with ssp (1..MaxStaleness), refused with bsp and asp.
	Staleness int      `json:"staleness,omitempty"`
	Function  Function `json:"function"`
	Init      Init     `json:"init,omitempty"`
	// ShardSize is the target shard size in bytes: 1048576, or a string such as "1MiB", "256KiB".
	ShardSize ByteSize `json:"shard_size,omitempty"`
	Storage   string   `json:"storage,omitempty"`  // memory (default) or file: JetStream storage of the job's streams
	Replicas  int      `json:"replicas,omitempty"` // JetStream replicas, 1 (default), 3 or 5
	// AllowNonFinite accepts NaN and Inf in gradients; by default they are rejected.
	AllowNonFinite bool `json:"allow_nonfinite,omitempty"`
	// Priority is the job's class: high, normal (default) or low. When the pool is at its
	// max_runtimes, lower classes absorb the slowdown first: the autoscaler gives high jobs' shards
	// their headroom first, and a runtime runs ready high work before normal before low. Only an
	// admin may create a high job (the gateway refuses it to team tokens). See
	// docs/design/autoscaler.md, "Priorities".
	Priority string `json:"priority,omitempty"`
	// ParamDtype is the element type of the parameters messages the workers receive after step 0:
	// f32 (the default; empty means f32, as in records stored before the field existed) or bf16
	// (half the bytes: the service's f32 master parameters rounded to nearest even; step 0 and
	// checkpoints stay f32). f16 is not offered: a parameter beyond ±65504 would become Inf in the
	// workers' copy. See ParamsDtype and docs/PROTOCOL.md, section 3.
	ParamDtype string `json:"param_dtype,omitempty"`
	// Gradients is how the workers' gradients reach the runtimes: stored (the default; empty
	// means stored, as in records stored before the field existed) publishes them into the job's
	// gradient stream, which the runtimes replay after a crash; direct sends them to the runtime
	// that serves the shard as core NATS requests, stored nowhere: the workers keep each step's
	// gradients until they hold the next step's parameters and send them again on a gap (bsp
	// only; docs/PROTOCOL.md, "Direct gradients").
	Gradients string `json:"gradients,omitempty"`
	// GradientStreams is how many JetStream streams keep a stored job's gradients: 1 (the
	// default; 0 or absent means 1) up to MaxGradientStreams, at most one per shard. Shard s's
	// gradients go to stream s mod n. On a NATS cluster, one stream puts every gradient byte of
	// the job on one server, and from there on to the runtimes' nodes; with several, the gateway
	// places them on the nodes of the pool's runtimes and the autoscaler places each shard on a
	// runtime connected to its stream's server, so that a gradient crosses the network once. Workers
	// see no difference. Refused with gradients: direct (no gradient stream). See
	// GradStreams and docs/KUBERNETES.md.
	GradientStreams int `json:"gradient_streams,omitempty"`
}

// MaxGradientStreams bounds Spec.GradientStreams.
const MaxGradientStreams = 64

// GradStreams is how many streams keep the job's gradients: GradientStreams, or 1 when it is 0
// (records stored before the field existed), and 0 for a direct-gradients job, which has none.
func (s *Spec) GradStreams() int {
	switch {
	case s.DirectGradients():
		return 0
	case s.GradientStreams > 1:
		return s.GradientStreams
	}
	return 1
}

// Gradient delivery modes of Spec.Gradients.
const (
	GradientsStored = "stored"
	GradientsDirect = "direct"
)

// DirectGradients reports whether the job's gradients go straight to the runtimes
// (gradients: direct), not through a stream.
func (s *Spec) DirectGradients() bool { return s.Gradients == GradientsDirect }

// ParamsDtype is the dtype of the job's parameters messages after step 0: wire.BF16 for
// param_dtype bf16, otherwise wire.F32.
func (s *Spec) ParamsDtype() wire.Dtype {
	if s.ParamDtype == wire.DtypeBF16 {
		return wire.BF16
	}
	return wire.F32
}

// Priority classes of Spec.Priority.
const (
	PriorityHigh   = "high"
	PriorityNormal = "normal"
	PriorityLow    = "low"
)

// PriorityClass is the spec's priority as a number that orders the classes: -1 low, 0 normal (also
// for an empty Priority, as in records stored before the field existed), 1 high.
func (s *Spec) PriorityClass() int {
	switch s.Priority {
	case PriorityHigh:
		return 1
	case PriorityLow:
		return -1
	}
	return 0
}

// Tensor is one named parameter tensor; its elements are flattened row-major.
type Tensor struct {
	Name  string `json:"name"`
	Shape []int  `json:"shape"`
}

// Function names the aggregation function and its hyper-parameters: a built-in one ("adam"), or
// a user function uploaded as a WebAssembly module, named <owner>/<name>@<version> (see
// ParseFunctionRef and docs/FUNCTIONS.md).
type Function struct {
	Name  string             `json:"name"`
	Hyper map[string]float64 `json:"hyper,omitempty"`
	// Module, Slots and Weighted are set by the gateway when it creates a job with a user
	// function, from the module the name resolves to (whatever the request said): the module's
	// sha256 in hex, which every runtime loads, and what the module declares.
	Module   string `json:"module,omitempty"`
	Slots    int    `json:"slots,omitempty"`
	Weighted bool   `json:"weighted,omitempty"`
}

// FunctionRef is the name of a user function: Owner/Name@Version.
type FunctionRef struct {
	Owner, Name string
	Version     int
}

func (r FunctionRef) String() string { return r.Owner + "/" + r.Name + "@" + strconv.Itoa(r.Version) }

var (
	refPattern    = regexp.MustCompile(`^([a-z0-9][a-z0-9-]{0,62})/([a-z][a-z0-9_-]{0,62})@([1-9][0-9]{0,8})$`)
	digestPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ParseFunctionRef reads a user function's name, <owner>/<name>@<version>: owner the team that
// uploaded it ("admin" for the admin), name of a-z, 0-9, '_' and '-' starting with a letter,
// version a positive integer. ok is false for any other string (a built-in's name among them).
func ParseFunctionRef(s string) (FunctionRef, bool) {
	m := refPattern.FindStringSubmatch(s)
	if m == nil {
		return FunctionRef{}, false
	}
	v, _ := strconv.Atoi(m[3])
	return FunctionRef{Owner: m[1], Name: m[2], Version: v}, true
}

// IsUserFunction reports whether the spec names a user function (a name with a '/').
func (f *Function) IsUserFunction() bool { return strings.Contains(f.Name, "/") }

// ErrNeedsModule is returned by NewFunc for a user function: it runs only on an engine that
// has its module (package functions/wasmfn).
var ErrNeedsModule = errors.New("a user function needs its WebAssembly module")

// FuncSlots is the number of state vectors of the spec's function: a built-in's, or what the
// module of a user function declares (Function.Slots).
func (s *Spec) FuncSlots() (int, error) {
	if s.Function.IsUserFunction() {
		return s.Function.Slots, nil
	}
	fn, err := s.NewFunc()
	if err != nil {
		return 0, err
	}
	return fn.Slots(), nil
}

// Init says where the initial parameters come from.
type Init struct {
	Kind  string  `json:"kind,omitempty"`  // zeros (default), uniform, normal, or upload (the client publishes step 0)
	Seed  uint64  `json:"seed,omitempty"`  // uniform and normal
	Scale float64 `json:"scale,omitempty"` // uniform: values in [-scale, scale); normal: standard deviation. Default 0.01
}

// Limits of a spec.
const (
	MinShardSize     = 4 << 10
	MaxShardSize     = 8 << 20
	DefaultShardSize = 1 << 20
	MaxRanks         = 4096
	MaxTensors       = 100000
	MaxElements      = 1 << 32 // 16 GiB of float32
	MaxShards        = 1 << 20
	// MaxUploadShards bounds the shards of an init "upload" job: its upload stream names every
	// shard's subject (store.CreateJobStreams). 4096 shards of 8 MiB are 32 GiB, twice what
	// MaxElements allows: room for the worst layout (every tensor just over a shard takes two).
	MaxUploadShards = 4096
	MaxStaleness    = 16
)

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ErrInvalidSpec is wrapped by every validation error.
var ErrInvalidSpec = errors.New("invalid job spec")

// FieldError is one problem with one field of a spec.
type FieldError struct {
	Field string // JSON path, e.g. "tensors[2].shape"
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }
func (e *FieldError) Unwrap() error { return ErrInvalidSpec }

// SpecError lists every problem found in a spec.
type SpecError struct{ Fields []*FieldError }

func (e *SpecError) Error() string {
	msgs := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		msgs[i] = f.Error()
	}
	return "invalid job spec: " + strings.Join(msgs, "; ")
}
func (e *SpecError) Unwrap() error { return ErrInvalidSpec }

// Normalize fills defaults in place.
func (s *Spec) Normalize() {
	if s.Sync == "" {
		s.Sync = "bsp"
	}
	if s.Init.Kind == "" {
		s.Init.Kind = "zeros"
	}
	if s.Init.Scale == 0 && (s.Init.Kind == "uniform" || s.Init.Kind == "normal") {
		s.Init.Scale = 0.01
	}
	if s.ShardSize == 0 {
		s.ShardSize = DefaultShardSize
	}
	if s.Storage == "" {
		s.Storage = "memory"
	}
	if s.Replicas == 0 {
		s.Replicas = 1
	}
	if s.Priority == "" {
		s.Priority = PriorityNormal
	}
}

// Validate checks every field and returns a *SpecError listing all problems, or nil.
func (s *Spec) Validate() error {
	var errs []*FieldError
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	if !idPattern.MatchString(s.ID) {
		bad("id", "must be 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit, got %q", s.ID)
	}
	switch {
	case len(s.Tensors) == 0:
		bad("tensors", "at least one tensor is required")
	case len(s.Tensors) > MaxTensors:
		bad("tensors", "at most %d tensors, got %d", MaxTensors, len(s.Tensors))
	}
	seen := make(map[string]bool, len(s.Tensors))
	var total int64
	for i, t := range s.Tensors {
		f := "tensors[" + strconv.Itoa(i) + "]"
		if t.Name == "" {
			bad(f+".name", "required")
		} else if seen[t.Name] {
			bad(f+".name", "duplicate tensor name %q", t.Name)
		}
		seen[t.Name] = true
		if len(t.Shape) == 0 {
			bad(f+".shape", "required (use [1] for a scalar)")
			continue
		}
		n := int64(1)
		for j, d := range t.Shape {
			if d < 1 {
				bad(f+".shape["+strconv.Itoa(j)+"]", "must be >= 1, got %d", d)
				n = 0
				break
			}
			if n > MaxElements/int64(d) {
				n = MaxElements + 1
				break
			}
			n *= int64(d)
		}
		total += n
		if total > MaxElements {
			bad(f+".shape", "the model exceeds %d elements", int64(MaxElements))
			break
		}
	}
	if s.Ranks < 1 || s.Ranks > MaxRanks {
		bad("ranks", "must be 1..%d, got %d", MaxRanks, s.Ranks)
	}
	switch s.Sync {
	case "ssp":
		if s.Staleness < 1 || s.Staleness > MaxStaleness {
			bad("staleness", "ssp needs a staleness bound of 1..%d steps, got %d", MaxStaleness, s.Staleness)
		}
	case "bsp", "asp":
		if s.Staleness != 0 {
			bad("staleness", "only ssp has a staleness bound; %s does not take one (got %d)", s.Sync, s.Staleness)
		}
	default:
		bad("sync", "must be bsp, ssp or asp, got %q", s.Sync)
	}
	switch _, isRef := ParseFunctionRef(s.Function.Name); {
	case s.Function.IsUserFunction() && !isRef:
		bad("function", "a user function is named <owner>/<name>@<version> (for example team-a/lion@1), got %q", s.Function.Name)
	case s.Function.IsUserFunction():
		// Its hyper-parameters are checked against the module by whoever has it (the gateway).
		if s.Function.Module != "" && !digestPattern.MatchString(s.Function.Module) {
			bad("function.module", "must be a sha256 in hex (64 characters of 0-9, a-f), got %q", s.Function.Module)
		}
		if s.Function.Slots < 0 || s.Function.Slots > maxUserSlots {
			bad("function.slots", "must be 0..%d, got %d", maxUserSlots, s.Function.Slots)
		}
	default:
		if s.Function.Module != "" || s.Function.Slots != 0 || s.Function.Weighted {
			bad("function", "module, slots and weighted belong to user functions, not to the built-in %q", s.Function.Name)
		} else if _, err := functions.New(s.Function.Name, s.Function.Hyper); err != nil {
			bad("function", "%v", err)
		}
	}
	switch s.Init.Kind {
	case "zeros", "upload":
	case "uniform", "normal":
		if !(s.Init.Scale > 0) || !(s.Init.Scale <= MaxInitScale) {
			bad("init.scale", "must be > 0 and at most %g (beyond it initial parameters overflow float32), got %v", MaxInitScale, s.Init.Scale)
		}
	default:
		bad("init.kind", "must be zeros, uniform, normal or upload, got %q", s.Init.Kind)
	}
	if s.ShardSize < MinShardSize || s.ShardSize > MaxShardSize || s.ShardSize%4 != 0 {
		bad("shard_size", "must be 4 KiB..8 MiB and a multiple of 4 bytes, got %s", s.ShardSize)
	}
	if s.Storage != "memory" && s.Storage != "file" {
		bad("storage", "must be memory or file, got %q", s.Storage)
	}
	if s.Replicas != 1 && s.Replicas != 3 && s.Replicas != 5 {
		bad("replicas", "must be 1, 3 or 5, got %d", s.Replicas)
	}
	switch s.Priority {
	case PriorityHigh, PriorityNormal, PriorityLow:
	default:
		bad("priority", "must be high, normal or low, got %q", s.Priority)
	}
	switch s.ParamDtype {
	case "", wire.DtypeF32, wire.DtypeBF16:
	case wire.DtypeF16:
		bad("param_dtype", "f16 is not offered for parameters: a parameter beyond ±65504 would become Inf in the workers' copy; use bf16 (float32's range) or f32")
	default:
		bad("param_dtype", "must be f32 (default) or bf16, got %q", s.ParamDtype)
	}
	switch s.Gradients {
	case "", GradientsStored:
	case GradientsDirect:
		if s.Sync != "bsp" {
			bad("gradients", "direct is offered for bsp only: %s applies gradients in the order the gradient stream stored them, and a direct job has no gradient stream; use gradients: stored", s.Sync)
		}
	default:
		bad("gradients", "must be stored (default) or direct, got %q", s.Gradients)
	}
	switch {
	case s.GradientStreams < 0 || s.GradientStreams > MaxGradientStreams:
		bad("gradient_streams", "must be 1..%d, got %d", MaxGradientStreams, s.GradientStreams)
	case s.GradientStreams > 1 && s.DirectGradients():
		bad("gradient_streams", "a job with gradients: direct has no gradient stream; leave gradient_streams out or set it to 1")
	}
	if len(errs) == 0 && total > 0 {
		if n := s.shardCount(); n > MaxShards {
			bad("shard_size", "gives %d shards, more than %d: use larger shards", n, MaxShards)
		} else if s.Init.Kind == "upload" && n > MaxUploadShards {
			bad("shard_size", "gives %d shards, more than %d for init upload (its upload stream names each shard): use larger shards", n, MaxUploadShards)
		} else if s.GradientStreams > 1 && n > MaxUploadShards {
			bad("shard_size", "gives %d shards, more than %d with gradient_streams (each gradient stream names its shards): use larger shards", n, MaxUploadShards)
		} else if int64(s.GradientStreams) > n {
			bad("gradient_streams", "%d streams for %d shards: at most one stream per shard", s.GradientStreams, n)
		}
	}
	if len(errs) > 0 {
		return &SpecError{Fields: errs}
	}
	return nil
}

// shardCount is the number of shards Layout would make, computed without building it (a spec of a
// few bytes can describe millions of shards).
func (s *Spec) shardCount() int64 {
	target := int64(max(s.ShardSize/4, 1))
	var n, cur int64
	open := false
	for _, t := range s.Tensors {
		e := int64(t.Elements())
		switch {
		case open && cur+e <= target:
			cur += e
		case e <= target:
			n, cur, open = n+1, e, true
		default:
			n, open = n+(e+target-1)/target, false
		}
	}
	return n
}

// NumElements is the length of the flattened parameter vector.
func (s *Spec) NumElements() int {
	n := 0
	for _, t := range s.Tensors {
		n += t.Elements()
	}
	return n
}

// Elements is the number of elements of the tensor.
func (t Tensor) Elements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// maxUserSlots bounds a user function's state vectors (wasmfn.MaxSlots).
const maxUserSlots = 8

// NewFunc returns the spec's configured built-in aggregation function; for a user function it
// returns an error wrapping ErrNeedsModule.
func (s *Spec) NewFunc() (functions.Func, error) {
	if s.Function.IsUserFunction() {
		return nil, fmt.Errorf("%w: %s", ErrNeedsModule, s.Function.Name)
	}
	return functions.New(s.Function.Name, s.Function.Hyper)
}

// ByteSize is a size in bytes that reads from a number or from a string with a unit (KiB, MiB, KB, MB).
type ByteSize int64

var units = []struct {
	suffix string
	mult   int64
}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1000}, {"MB", 1000 * 1000}, {"B", 1}}

// ParseByteSize reads "1048576", "1MiB", "256 KiB" or "4KB".
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is not a size: use bytes or a unit such as 256KiB or 1MiB", s)
	}
	return ByteSize(n * mult), nil
}

// UnmarshalJSON accepts a number of bytes or a string with a unit.
func (b *ByteSize) UnmarshalJSON(data []byte) error {
	var n int64
	if err := json.Unmarshal(data, &n); err == nil {
		*b = ByteSize(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("shard_size: %s is not a size", data)
	}
	v, err := ParseByteSize(s)
	if err != nil {
		return fmt.Errorf("shard_size: %w", err)
	}
	*b = v
	return nil
}

func (b ByteSize) String() string {
	switch {
	case b >= 1<<20 && b%(1<<20) == 0:
		return strconv.FormatInt(int64(b>>20), 10) + " MiB"
	case b >= 1<<10 && b%(1<<10) == 0:
		return strconv.FormatInt(int64(b>>10), 10) + " KiB"
	}
	return strconv.FormatInt(int64(b), 10) + " B"
}
