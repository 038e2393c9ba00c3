package runtime

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/functions/wasmfn"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// User functions on a runtime: one engine per runtime compiles each module once (by digest) and
// every shard of a job with a user function gets a wasmfn.Func of its own, whose instances hold
// only that shard's data. The module is fetched and loaded at the shard's first call, not when
// the shard starts: a failure to fetch it is then a function failure like any other, retried by
// the executor's restart, never a shard that cannot start.

// maxFunctionFailures is how many failures in a row of a shard's function make the runtime ask
// for the job's pause.
const maxFunctionFailures = 3

// WithFunctionLimits sets the sandbox limits of user functions (default wasmfn's).
func WithFunctionLimits(l wasmfn.Limits) Option {
	return func(r *Runtime) error {
		r.fnLimits = l
		return nil
	}
}

// userFuncs is the runtime's engine and the functions' store, opened at first use.
type userFuncs struct {
	mu     sync.Mutex
	engine *wasmfn.Engine
	store  *store.Functions
}

func (r *Runtime) functionModule(ctx context.Context, digest string) (*wasmfn.Module, error) {
	u := &r.userFns
	u.mu.Lock()
	if u.engine == nil {
		e, err := wasmfn.NewEngine(context.Background(), r.fnLimits)
		if err != nil {
			u.mu.Unlock()
			return nil, err
		}
		u.engine = e
	}
	if u.store == nil {
		s, err := store.OpenFunctions(ctx, r.js)
		if err != nil {
			u.mu.Unlock()
			return nil, err
		}
		u.store = s
	}
	e, st := u.engine, u.store
	u.mu.Unlock()
	code, err := st.Module(ctx, digest)
	if err != nil {
		return nil, err
	}
	if d := wasmfn.Digest(code); d != digest {
		return nil, fmt.Errorf("module %s: its bytes have sha256 %s", digest, d)
	}
	return e.Load(ctx, code)
}

// closeUserFuncs releases the engine (at the runtime's end).
func (r *Runtime) closeUserFuncs() {
	u := &r.userFns
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.engine != nil {
		_ = u.engine.Close(context.Background())
		u.engine = nil
	}
}

// newFunc returns the spec's function: a built-in, or a user function loaded at first use.
func (r *Runtime) newFunc(spec *job.Spec) (functions.Func, error) {
	if !spec.Function.IsUserFunction() {
		return spec.NewFunc()
	}
	if spec.Function.Module == "" {
		return nil, fmt.Errorf("job %s: user function %s without its module's digest (the gateway sets it)", spec.ID, spec.Function.Name)
	}
	return &lazyFunc{r: r, spec: spec}, nil
}

// lazyFunc is a user function whose module is loaded at its first call. What the runtime needs
// before that (slots, weighting) the job record says.
type lazyFunc struct {
	r    *Runtime
	spec *job.Spec

	mu sync.Mutex // guards f
	f  *wasmfn.Func
}

func (l *lazyFunc) Name() string                { return l.spec.Function.Name }
func (l *lazyFunc) Slots() int                  { return l.spec.Function.Slots }
func (l *lazyFunc) Weighted() bool              { return l.spec.Function.Weighted }
func (l *lazyFunc) Hyper() map[string]float64   { return maps.Clone(l.spec.Function.Hyper) }
func (l *lazyFunc) Apply(u *functions.Update)   { must(l.TryApply(u)) }
func (l *lazyFunc) InitState(state [][]float32) { must(l.TryInitState(state)) }

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func (l *lazyFunc) load() (*wasmfn.Func, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		return l.f, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := l.r.functionModule(ctx, l.spec.Function.Module)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: load its module: %v", functions.ErrFunctionFailed, l.spec.Function.Name, err)
	}
	f, err := m.New(l.spec.Function.Name, l.spec.Function.Hyper, l.spec.AllowNonFinite)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", functions.ErrFunctionFailed, err)
	}
	if f.Slots() != l.spec.Function.Slots || f.Weighted() != l.spec.Function.Weighted {
		return nil, fmt.Errorf("%w: %s: the module declares %d state vectors (weighted %v), the job record %d (weighted %v)",
			functions.ErrFunctionFailed, l.spec.Function.Name, f.Slots(), f.Weighted(), l.spec.Function.Slots, l.spec.Function.Weighted)
	}
	l.f = f
	return f, nil
}

func (l *lazyFunc) TryApply(u *functions.Update) error {
	f, err := l.load()
	if err != nil {
		return err
	}
	return f.TryApply(u)
}

func (l *lazyFunc) TryInitState(state [][]float32) error {
	f, err := l.load()
	if err != nil {
		return err
	}
	return f.TryInitState(state)
}

// close releases the function's instances.
func (l *lazyFunc) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close(context.Background())
	}
}

// functionFailed handles a failed step of a user function (x.mu held): the shard's state is
// unchanged; the step is refused with function_failed and the executor stops, to restore and
// replay (run retries it with a backoff); after maxFunctionFailures in a row the refusal asks the
// gateway to pause the job.
func (x *shardExec) functionFailed(err error) {
	x.reportFunctionFailure(err)
	x.stopped = true // nothing more until the restore
	x.resetGather()
	select {
	case x.fnFailed <- err:
	default:
	}
}

// reportFunctionFailure counts a failure of the user function in a row and reports it
// (function_failed; with the pause asked for after maxFunctionFailures). x.mu is held.
func (x *shardExec) reportFunctionFailure(err error) {
	x.fnFailures++
	rej := wire.Rejectf(wire.ReasonFunctionFailed, "step %d of shard %d: %v", x.step+1, x.shard.ID, err)
	rej.Job, rej.Shard, rej.Step = x.ji.rec.Spec.ID, x.shard.ID, x.step+1
	if x.fnFailures >= maxFunctionFailures {
		rej.Pause = true
		rej.Detail += fmt.Sprintf(" (failed %d times in a row: the job is paused)", x.fnFailures)
	}
	x.log.Warn("user function failed", "step", x.step+1, "failures", x.fnFailures, "err", err)
	x.r.reject(rej, "", x.ji.incarnation)
}
