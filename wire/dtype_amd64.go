package wire

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// On amd64 with AVX2 (and F16C for f16), Encode rounds 8 floats per instruction
// (dtype_amd64.s): the same bits as F32ToBF16 and F32ToF16, which the tests check (useSIMD).
var (
	haveBF16SIMD = cpu.X86.HasAVX && cpu.X86.HasAVX2
	haveF16SIMD  = haveBF16SIMD && cpu.X86.HasF16C
	useSIMD      = true
)

//go:noescape
func encodeBF16AVX2(dst *uint16, src *float32, n int)

//go:noescape
func encodeF16AVX2(dst *uint16, src *float32, n int)

//go:noescape
func decodeBF16AVX2(dst *float32, src *byte, n int)

// decodeBF16SIMD decodes the first n - n%8 bf16 elements of src into dst with the assembly when
// the CPU has it, and returns how many. src may be at any address.
func decodeBF16SIMD(dst []float32, src []byte) int {
	n := len(dst) &^ 7
	if !useSIMD || !haveBF16SIMD || n == 0 {
		return 0
	}
	_ = src[2*n-1]
	decodeBF16AVX2(&dst[0], &src[0], n)
	return n
}

// encode16SIMD encodes the first n - n%8 elements of src into dst (2 bytes each) with the
// assembly when the CPU has it and dst is 2-byte aligned, and returns how many.
func encode16SIMD(dst []byte, src []float32, dt Dtype) int {
	n := len(src) &^ 7
	if !useSIMD || n == 0 || uintptr(unsafe.Pointer(&dst[0]))%2 != 0 {
		return 0
	}
	_ = dst[2*n-1]
	d := (*uint16)(unsafe.Pointer(&dst[0]))
	switch {
	case dt == BF16 && haveBF16SIMD:
		encodeBF16AVX2(d, &src[0], n)
	case dt == F16 && haveF16SIMD:
		encodeF16AVX2(d, &src[0], n)
	default:
		return 0
	}
	return n
}
