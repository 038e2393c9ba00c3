package functions

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// The SIMD kernels and FoldApply against the scalar definition: random lengths, alignments, rank
// counts (past the 64 that one assembly call sums) and values with NaNs, infinities, subnormals
// and signed zeros; each with the assembly (where the machine has it) and with the Go loops.

// specialFloats is randomFloats with NaNs (quiet and signaling, both signs, various payloads)
// and infinities mixed in.
func specialFloats(rng *rand.Rand, n int) []float32 {
	x := randomFloats(rng, n)
	for i := range x {
		switch rng.IntN(40) {
		case 0:
			x[i] = math.Float32frombits(0x7f800000 | rng.Uint32()&0x807fffff | 1) // NaN
		case 1:
			x[i] = float32(math.Inf(1))
		case 2:
			x[i] = float32(math.Inf(-1))
		}
	}
	return x
}

// offsetPayload returns x encoded little-endian at an address that is off (0..3) bytes past a
// 4-byte boundary.
func offsetPayload(x []float32, off int) []byte {
	buf := make([]byte, 4*len(x)+8)
	base := int((4 - uintptr(unsafe.Pointer(&buf[0]))%4) % 4)
	b := buf[base+off : base+off+4*len(x) : base+off+4*len(x)]
	copy(b, naiveEncode(x))
	return b
}

// sameFloat: the same bits, or both NaN when the inputs that made them held more than one NaN
// (IEEE 754 does not say which payload an operation on two NaNs keeps, and an optimizing
// compiler may swap the operands of a commutative operation).
func sameFloat(got, want float32, strictNaN bool) bool {
	if math.Float32bits(got) == math.Float32bits(want) {
		return true
	}
	return !strictNaN && got != got && want != want
}

// refSum is the definition: x = src0[i]; x += srcr[i] for r = 1..N-1, scalar float32. It also
// reports, per element, whether at most one NaN took part in the sum (a NaN input, or one made
// by an Inf meeting an Inf of the other sign).
func refSum(xs [][]float32) ([]float32, []bool) {
	n := len(xs[0])
	out, single := make([]float32, n), make([]bool, n)
	for i := range out {
		x, nans := xs[0][i], 0
		if x != x {
			nans++
		}
		for _, s := range xs[1:] {
			y := x + s[i]
			switch {
			case s[i] != s[i]:
				nans++
			case x == x && y != y: // Inf + -Inf (possibly after an overflow) makes a NaN of its own
				nans++
			}
			x = y
		}
		out[i], single[i] = x, nans <= 1
	}
	return out, single
}

func simdModes(t *testing.T, f func(t *testing.T)) {
	for _, simd := range []bool{true, false} {
		t.Run(fmt.Sprintf("simd=%v", simd), func(t *testing.T) {
			if simd && !haveSIMD {
				t.Skip("no SIMD kernels on this machine")
			}
			defer setSIMD(simd)()
			f(t)
		})
	}
}

func randomLength(rng *rand.Rand) int {
	switch rng.IntN(3) {
	case 0:
		return rng.IntN(40)
	case 1:
		return rng.IntN(5000)
	default:
		return sumBlock*2 + rng.IntN(100) // several FoldApply blocks
	}
}

func randomRanks(rng *rand.Rand) int {
	if rng.IntN(8) == 0 {
		return 60 + rng.IntN(80) // more than one assembly call
	}
	return 1 + rng.IntN(18)
}

func TestFoldMatchesDefinition(t *testing.T) {
	simdModes(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(7, 8))
		for trial := range 150 {
			n, ranks := randomLength(rng), randomRanks(rng)
			xs := make([][]float32, ranks)
			srcs := make([][]byte, ranks)
			for r := range xs {
				xs[r] = specialFloats(rng, n)
				srcs[r] = offsetPayload(xs[r], rng.IntN(4))
			}
			want, single := refSum(xs)
			check := func(what string, got []float32) {
				t.Helper()
				for i := range want {
					if !sameFloat(got[i], want[i], single[i]) {
						t.Fatalf("trial %d (n=%d, N=%d) %s: element %d = %#x, want %#x", trial, n, ranks, what,
							i, math.Float32bits(got[i]), math.Float32bits(want[i]))
					}
				}
			}
			got := make([]float32, n)
			SumLE(got, srcs)
			check("SumLE", got)
			clear(got)
			CopyLE(got, srcs[0])
			for _, s := range srcs[1:] {
				AddLE(got, s)
			}
			check("CopyLE+AddLE", got)
			CopyLE(got, srcs[0])
			for _, x := range xs[1:] {
				Add(got, x)
			}
			check("CopyLE+Add", got)
		}
	})
}

