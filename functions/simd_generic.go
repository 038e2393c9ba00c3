//go:build !amd64

package functions

import "unsafe"

// Elsewhere the kernels are the portable Go loops: the stubs below are never called.
const haveSIMD = false

var useSIMD = false

func foldAVX2(dst *float32, srcs *unsafe.Pointer, nsrc, n int) { panic("functions: no SIMD kernels") }
func sgdAVX(p, grad *float32, n int, s, lr float32)            { panic("functions: no SIMD kernels") }
func sgdWDAVX(p, grad *float32, n int, s, lr, wd float32)      { panic("functions: no SIMD kernels") }
func decayAVX(grad, p *float32, n int, s, wd float32)          { panic("functions: no SIMD kernels") }
func scaleAVX(dst *float32, src unsafe.Pointer, n int, c float32) {
	panic("functions: no SIMD kernels")
}
func axpyAVX(dst *float32, src unsafe.Pointer, n int, w float32) { panic("functions: no SIMD kernels") }
func adamAVX(p, grad, m, v *float32, n int, k *adamConsts)       { panic("functions: no SIMD kernels") }
func momentumAVX(p, grad, v *float32, n int, k *[4]float32, mode int) {
	panic("functions: no SIMD kernels")
}
func adagradAVX(p, grad, acc *float32, n int, k *[4]float32) { panic("functions: no SIMD kernels") }
