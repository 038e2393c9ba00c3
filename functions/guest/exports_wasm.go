//go:build wasm

package guest

import (
	"fmt"
	"unsafe"
)

// The buffer the host reads and writes: the hyper-parameters (float64, in declared order), then
// Params, Grad and each state vector (float32, n each). It grows to the largest shard seen and is
// kept, so the host writes straight into it.
var (
	buf    []uint64 // 8-byte aligned backing store
	bufN   int      // the n buf is laid out for
	values Values
	errMsg string // the last error, kept alive while the host reads it
)

func words(n int) int { return len(fn.Hyper) + (n*(2+len(fn.State))+1)/2 }

//go:wasmexport fanin_describe
func describe() uint64 {
	if fn == nil {
		return fail(errNoFunction)
	}
	d, err := descriptor(fn)
	if err != nil {
		return fail(err)
	}
	errMsg = d
	return pack(errMsg)
}

//go:wasmexport fanin_reserve
func reserve(n int32) uint32 {
	if fn == nil || n < 0 {
		return 0
	}
	if w := words(int(n)); w > len(buf) {
		buf = make([]uint64, w)
	}
	bufN = int(n)
	if values.names == nil {
		values.names = make([]string, len(fn.Hyper))
		for i, h := range fn.Hyper {
			values.names[i] = h.Name
		}
	}
	return uint32(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
}

// views returns the hyper-parameters and the n-element vectors of buf.
func views(n int) ([]float32, []float32, [][]float32) {
	values.vals = unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(buf))), len(fn.Hyper))
	all := unsafe.Slice((*float32)(unsafe.Pointer(&buf[len(fn.Hyper):][:1][0])), n*(2+len(fn.State)))
	state := make([][]float32, len(fn.State))
	for i := range state {
		state[i] = all[(2+i)*n : (3+i)*n : (3+i)*n]
	}
	return all[:n:n], all[n : 2*n : 2*n], state
}

//go:wasmexport fanin_init
func initState(n int32) (r uint64) {
	if fn == nil {
		return fail(errNoFunction)
	}
	if int(n) != bufN || len(buf) == 0 {
		return fail(fmt.Errorf("guest: fanin_init(%d) without fanin_reserve(%d)", n, n))
	}
	defer catch(&r)
	_, _, state := views(int(n))
	for _, s := range state {
		clear(s)
	}
	if fn.Init != nil {
		if err := fn.Init(state, values); err != nil {
			return fail(err)
		}
	}
	return 0
}

//go:wasmexport fanin_apply
func apply(n int32, step int64, ranks int32, weightSum float64) (r uint64) {
	if fn == nil {
		return fail(errNoFunction)
	}
	if int(n) != bufN || len(buf) == 0 {
		return fail(fmt.Errorf("guest: fanin_apply(%d) without fanin_reserve(%d)", n, n))
	}
	defer catch(&r)
	p, g, state := views(int(n))
	u := Update{Params: p, Grad: g, State: state, Step: step, Ranks: int(ranks), WeightSum: weightSum, Hyper: values}
	if err := fn.Apply(&u); err != nil {
		return fail(err)
	}
	return 0
}

// catch turns a panic of the function into its error.
func catch(r *uint64) {
	if p := recover(); p != nil {
		*r = fail(fmt.Errorf("panic: %v", p))
	}
}

func fail(err error) uint64 {
	errMsg = err.Error()
	if errMsg == "" {
		errMsg = "error"
	}
	return pack(errMsg)
}

// pack returns a string's address and length as one result: address<<32 | length.
func pack(s string) uint64 {
	return uint64(uintptr(unsafe.Pointer(unsafe.StringData(s))))<<32 | uint64(len(s))
}
