package functions

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// On amd64 the kernels' loops run in hand-written AVX assembly (simd_amd64.s) when the CPU and
// the OS support AVX2, and in the portable Go loops otherwise. The assembly performs the same
// float32 operations per element as the Go loops, in the same order, so both give the same bits;
// the tests run both (see useSIMD).
var haveSIMD = cpu.X86.HasAVX && cpu.X86.HasAVX2

// useSIMD selects the assembly; the tests clear it to compare the Go loops with it.
var useSIMD = haveSIMD

//go:noescape
func foldAVX2(dst *float32, srcs *unsafe.Pointer, nsrc, n int)

//go:noescape
func sgdAVX(p, grad *float32, n int, s, lr float32)

//go:noescape
func sgdWDAVX(p, grad *float32, n int, s, lr, wd float32)

//go:noescape
func decayAVX(grad, p *float32, n int, s, wd float32)

//go:noescape
func scaleAVX(dst *float32, src unsafe.Pointer, n int, c float32)

//go:noescape
func axpyAVX(dst *float32, src unsafe.Pointer, n int, w float32)

//go:noescape
func adamAVX(p, grad, m, v *float32, n int, k *adamConsts)

//go:noescape
func momentumAVX(p, grad, v *float32, n int, k *[4]float32, mode int)

//go:noescape
func adagradAVX(p, grad, acc *float32, n int, k *[4]float32)
