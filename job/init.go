package job

import (
	"math"
)

// InitShard writes the initial parameters of the elements [off, off+len(dst)) of the flattened
// vector. Each element depends only on the seed and its global index, so any sharding of the vector
// gives the same values. Kind "upload" and "zeros" give zeros (an upload replaces them).
func (s *Spec) InitShard(off int, dst []float32) {
	switch s.Init.Kind {
	case "uniform":
		for i := range dst {
			u := unit(s.Init.Seed, uint64(off+i), 0)
			dst[i] = float32((2*u - 1) * s.Init.Scale)
		}
	case "normal":
		for i := range dst {
			// Box-Muller from two independent uniforms of this element.
			u1 := unit(s.Init.Seed, uint64(off+i), 1)
			u2 := unit(s.Init.Seed, uint64(off+i), 2)
			z := math.Sqrt(-2*math.Log(1-u1)) * math.Cos(2*math.Pi*u2)
			dst[i] = float32(z * s.Init.Scale)
		}
	default:
		clear(dst)
	}
}

// unit is a uniform number in [0, 1) derived by SplitMix64 from (seed, index, stream).
func unit(seed, index, stream uint64) float64 {
	z := seed ^ (index*0x9E3779B97F4A7C15 + stream*0xD1B54A32D192ED03)
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}
