package functions

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// randomFloats returns n finite float32s spread over all magnitudes, with zeros of both signs
// and subnormals among them.
// expMask selects a float32's exponent; NaN and ±Inf are exactly the values with all its bits set.
const expMask = 0x7f800000

func randomFloats(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch rng.IntN(10) {
		case 0:
			x[i] = float32(math.Copysign(0, float64(rng.IntN(2)*2-1)))
		case 1:
			x[i] = math.Float32frombits(rng.Uint32() & 0x807fffff) // subnormal
		case 2, 3, 4:
			b := rng.Uint32()
			if b&expMask == expMask {
				b &^= 1 << 30
			}
			x[i] = math.Float32frombits(b)
		default:
			x[i] = float32(rng.NormFloat64())
		}
	}
	return x
}

// byteBufs returns two separate n-byte buffers, one 4-byte aligned and one at an odd address.
func byteBufs(n int) (aligned, unaligned []byte) {
	at := func(odd int) []byte {
		buf := make([]byte, n+8)
		off := int((4-uintptr(unsafe.Pointer(&buf[0]))%4)%4) + odd
		return buf[off : off+n : off+n]
	}
	return at(0), at(1)
}

func naiveDecode(src []byte) []float32 {
	x := make([]float32, len(src)/4)
	for i := range x {
		x[i] = math.Float32frombits(uint32(src[4*i]) | uint32(src[4*i+1])<<8 | uint32(src[4*i+2])<<16 | uint32(src[4*i+3])<<24)
	}
	return x
}

func naiveEncode(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, f := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

var testLengths = []int{0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 1000, 1027, 2*chunk + 3}

func TestKernelsMatchFloatVersions(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range testLengths {
		x := randomFloats(rng, n)
		acc := randomFloats(rng, n)
		w := float32(rng.NormFloat64())
		enc := naiveEncode(x)
		aligned, unaligned := byteBufs(4 * n)
		copy(aligned, enc)
		copy(unaligned, enc)
		if _, ok := asFloats(aligned); n > 0 && littleEndian && !ok {
			t.Fatal("aligned buffer not taken as aligned")
		}
		if _, ok := asFloats(unaligned); ok {
			t.Fatal("unaligned buffer taken as aligned")
		}

		// What the kernels must give, by plain loops on floats.
		wantAdd := make([]float32, n)
		wantScale := make([]float32, n)
		wantAxpy := make([]float32, n)
		for i := range n {
			wantAdd[i] = acc[i] + x[i]
			wantScale[i] = float32(w * x[i])
			wantAxpy[i] = acc[i] + float32(w*x[i])
		}
		got := make([]float32, n)
		run := func(what string, f func(), want []float32) {
			t.Helper()
			copy(got, acc)
			f()
			sameBits(t, what, got, want)
		}
		for _, b := range []struct {
			name string
			src  []byte
		}{{"aligned", aligned}, {"unaligned", unaligned}} {
			src := b.src
			name := b.name + " n=" + itoaTest(n)
			run("CopyLE "+name, func() { CopyLE(got, src) }, x)
			run("AddLE "+name, func() { AddLE(got, src) }, wantAdd)
			run("ScaleLE "+name, func() { ScaleLE(got, w, src) }, wantScale)
			run("AxpyLE "+name, func() { AxpyLE(got, w, src) }, wantAxpy)
			// The big-endian decoding paths, whatever the alignment.
			run("copyLEDecode "+name, func() { copyLEDecode(got, src) }, x)
			run("addLEDecode "+name, func() { addLEDecode(got, src) }, wantAdd)
			run("scaleLEDecode "+name, func() { scaleLEDecode(got, w, src) }, wantScale)
			run("axpyLEDecode "+name, func() { axpyLEDecode(got, w, src) }, wantAxpy)
			// The fused sum of one and of two payloads.
			run("SumLE(x) "+name, func() { SumLE(got, [][]byte{src}) }, x)
			want2 := append([]float32(nil), x...)
			Add(want2, x)
			run("SumLE(x, x) "+name, func() { SumLE(got, [][]byte{src, src}) }, want2)
			sameBits(t, "naiveDecode "+name, naiveDecode(src), x)
		}
		run("Add", func() { Add(got, x) }, wantAdd)
		run("Scale", func() { Scale(got, w, x) }, wantScale)
		run("Axpy", func() { Axpy(got, w, x) }, wantAxpy)

		// EncodeLE is the inverse of CopyLE, on both alignments.
		for _, dst := range [][]byte{aligned, unaligned} {
			clear(dst)
			EncodeLE(dst, x)
			if string(dst) != string(enc) {
				t.Errorf("EncodeLE n=%d: bytes differ", n)
			}
		}
	}
}

// The runtime sums encoded bytes with CopyLE + AddLE; the reference sums floats with copy + Add.
// Same bits, whatever the alignment of each rank's payload.
func TestByteSumEqualsFloatSum(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	const n, ranks = 257, 5
	var floatSum, byteSum []float32
	for r := range ranks {
		x := randomFloats(rng, n)
		aligned, unaligned := byteBufs(4 * n)
		src := aligned
		if r%2 == 1 {
			src = unaligned
		}
		EncodeLE(src, x)
		if r == 0 {
			floatSum = append([]float32(nil), x...)
			byteSum = make([]float32, n)
			CopyLE(byteSum, src)
		} else {
			Add(floatSum, x)
			AddLE(byteSum, src)
		}
	}
	sameBits(t, "sum", byteSum, floatSum)
}

// SumLE gives the bits of CopyLE + AddLE in rank order, for every number of ranks (the fused
// path groups them by four), across blocks, with aligned, unaligned and mixed payloads.
func TestSumLE(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(13, 14))
	const n = 2*sumBlock + 5
	for ranks := 1; ranks <= 10; ranks++ {
		for _, mode := range []string{"aligned", "unaligned", "mixed"} {
			srcs := make([][]byte, ranks)
			want := make([]float32, n)
			for r := range srcs {
				aligned, unaligned := byteBufs(4 * n)
				srcs[r] = aligned
				if mode == "unaligned" || (mode == "mixed" && r == ranks-1) {
					srcs[r] = unaligned
				}
				// Values of very different magnitudes, so that the order shows in the bits.
				x := randomFloats(rng, n)
				for i := range x {
					x[i] = float32(rng.NormFloat64() * math.Pow(2, float64(rng.IntN(40)-20)))
				}
				EncodeLE(srcs[r], x)
				if r == 0 {
					CopyLE(want, srcs[r])
				} else {
					AddLE(want, srcs[r])
				}
			}
			got := make([]float32, n)
			SumLE(got, srcs)
			sameBits(t, "SumLE "+mode+" ranks="+itoaTest(ranks), got, want)
		}
	}
	// More ranks than the fused path keeps on the stack.
	srcs := make([][]byte, 70)
	want := make([]float32, 10)
	for r := range srcs {
		srcs[r] = naiveEncode(randomFloats(rng, 10))
		if r == 0 {
			CopyLE(want, srcs[r])
		} else {
			AddLE(want, srcs[r])
		}
	}
	got := make([]float32, 10)
	SumLE(got, srcs)
	sameBits(t, "SumLE 70 ranks", got, want)
}

