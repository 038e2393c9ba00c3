package wasmfn

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"
)

// instance is one running copy of a module. It serves one call at a time and belongs to one
// Func: no other job's data ever enters its memory.
type instance struct {
	mod                   api.Module
	mem                   api.Memory
	describeFn, reserveFn api.Function
	initFn, applyFn       api.Function
	startTimeout          time.Duration // of describe, as of the start
	base                  uint32        // the guest's buffer (fanin_reserve), for n elements
	n                     int
	stack                 [4]uint64
}

func (m *Module) instantiate(ctx context.Context) (*instance, error) {
	st := &callState{clock: clockEpoch}
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, callKey{}, st), m.e.limits.StartTimeout)
	defer cancel()
	cfg := wazero.NewModuleConfig().WithName("").WithStartFunctions()
	mod, err := m.e.rt.InstantiateModule(ctx, m.cm, cfg)
	if err != nil {
		return nil, callError(ctx, err, st, "instantiate")
	}
	inst := &instance{mod: mod, mem: mod.Memory(), startTimeout: m.e.limits.StartTimeout,
		describeFn: mod.ExportedFunction("fanin_describe"), reserveFn: mod.ExportedFunction("fanin_reserve"),
		initFn: mod.ExportedFunction("fanin_init"), applyFn: mod.ExportedFunction("fanin_apply")}
	if start := mod.ExportedFunction("_initialize"); start != nil { // a reactor (Go's c-shared) starts here
		if _, err := start.Call(ctx); err != nil {
			_ = mod.Close(context.Background())
			return nil, callError(ctx, err, st, "_initialize")
		}
	}
	return inst, nil
}

func (i *instance) close(ctx context.Context) { _ = i.mod.Close(ctx) }

// ErrTimeLimit is wrapped by the error of a call stopped at its time limit.
var ErrTimeLimit = errors.New("stopped: ran past its time limit")

// callError describes a failed call: a timeout, an exit, a trap, with what the guest wrote to
// stdout and stderr.
func callError(ctx context.Context, err error, st *callState, what string) error {
	var msg string
	var exit *sys.ExitError
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded) || (errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeDeadlineExceeded)
	switch {
	case timedOut:
		msg = ""
	case errors.As(err, &exit):
		msg = fmt.Sprintf("exited with code %d", exit.ExitCode())
	default:
		msg, _, _ = strings.Cut(err.Error(), "\n") // the engine's first line; a stack trace follows
	}
	if out := strings.TrimSpace(string(st.out)); out != "" {
		if len(out) > 300 { // the cause comes first; a Go crash follows it with a goroutine dump
			out = out[:300] + "..."
		}
		msg += "; output: " + out
	}
	if timedOut {
		return fmt.Errorf("%s: %w%s", what, ErrTimeLimit, msg)
	}
	return fmt.Errorf("%s: %s", what, msg)
}

// guestString reads the string a call returned as address<<32 | length.
func (i *instance) guestString(packed uint64) (string, bool) {
	b, ok := i.mem.Read(uint32(packed>>32), uint32(packed))
	return string(b), ok
}

func (i *instance) describe(ctx context.Context) ([]byte, error) {
	st := &callState{clock: clockEpoch}
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, callKey{}, st), i.startTimeout)
	defer cancel()
	res, err := i.describeFn.Call(ctx)
	if err != nil {
		return nil, callError(ctx, err, st, "fanin_describe")
	}
	s, ok := i.guestString(res[0])
	if !ok {
		return nil, fmt.Errorf("fanin_describe returned %#x, outside its memory", res[0])
	}
	if !strings.HasPrefix(s, "{") {
		return nil, fmt.Errorf("fanin_describe failed: %s", s)
	}
	return []byte(s), nil
}