// foldApplyConfigs are the functions FoldApply fuses (sgd, adam, adamw, with and without weight
// decay) and some it does not (clip_norm, momentum, mean).
var foldApplyConfigs = []struct {
	name  string
	hyper map[string]float64
}{
	{"sgd", map[string]float64{"lr": 0.1}},
	{"sgd", map[string]float64{"lr": 0.37, "weight_decay": 0.01}},
	{"adam", map[string]float64{"lr": 0.001}},
	{"adam", map[string]float64{"lr": 0.01, "weight_decay": 0.1}},
	{"adamw", map[string]float64{"lr": 0.05, "weight_decay": 0.3}},
	{"adam", map[string]float64{"lr": 0.01, "clip_norm": 1}},
	{"sgd", map[string]float64{"lr": 0.1, "clip_norm": 1}},
	{"momentum", map[string]float64{"lr": 0.1}},
	{"momentum", map[string]float64{"lr": 0.1, "dampening": 0.1, "weight_decay": 0.01}},
	{"nesterov", map[string]float64{"lr": 0.1}},
	{"adagrad", map[string]float64{"lr": 0.3, "initial_accumulator": 0.1}},
	{"adagrad", map[string]float64{"lr": 0.01, "weight_decay": 0.01}},
	{"momentum", map[string]float64{"lr": 0.1, "clip_norm": 1}},
	{"mean", nil},
}

// TestFoldApplyMatchesDefinition compares FoldApply with the definition: the scalar rank-order
// sum, then Apply with the Go loops, over three steps (state carried), for every config.
func TestFoldApplyMatchesDefinition(t *testing.T) {
	simdModes(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(9, 10))
		for trial := range 2 * len(foldApplyConfigs) * 4 {
			c := foldApplyConfigs[trial%len(foldApplyConfigs)]
			fn := mustNew(t, c.name, c.hyper)
			n, ranks := randomLength(rng), randomRanks(rng)
			special := trial%3 == 0
			vec := func() []float32 {
				if special {
					return specialFloats(rng, n)
				}
				return randomFloats(rng, n)
			}
			newState := func() [][]float32 {
				st := make([][]float32, fn.Slots())
				for i := range st {
					st[i] = make([]float32, n)
				}
				fn.InitState(st)
				return st
			}
			p0 := vec()
			got := &Update{Params: append([]float32(nil), p0...), Grad: make([]float32, n), State: newState(),
				Ranks: ranks, WeightSum: float64(ranks)}
			want := &Update{Params: append([]float32(nil), p0...), Grad: make([]float32, n), State: newState(),
				Ranks: ranks, WeightSum: float64(ranks)}
			inc := &Update{Params: append([]float32(nil), p0...), Grad: make([]float32, n), State: newState(),
				Ranks: ranks, WeightSum: float64(ranks)}
			for step := int64(1); step <= 3; step++ {
				xs := make([][]float32, ranks)
				srcs := make([][]byte, ranks)
				for r := range xs {
					xs[r] = vec()
					srcs[r] = offsetPayload(xs[r], rng.IntN(4))
				}
				got.Step, want.Step, inc.Step = step, step, step
				FoldApply(fn, got, srcs)
				// As the runtime does: ranks folded as they arrive, the last with the update.
				CopyLE(inc.Grad, srcs[0])
				if ranks == 1 {
					fn.Apply(inc)
				} else {
					for _, s := range srcs[1 : ranks-1] {
						AddLE(inc.Grad, s)
					}
					AddApply(fn, inc, srcs[ranks-1])
				}
				sum, _ := refSum(xs)
				copy(want.Grad, sum)
				func() {
					defer setSIMD(false)()
					fn.Apply(want)
				}()
				what := fmt.Sprintf("trial %d %s %v (n=%d, N=%d) step %d", trial, c.name, c.hyper, n, ranks, step)
				sameVec(t, what+" FoldApply params", got.Params, want.Params)
				sameVec(t, what+" AddApply params", inc.Params, want.Params)
				for i := range got.State {
					sameVec(t, fmt.Sprintf("%s FoldApply state %d", what, i), got.State[i], want.State[i])
					sameVec(t, fmt.Sprintf("%s AddApply state %d", what, i), inc.State[i], want.State[i])
				}
			}
		}
	})
}

// sameVec: the same bits, NaNs of any payload counting as equal (a function's NaN may come from
// two NaN operands, see sameFloat).
func sameVec(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if !sameFloat(got[i], want[i], false) {
			t.Fatalf("%s: element %d = %#x (%g), want %#x (%g)", what, i,
				math.Float32bits(got[i]), got[i], math.Float32bits(want[i]), want[i])
		}
	}
}

func TestFoldApplyPanics(t *testing.T) {
	t.Parallel()
	fn := mustNew(t, "sgd", map[string]float64{"lr": 0.1})
	u := &Update{Params: make([]float32, 4), Grad: make([]float32, 4), Step: 1, Ranks: 1, WeightSum: 1}
	for name, srcs := range map[string][][]byte{
		"no payloads":  nil,
		"short":        {make([]byte, 12)},
		"one is short": {make([]byte, 16), make([]byte, 15)},
	} {
		if len(srcs) == 1 {
			func() {
				defer func() {
					if recover() == nil {
						t.Errorf("%s: AddApply did not panic", name)
					}
				}()
				AddApply(fn, u, srcs[0])
			}()
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: FoldApply did not panic", name)
				}
			}()
			FoldApply(fn, u, srcs)
		}()
	}
}