func TestNonFinite(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	bad := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)),
		math.Float32frombits(0x7f800001), math.Float32frombits(0xffc00000)}
	for _, n := range testLengths {
		x := randomFloats(rng, n)
		if n > 0 {
			x[n/3] = -math.MaxFloat32 // finite extremes are finite
		}
		aligned, unaligned := byteBufs(4 * n)
		for _, src := range [][]byte{aligned, unaligned} {
			EncodeLE(src, x)
			if got := NonFinite(src); got != -1 {
				t.Errorf("n=%d finite: NonFinite = %d", n, got)
			}
			for _, pos := range []int{0, n / 2, n - 1} {
				if pos < 0 || pos >= n {
					continue
				}
				for _, b := range bad {
					y := append([]float32(nil), x...)
					y[pos] = b
					if pos+1 < n {
						y[n-1] = float32(math.Inf(1)) // a later one must not win
					}
					EncodeLE(src, y)
					if got := NonFinite(src); got != pos {
						t.Errorf("n=%d %v at %d: NonFinite = %d", n, b, pos, got)
					}
				}
			}
		}
	}
}

func TestKernelLengthPanics(t *testing.T) {
	t.Parallel()
	for name, f := range map[string]func(){
		"CopyLE":    func() { CopyLE(make([]float32, 2), make([]byte, 7)) },
		"AddLE":     func() { AddLE(make([]float32, 2), make([]byte, 12)) },
		"ScaleLE":   func() { ScaleLE(make([]float32, 2), 1, make([]byte, 4)) },
		"AxpyLE":    func() { AxpyLE(make([]float32, 2), 1, make([]byte, 9)) },
		"EncodeLE":  func() { EncodeLE(make([]byte, 9), make([]float32, 2)) },
		"NonFinite": func() { NonFinite(make([]byte, 9)) },
		"Add":       func() { Add(make([]float32, 3), make([]float32, 2)) },
		"SumLE":     func() { SumLE(make([]float32, 2), [][]byte{make([]byte, 8), make([]byte, 4)}) },
		"SumLE()":   func() { SumLE(make([]float32, 2), nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// Not parallel: testing.AllocsPerRun counts the whole process's allocations.
func TestKernelsDoNotAllocate(t *testing.T) {
	const n = 1001
	dst := make([]float32, n)
	aligned, unaligned := byteBufs(4 * n)
	for _, src := range [][]byte{aligned, unaligned} {
		if a := testing.AllocsPerRun(10, func() {
			CopyLE(dst, src)
			AddLE(dst, src)
			ScaleLE(dst, 2, src)
			AxpyLE(dst, 2, src)
			EncodeLE(src, dst)
			NonFinite(src)
			SumLE(dst, [][]byte{src, src, src, src, src, src})
		}); a != 0 {
			t.Errorf("%v allocations", a)
		}
	}
}

func itoaTest(n int) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}

// Every position of a short payload, so that every lane of NonFinite's 64-bit words and of its
// 64-byte groups is covered, next to the largest finite values.
func TestNonFiniteEveryPosition(t *testing.T) {
	t.Parallel()
	const n = 21
	finite := make([]float32, n)
	for i := range finite {
		finite[i] = math.Float32frombits(0x7f7fffff | uint32(i%2)<<31) // ±MaxFloat32
	}
	aligned, unaligned := byteBufs(4 * n)
	for _, src := range [][]byte{aligned, unaligned} {
		EncodeLE(src, finite)
		if got := NonFinite(src); got != -1 {
			t.Errorf("finite: NonFinite = %d", got)
		}
		for pos := range n {
			for _, bits := range []uint32{0x7f800000, 0xff800000, 0x7fc00000, 0xffffffff, 0x7f800001} {
				y := append([]float32(nil), finite...)
				y[pos] = math.Float32frombits(bits)
				EncodeLE(src, y)
				if got := NonFinite(src); got != pos {
					t.Errorf("%#08x at %d: NonFinite = %d", bits, pos, got)
				}
			}
		}
	}
}
