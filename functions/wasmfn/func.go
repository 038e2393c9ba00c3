package wasmfn

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"

	"github.com/fanin-ml/fanin/functions"
)

// maxIdle bounds the idle instances a Func keeps.
const maxIdle = 4

// Func is a module configured with validated hyper-parameters: a functions.Fallible. Its
// instances are its own (no other Func's data enters their memory); it is safe for concurrent use,
// each concurrent call taking an instance of its own.
type Func struct {
	m              *Module
	name           string
	hyper          map[string]float64
	vals           []float64 // in declared order
	allowNonFinite bool

	mu   sync.Mutex // guards idle
	idle []*instance
}

var _ functions.Fallible = (*Func)(nil)

// New configures the module as the function name (the job's name for it, such as
// "team/lion@1") with hyper: unknown names, missing required ones and values out of their
// declared range give a *functions.HyperError. allowNonFinite is the job's allow_nonfinite:
// without it an output (parameter or state) that is NaN or Inf fails the call; with it Inf
// passes and every NaN is made the canonical quiet NaN 0x7fc00000, so that no engine's choice of
// NaN bits shows.
func (m *Module) New(name string, hyper map[string]float64, allowNonFinite bool) (*Func, error) {
	known := make([]string, len(m.hyper))
	for i, h := range m.hyper {
		known[i] = h.Name
	}
	slices.Sort(known)
	keys := slices.Sorted(maps.Keys(hyper))
	for _, k := range keys {
		if !slices.Contains(known, k) {
			return nil, &functions.HyperError{Func: name, Key: k, Known: known}
		}
	}
	f := &Func{m: m, name: name, hyper: make(map[string]float64, len(m.hyper)), vals: make([]float64, len(m.hyper)),
		allowNonFinite: allowNonFinite}
	order := slices.Clone(m.hyper)
	slices.SortFunc(order, func(a, b hyperDecl) int { return cmpString(a.Name, b.Name) })
	for _, h := range order {
		v, set := hyper[h.Name]
		switch {
		case !set && h.Required:
			return nil, &functions.HyperError{Func: name, Key: h.Name, Reason: "required"}
		case !set:
			v = h.Default
		case !h.r.ok(v):
			return nil, &functions.HyperError{Func: name, Key: h.Name,
				Reason: "must be " + h.r.text() + ", got " + strconv.FormatFloat(v, 'g', -1, 64)}
		}
		f.hyper[h.Name] = v
	}
	for i, h := range m.hyper {
		f.vals[i] = f.hyper[h.Name]
	}
	return f, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Module returns the module f runs.
func (f *Func) Module() *Module { return f.m }

func (f *Func) Name() string                { return f.name }
func (f *Func) Slots() int                  { return len(f.m.info.State) }
func (f *Func) Weighted() bool              { return f.m.info.Weighted }
func (f *Func) Hyper() map[string]float64   { return maps.Clone(f.hyper) }
func (f *Func) Apply(u *functions.Update)   { must(f.TryApply(u)) }
func (f *Func) InitState(state [][]float32) { must(f.TryInitState(state)) }
func (f *Func) String() string              { return f.name + " (wasm " + f.m.digest[:12] + ")" }
func must(err error) {
	if err != nil {
		panic(err)
	}
}

// Close closes f's idle instances; f stays usable (a later call starts a new one).
func (f *Func) Close(ctx context.Context) {
	f.mu.Lock()
	idle := f.idle
	f.idle = nil
	f.mu.Unlock()
	for _, i := range idle {
		i.close(ctx)
	}
}

func (f *Func) take(ctx context.Context) (*instance, error) {
	f.mu.Lock()
	if n := len(f.idle); n > 0 {
		i := f.idle[n-1]
		f.idle = f.idle[:n-1]
		f.mu.Unlock()
		return i, nil
	}
	f.mu.Unlock()
	return f.m.instantiate(ctx)
}

func (f *Func) give(ctx context.Context, i *instance) {
	f.mu.Lock()
	if len(f.idle) < maxIdle {
		f.idle = append(f.idle, i)
		i = nil
	}
	f.mu.Unlock()
	if i != nil {
		i.close(ctx)
	}
}

func (f *Func) fail(err error) error {
	return fmt.Errorf("%w: %s: %v", functions.ErrFunctionFailed, f.name, err)
}

// buffer returns the guest's buffer laid out for n elements: the hyper-parameters written, then
// 4*n bytes each of Params, Grad and the state vectors.
func (f *Func) buffer(ctx context.Context, i *instance, n int) ([]byte, error) {
	if i.n != n || i.base == 0 {
		i.stack[0] = uint64(uint32(n))
		if err := i.reserveFn.CallWithStack(ctx, i.stack[:]); err != nil {
			return nil, err
		}
		if i.stack[0] == 0 {
			return nil, fmt.Errorf("fanin_reserve(%d) returned no buffer", n)
		}
		i.base, i.n = uint32(i.stack[0]), n
	}
	size := 8*len(f.vals) + 4*n*(2+f.Slots())
	b, ok := i.mem.Read(i.base, uint32(size))
	if !ok {
		return nil, fmt.Errorf("fanin_reserve(%d) returned %#x: its %d bytes lie outside the module's memory", n, i.base, size)
	}
	for k, v := range f.vals {
		binary.LittleEndian.PutUint64(b[8*k:], math.Float64bits(v))
	}
	return b[8*len(f.vals):], nil
}

// call runs fn on instance i with the arguments in i.stack, within the time limit; the status is
// 0 or an error message.
func (f *Func) call(i *instance, run func(ctx context.Context) error) (err error) {
	st := &callState{clock: clockEpoch}
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), callKey{}, st), f.m.e.limits.CallTimeout)
	defer cancel()
	if err := run(ctx); err != nil {
		return callError(ctx, err, st, "fanin")
	}
	return nil
}

