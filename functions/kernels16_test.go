package functions

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/fanin-ml/fanin/wire"
)

// elem16 is element i of a dt payload by the scalar conversions of the wire package.
func elem16(src []byte, i int, dt wire.Dtype) float32 {
	switch dt {
	case wire.BF16:
		return wire.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	case wire.F16:
		return wire.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
}

// rand16 is a payload of n random elements of dt at byte offset off of its buffer: every bit
// pattern, so NaN, Inf, subnormals and signed zeros of both 16-bit formats occur.
func rand16(rng *rand.Rand, n, off int, dt wire.Dtype) []byte {
	b := make([]byte, off+n*dt.ElemSize())[off:]
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func same32(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b)
}

// The 16-bit kernels give the bits of scalar float32 arithmetic on the exactly converted
// elements, for random lengths and alignments, every dtype, and every bit pattern. Not parallel:
// it switches the package's use16SIMD, which the parallel tests read.
func TestKernels16AgainstScalar(t *testing.T) {
	for _, simd := range []bool{true, false} {
		t.Run(map[bool]string{true: "simd", false: "go"}[simd], func(t *testing.T) {
			defer func(old bool) { use16SIMD = old }(use16SIMD)
			use16SIMD = simd
			kernels16AgainstScalar(t)
		})
	}
}

// Every 16-bit pattern converted (CopyLE16, bit for bit, signaling NaNs included) and added to accumulators of every kind (zeros of both signs, normal,
// subnormal, Inf, NaN), by AddLE16 (the assembly where the CPU has it) and by the scalar
// definition: the same bits.
func TestAddLE16EveryPattern(t *testing.T) {
	t.Parallel()
	src := make([]byte, 2<<16)
	for i := range 1 << 16 {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	for _, dt := range []wire.Dtype{wire.BF16, wire.F16} {
		for _, a := range []uint32{0, 0x80000000, 0x3f800000, 0xc2f60000, 0x00000001, 0x807fffff, 0x7f800000, 0xff800000, 0x7fc00001, 0xffa00000, 0x477fe000, 0x38800000} {
			dst := make([]float32, 1<<16)
			for i := range dst {
				dst[i] = math.Float32frombits(a)
			}
			AddLE16(dst, src, dt)
			cp := make([]float32, 1<<16)
			CopyLE16(cp, src, dt)
			for i := range dst {
				if want := elem16(src, i, dt); math.Float32bits(cp[i]) != math.Float32bits(want) {
					t.Fatalf("CopyLE16 %s %#04x: %#08x, want %#08x", dt, i, math.Float32bits(cp[i]), math.Float32bits(want))
				}
				want := math.Float32frombits(a) + elem16(src, i, dt)
				if bothNaN := a&0x7fffffff > 0x7f800000 && elem16(src, i, dt) != elem16(src, i, dt); bothNaN && dst[i] != dst[i] {
					continue // two NaNs met: IEEE 754 leaves the payload free (functions/doc.go)
				}
				if !same32(dst[i], want) {
					t.Fatalf("%s %#08x + %#04x: %#08x, want %#08x", dt, a, i, math.Float32bits(dst[i]), math.Float32bits(want))
				}
			}
		}
	}
}

func kernels16AgainstScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 16))
	for _, dt := range []wire.Dtype{wire.BF16, wire.F16, wire.F32} {
		for range 200 {
			n, off := rng.IntN(3000), rng.IntN(4)
			src := rand16(rng, n, off, dt)
			w := float32(rng.NormFloat64())
			acc := make([]float32, n)
			for i := range acc {
				acc[i] = float32(rng.NormFloat64())
			}
			got, want := make([]float32, n), make([]float32, n)
			check := func(name string) {
				t.Helper()
				for i := range got {
					if !same32(got[i], want[i]) {
						t.Fatalf("%s %s n=%d off=%d element %d: %v, want %v", name, dt, n, off, i, got[i], want[i])
					}
				}
			}
			CopyLE16(got, src, dt)
			for i := range want {
				want[i] = elem16(src, i, dt)
			}
			check("CopyLE16")
			copy(got, acc)
			AddLE16(got, src, dt)
			for i := range want {
				want[i] = acc[i] + elem16(src, i, dt)
			}
			check("AddLE16")
			ScaleLE16(got, w, src, dt)
			for i := range want {
				want[i] = float32(w * elem16(src, i, dt))
			}
			check("ScaleLE16")
			copy(got, acc)
			AxpyLE16(got, w, src, dt)
			for i := range want {
				want[i] = acc[i] + float32(w*elem16(src, i, dt))
			}
			check("AxpyLE16")
		}
	}
}

