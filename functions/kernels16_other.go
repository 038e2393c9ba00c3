//go:build !amd64

package functions

var use16SIMD = false

func add16SIMD(dst []float32, src []byte, f16 bool) int { return 0 }

func cvt16SIMD(dst []float32, src []byte, f16 bool) int { return 0 }