// Not parallel: testing.AllocsPerRun counts the whole process's allocations.
func TestFoldApplyDoesNotAllocate(t *testing.T) {
	for _, c := range foldApplyConfigs {
		fn := mustNew(t, c.name, c.hyper)
		const n = 3*sumBlock + 5
		u := &Update{Params: make([]float32, n), Grad: make([]float32, n), State: make([][]float32, fn.Slots()),
			Ranks: 3, WeightSum: 3}
		for i := range u.State {
			u.State[i] = make([]float32, n)
		}
		srcs := [][]byte{make([]byte, 4*n), make([]byte, 4*n), make([]byte, 4*n)}
		if a := testing.AllocsPerRun(5, func() { u.Step++; FoldApply(fn, u, srcs) }); a != 0 {
			t.Errorf("%s: FoldApply: %v allocations", c.name, a)
		}
		if a := testing.AllocsPerRun(5, func() { u.Step++; AddApply(fn, u, srcs[1]) }); a != 0 {
			t.Errorf("%s: AddApply: %v allocations", c.name, a)
		}
	}
}

// FuzzFoldApply: any bytes, cut into ranks, fold to the definition's bits with and without the
// assembly, for sgd with weight decay and adam.
func FuzzFoldApply(f *testing.F) {
	f.Add([]byte{0, 0, 0x80, 0x7f, 1, 0, 0xc0, 0xff, 0, 0, 0, 0x80, 1, 0, 0, 0}, uint8(2), uint8(1))
	f.Add(make([]byte, 4*37*3), uint8(3), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, nr, off uint8) {
		ranks := 1 + int(nr)%20
		n := len(data) / 4 / ranks
		xs := make([][]float32, ranks)
		srcs := make([][]byte, ranks)
		for r := range xs {
			xs[r] = naiveDecode(data[4*n*r : 4*n*(r+1)])
			srcs[r] = offsetPayload(xs[r], (int(off)+r)%4)
		}
		sum, single := refSum(xs)
		for _, c := range foldApplyConfigs[:4] {
			fn := mustNew(t, c.name, c.hyper)
			results := make([][]float32, 2)
			for m, simd := range []bool{false, true} {
				if simd && !haveSIMD {
					continue
				}
				func() {
					defer setSIMD(simd)()
					got := make([]float32, n)
					SumLE(got, srcs)
					for i := range sum {
						if !sameFloat(got[i], sum[i], single[i]) {
							t.Fatalf("simd=%v SumLE element %d = %#x, want %#x", simd, i, math.Float32bits(got[i]), math.Float32bits(sum[i]))
						}
					}
					u := &Update{Params: append([]float32(nil), xs[0]...), Grad: make([]float32, n),
						State: make([][]float32, fn.Slots()), Step: 1, Ranks: ranks, WeightSum: float64(ranks)}
					for i := range u.State {
						u.State[i] = make([]float32, n)
					}
					FoldApply(fn, u, srcs)
					results[m] = u.Params
				}()
			}
			if results[1] != nil {
				sameVec(t, c.name+" simd vs Go", results[1], results[0])
			}
		}
	})
}

// TestWeightedFoldMatchesDefinition: ScaleLE rank 0 then AxpyLE ranks 1..N-1 (fedavg's fold),
// and Scale/Axpy, against x = float32(w0*x0[i]); x += float32(wr*xr[i]) in scalar float32.
func TestWeightedFoldMatchesDefinition(t *testing.T) {
	simdModes(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(11, 12))
		for trial := range 100 {
			n, ranks := randomLength(rng), 1+rng.IntN(10)
			xs := make([][]float32, ranks)
			srcs := make([][]byte, ranks)
			ws := make([]float32, ranks)
			for r := range xs {
				xs[r] = specialFloats(rng, n)
				srcs[r] = offsetPayload(xs[r], rng.IntN(4))
				ws[r] = float32(1 + rng.IntN(100))
			}
			want := make([]float32, n)
			for i := range want {
				x := float32(ws[0] * xs[0][i])
				for r := 1; r < ranks; r++ {
					x += float32(ws[r] * xs[r][i])
				}
				want[i] = x
			}
			gotLE, got := make([]float32, n), make([]float32, n)
			ScaleLE(gotLE, ws[0], srcs[0])
			Scale(got, ws[0], xs[0])
			for r := 1; r < ranks; r++ {
				AxpyLE(gotLE, ws[r], srcs[r])
				Axpy(got, ws[r], xs[r])
			}
			what := fmt.Sprintf("trial %d (n=%d, N=%d)", trial, n, ranks)
			sameVec(t, what+" ScaleLE+AxpyLE", gotLE, want)
			sameVec(t, what+" Scale+Axpy", got, want)
		}
	})
}
