package functions

import (
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// goldenData returns n float32s built from integer bits only (so the same on every machine): a
// random sign, a random mantissa and an exponent spread over 2^-20..2^20, so that products and
// sums of similar magnitudes make rounding (and any fused multiply-add) show in the bits.
func goldenData(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		exp := uint32(127-20) + uint32(rng.IntN(41))
		x[i] = math.Float32frombits(rng.Uint32()&0x807fffff | exp<<23)
	}
	return x
}

// goldenHashes are FNV-1a hashes of the parameters after each of 3 steps of 3 ranks over 1000
// elements in 2 shards. They were computed on amd64; the same test passes on arm64, ppc64le,
// riscv64 and s390x (big-endian) under qemu, which is how the "no FMA" rule is checked: removing a
// float32(...) conversion around a product makes it fail there.
var goldenHashes = map[string]uint64{
	"sum clip_norm=0":                             0x47b4a7fef766e8c7,
	"sum clip_norm=1000":                          0x1abd97eacf8aa7b2,
	"mean clip_norm=0":                            0x1fd3a78e797795f1,
	"mean clip_norm=1000":                         0xe834266b15a09f5a,
	"fedavg clip_norm=0":                          0xc5352f36436c78dd,
	"fedavg clip_norm=1000":                       0x9ebc6f1564ef3897,
	"sgd clip_norm=0,lr=0.1,weight_decay=0.01":    0xe1f1d109333231d2,
	"sgd clip_norm=1000,lr=0.1,weight_decay=0.01": 0x8e0c757aeb7f10ec,
	"momentum clip_norm=0,dampening=0.1,lr=0.1,momentum=0.9,nesterov=0,weight_decay=0.01":    0xb050206308cef48,
	"momentum clip_norm=1000,dampening=0.1,lr=0.1,momentum=0.9,nesterov=0,weight_decay=0.01": 0x7536921c5afa2d81,
	"nesterov clip_norm=0,dampening=0,lr=0.1,momentum=0.9,weight_decay=0":                    0xbcfdb5313c4004cb,
	"nesterov clip_norm=1000,dampening=0,lr=0.1,momentum=0.9,weight_decay=0":                 0xfaebc78851dd6b6a,
	"adam beta1=0.9,beta2=0.999,clip_norm=0,eps=1e-08,lr=0.001,weight_decay=0.01":            0x9c962e3b5f1f95a8,
	"adam beta1=0.9,beta2=0.999,clip_norm=1000,eps=1e-08,lr=0.001,weight_decay=0.01":         0x8ee666c196b9a04f,
	"adamw beta1=0.9,beta2=0.999,clip_norm=0,eps=1e-08,lr=0.001,weight_decay=0.01":           0x3ec877772be46372,
	"adamw beta1=0.9,beta2=0.999,clip_norm=1000,eps=1e-08,lr=0.001,weight_decay=0.01":        0xf4cf0142da961a04,
	"adagrad clip_norm=0,eps=1e-10,initial_accumulator=0.1,lr=0.01,weight_decay=0.01":        0x5d287506f96d524,
	"adagrad clip_norm=1000,eps=1e-10,initial_accumulator=0.1,lr=0.01,weight_decay=0.01":     0x35646f66a08553ad,
	"sgd clip_norm=0,lr=0.37,weight_decay=0":                                                 0x51cc399e3105d5f4,
	"momentum clip_norm=0,dampening=0,lr=0.1,momentum=0.9,nesterov=1,weight_decay=0.3":       0xf1ffee0971abeb8a,
	"adamw beta1=0.9,beta2=0.999,clip_norm=0,eps=1e-08,lr=0.05,weight_decay=0.3":             0xa0d73f42f22d7451,
	"adagrad clip_norm=0,eps=1e-10,initial_accumulator=0,lr=0.3,weight_decay=0":              0x3f342946a6470e2,
}

// TestGolden runs with the SIMD kernels (where the machine has them) and with the Go loops.
func TestGolden(t *testing.T) {
	for _, simd := range []bool{true, false} {
		t.Run(fmt.Sprintf("simd=%v", simd), func(t *testing.T) {
			if simd && !haveSIMD {
				t.Skip("no SIMD kernels on this machine")
			}
			defer setSIMD(simd)()
			goldenCheck(t)
		})
	}
}

func goldenCheck(t *testing.T) {
	type config struct {
		name  string
		hyper map[string]float64
	}
	var all []config
	for _, c := range configs {
		all = append(all, config{c.name, c.hyper})
		clipped := map[string]float64{"clip_norm": 1000}
		for k, v := range c.hyper {
			clipped[k] = v
		}
		all = append(all, config{c.name, clipped})
	}
	all = append(all,
		config{"sgd", map[string]float64{"lr": 0.37}},
		config{"momentum", map[string]float64{"lr": 0.1, "nesterov": 1, "weight_decay": 0.3}},
		config{"adamw", map[string]float64{"lr": 0.05, "weight_decay": 0.3}},
		config{"adagrad", map[string]float64{"lr": 0.3}},
	)
	const n, ranks = 1000, 3
	for _, c := range all {
		rng := rand.New(rand.NewPCG(42, 43))
		ref := NewReference(mustNew(t, c.name, c.hyper), ranks, []Range{{0, 300}, {300, 700}}, goldenData(rng, n))
		h := fnv.New64a()
		buf := make([]byte, 4*n)
		for range 3 {
			grads := make([][]float32, ranks)
			weights := make([]float64, ranks)
			for r := range grads {
				grads[r] = goldenData(rng, n)
				weights[r] = float64(1 + rng.IntN(100))
			}
			ref.Step(grads, weights)
			EncodeLE(buf, ref.Params())
			h.Write(buf)
		}
		key := c.name + " " + hyperKey(mustNew(t, c.name, c.hyper).Hyper())
		got := h.Sum64()
		want, ok := goldenHashes[key]
		switch {
		case !ok:
			t.Errorf("no golden hash: %q: %#x,", key, got)
		case got != want:
			t.Errorf("%s: hash %#x, want %#x", key, got, want)
		}
	}
}

// hyperKey formats hyper-parameters as sorted key=value pairs.
func hyperKey(h map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(h)) {
		parts = append(parts, fmt.Sprintf("%s=%g", k, h[k]))
	}
	return strings.Join(parts, ",")
}
