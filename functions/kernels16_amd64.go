package functions

import "golang.org/x/sys/cpu"

// On amd64 with AVX2 (and F16C for f16), AddLE16 widens 8 elements per instruction
// (kernels16_amd64.s: VPMOVZXWD and a shift for bf16, VCVTPH2PS for f16, both exact) and adds
// them with VADDPS in the same operand order as the Go loop (dst + x), so both give the same bits;
// the tests run both (use16SIMD).
var (
	have16BF = cpu.X86.HasAVX && cpu.X86.HasAVX2
	have16F  = have16BF && cpu.X86.HasF16C
)

// use16SIMD selects the assembly; the tests clear it to compare the Go loops with it.
var use16SIMD = true

//go:noescape
func addBF16AVX2(dst *float32, src *byte, n int)

//go:noescape
func addF16AVX2(dst *float32, src *byte, n int)

//go:noescape
func cvtBF16AVX2(dst *float32, src *byte, n int)

//go:noescape
func cvtF16AVX2(dst *float32, src *byte, n int)

// cvt16SIMD converts the first n - n%8 elements of the payload src into dst with the assembly when
// the CPU has it, and returns how many it converted. src may be at any address: a payload after
// NATS headers often starts at an odd one.
func cvt16SIMD(dst []float32, src []byte, f16 bool) int {
	n := len(dst) &^ 7
	if !use16SIMD || n == 0 || f16 && !have16F || !f16 && !have16BF {
		return 0
	}
	_ = src[2*n-1]
	if f16 {
		cvtF16AVX2(&dst[0], &src[0], n)
	} else {
		cvtBF16AVX2(&dst[0], &src[0], n)
	}
	return n
}

// add16SIMD adds the first n - n%16 elements of the payload src into dst with the assembly when
// the CPU has it, and returns how many it added. src may be at any address.
func add16SIMD(dst []float32, src []byte, f16 bool) int {
	n := len(dst) &^ 15
	if !use16SIMD || n == 0 || f16 && !have16F || !f16 && !have16BF {
		return 0
	}
	_ = src[2*n-1]
	if f16 {
		addF16AVX2(&dst[0], &src[0], n)
	} else {
		addBF16AVX2(&dst[0], &src[0], n)
	}
	return n
}