// TryApply runs the module's fanin_apply on u. On failure (a trap, the time or memory limit, an
// error the function returns, a non-finite output the job forbids) u.Params and u.State are
// unchanged and the error wraps functions.ErrFunctionFailed.
func (f *Func) TryApply(u *functions.Update) error {
	n := len(u.Params)
	if len(u.Grad) != n || len(u.State) != f.Slots() {
		panic(fmt.Sprintf("wasmfn: %s: len(Grad) %d, len(State) %d for %d parameters and %d slots", f.name, len(u.Grad), len(u.State), n, f.Slots()))
	}
	for _, s := range u.State {
		if len(s) != n {
			panic(fmt.Sprintf("wasmfn: %s: state length %d != len(Params) %d", f.name, len(s), n))
		}
	}
	if u.Step < 1 || !(u.WeightSum > 0) {
		panic(fmt.Sprintf("wasmfn: %s: Step %d, WeightSum %v", f.name, u.Step, u.WeightSum))
	}
	ctx := context.Background()
	i, err := f.take(ctx)
	if err != nil {
		return f.fail(err)
	}
	if err := f.call(i, func(ctx context.Context) error {
		b, err := f.buffer(ctx, i, n)
		if err != nil {
			return err
		}
		functions.EncodeLE(b[:4*n], u.Params)
		functions.EncodeLE(b[4*n:8*n], u.Grad)
		for k, s := range u.State {
			functions.EncodeLE(b[(2+k)*4*n:(3+k)*4*n], s)
		}
		i.stack[0], i.stack[1], i.stack[2], i.stack[3] = uint64(uint32(n)), uint64(u.Step), uint64(uint32(u.Ranks)), math.Float64bits(u.WeightSum)
		if err := i.applyFn.CallWithStack(ctx, i.stack[:]); err != nil {
			return err
		}
		return i.status("fanin_apply")
	}); err != nil {
		i.close(ctx)
		return f.fail(err)
	}
	b, err := f.buffer(ctx, i, n) // the memory may have moved
	if err == nil {
		err = f.outputs(b, n, []int{0, 2, 3, 4, 5, 6, 7, 8, 9}[:1+f.Slots()])
	}
	if err != nil {
		i.close(ctx)
		return f.fail(err)
	}
	functions.CopyLE(u.Params, b[:4*n])
	for k, s := range u.State {
		functions.CopyLE(s, b[(2+k)*4*n:(3+k)*4*n])
	}
	f.give(ctx, i)
	return nil
}

// TryInitState runs the module's fanin_init on fresh state vectors.
func (f *Func) TryInitState(state [][]float32) error {
	if len(state) != f.Slots() {
		panic(fmt.Sprintf("wasmfn: %s: %d state vectors for %d slots", f.name, len(state), f.Slots()))
	}
	if len(state) == 0 {
		return nil
	}
	n := len(state[0])
	ctx := context.Background()
	i, err := f.take(ctx)
	if err != nil {
		return f.fail(err)
	}
	if err := f.call(i, func(ctx context.Context) error {
		if _, err := f.buffer(ctx, i, n); err != nil {
			return err
		}
		i.stack[0] = uint64(uint32(n))
		if err := i.initFn.CallWithStack(ctx, i.stack[:]); err != nil {
			return err
		}
		return i.status("fanin_init")
	}); err != nil {
		i.close(ctx)
		return f.fail(err)
	}
	b, err := f.buffer(ctx, i, n)
	if err == nil {
		err = f.outputs(b, n, []int{2, 3, 4, 5, 6, 7, 8, 9}[:f.Slots()])
	}
	if err != nil {
		i.close(ctx)
		return f.fail(err)
	}
	for k, s := range state {
		functions.CopyLE(s, b[(2+k)*4*n:(3+k)*4*n])
	}
	f.give(ctx, i)
	return nil
}

// status reads the result of an ABI call: 0, or the address and length of an error message.
func (i *instance) status(what string) error {
	if i.stack[0] == 0 {
		return nil
	}
	msg, ok := i.guestString(i.stack[0])
	if !ok {
		return fmt.Errorf("%s returned %#x, outside its memory", what, i.stack[0])
	}
	if len(msg) > 1024 {
		msg = msg[:1024] + "..."
	}
	return fmt.Errorf("%s: %s", what, msg)
}

var vecNames = []string{"parameters", "", "state[0]", "state[1]", "state[2]", "state[3]", "state[4]", "state[5]", "state[6]", "state[7]"}

// outputs checks the output vectors (indexes into the buffer's vectors: 0 the parameters, 2+k
// state k) for NaN and Inf: refused, or with allowNonFinite NaNs made canonical.
func (f *Func) outputs(b []byte, n int, vecs []int) error {
	for _, v := range vecs {
		x := b[v*4*n : (v+1)*4*n]
		if !f.allowNonFinite {
			if j := functions.NonFinite(x); j >= 0 {
				return fmt.Errorf("output %s[%d] is %v: NaN and Inf outputs are refused (the job does not allow non-finite values)",
					vecNames[v], j, math.Float32frombits(binary.LittleEndian.Uint32(x[4*j:])))
			}
			continue
		}
		for j := 0; j < len(x); j += 4 {
			if w := binary.LittleEndian.Uint32(x[j:]); w&0x7f800000 == 0x7f800000 && w&0x007fffff != 0 {
				binary.LittleEndian.PutUint32(x[j:], 0x7fc00000)
			}
		}
	}
	return nil
}
