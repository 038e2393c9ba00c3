package functions

import "errors"

// Fallible is a Func that can fail: a user function in WebAssembly (package
// functions/wasmfn) may trap, run out of time or memory, or give non-finite outputs. On failure
// TryApply leaves Params and State unchanged, so the step can be tried again. Its Apply and
// InitState panic on failure: callers that must survive one use ApplyErr and InitStateErr.
type Fallible interface {
	Func
	TryApply(u *Update) error
	TryInitState(state [][]float32) error
	// Weighted reports whether the runtime weights each rank's input (as for fedavg): a user
	// function declares it, where a built-in one is known by name (see IsWeighted).
	Weighted() bool
}

// ErrFunctionFailed is wrapped by every error of a Fallible's TryApply and TryInitState.
var ErrFunctionFailed = errors.New("function failed")

// ApplyErr applies f to u: f.TryApply for a Fallible f, f.Apply (which cannot fail) otherwise.
func ApplyErr(f Func, u *Update) error {
	if ff, ok := f.(Fallible); ok {
		return ff.TryApply(u)
	}
	f.Apply(u)
	return nil
}

// InitStateErr fills fresh state vectors: f.TryInitState for a Fallible f, f.InitState otherwise.
func InitStateErr(f Func, state [][]float32) error {
	if ff, ok := f.(Fallible); ok {
		return ff.TryInitState(state)
	}
	f.InitState(state)
	return nil
}

// IsWeighted reports whether f weights each rank's input by its weight: what a Fallible
// declares, or Weighted(f.Name()) for a built-in function.
func IsWeighted(f Func) bool {
	if ff, ok := f.(Fallible); ok {
		return ff.Weighted()
	}
	return Weighted(f.Name())
}
