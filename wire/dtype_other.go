//go:build !amd64

package wire

var useSIMD = false

func encode16SIMD(dst []byte, src []float32, dt Dtype) int { return 0 }

func decodeBF16SIMD(dst []float32, src []byte) int { return 0 }
