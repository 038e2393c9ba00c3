package wasmfn_test

import (
	"fmt"
	"testing"

	"github.com/fanin-ml/fanin/functions"
)

// BenchmarkSGD is the user-written SGD's call on one shard, copies in and out included.
func BenchmarkSGD(b *testing.B) {
	for _, n := range []int{1024, 256 << 10} {
		b.Run(fmt.Sprintf("Elems=%d", n), func(b *testing.B) {
			f, err := load(b, "testdata/sgd").New("b/sgd@1", map[string]float64{"lr": 0.01}, false)
			if err != nil {
				b.Fatal(err)
			}
			u := &functions.Update{Params: make([]float32, n), Grad: make([]float32, n), Step: 1, Ranks: 1, WeightSum: 1}
			b.SetBytes(int64(4 * n))
			b.ReportAllocs()
			for b.Loop() {
				if err := f.TryApply(u); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
