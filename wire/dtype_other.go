//go:build !amd64

package wire

var useSIMD = false

func encode16SIMD(dst []byte, src []float32, dt Dtype) int { return 0 }