// SumLE16 over mixed dtypes equals CopyLE16 + AddLE16 in rank order, bit for bit.
func TestSumLE16MixedRanks(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 16))
	dtypes := []wire.Dtype{wire.F32, wire.BF16, wire.F16}
	for range 100 {
		n, ranks := rng.IntN(5000), 1+rng.IntN(8)
		srcs, dts := make([][]byte, ranks), make([]wire.Dtype, ranks)
		for r := range srcs {
			dts[r] = dtypes[rng.IntN(3)]
			srcs[r] = rand16(rng, n, rng.IntN(4), dts[r])
		}
		got, want := make([]float32, n), make([]float32, n)
		SumLE16(got, srcs, dts)
		CopyLE16(want, srcs[0], dts[0])
		for r := 1; r < ranks; r++ {
			AddLE16(want, srcs[r], dts[r])
		}
		for i := range got {
			if !same32(got[i], want[i]) {
				t.Fatalf("n=%d dtypes %v element %d: %v, want %v", n, dts, i, got[i], want[i])
			}
		}
	}
}

// Not parallel: testing.AllocsPerRun counts the whole process's allocations.
func TestKernels16DoNotAllocate(t *testing.T) {
	dst := make([]float32, 5000)
	src := make([]byte, 2*len(dst))
	srcs, dts := [][]byte{src, src, src}, []wire.Dtype{wire.BF16, wire.F16, wire.BF16}
	for _, dt := range []wire.Dtype{wire.BF16, wire.F16} {
		if n := testing.AllocsPerRun(10, func() {
			CopyLE16(dst, src, dt)
			AddLE16(dst, src, dt)
			ScaleLE16(dst, 2, src, dt)
			AxpyLE16(dst, 2, src, dt)
			SumLE16(dst, srcs, dts)
		}); n != 0 {
			t.Errorf("%s: %v allocations", dt, n)
		}
	}
}

func TestKernels16RefuseWrongLength(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Fatal("AddLE16 took 8 bytes of bf16 for 3 elements")
		}
	}()
	AddLE16(make([]float32, 3), make([]byte, 8), wire.BF16)
}

func BenchmarkCopyLE16(b *testing.B) {
	const n = 1 << 20
	dst := make([]float32, n)
	src := make([]byte, 4*n)
	for _, dt := range []wire.Dtype{wire.BF16, wire.F16, wire.F32} {
		b.Run(dt.String(), func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				CopyLE16(dst, src[:n*dt.ElemSize()], dt)
			}
		})
	}
}

func BenchmarkAddLE16(b *testing.B) {
	const n = 1 << 20
	dst := make([]float32, n)
	src := make([]byte, 2*n)
	src32 := make([]byte, 4*n)
	for _, dt := range []wire.Dtype{wire.BF16, wire.F16, wire.F32} {
		b.Run(dt.String(), func(b *testing.B) { // bytes/s of the accumulator, to compare dtypes
			b.SetBytes(4 * n)
			s := src
			if dt == wire.F32 {
				s = src32
			}
			for b.Loop() {
				AddLE16(dst, s, dt)
			}
		})
	}
}
