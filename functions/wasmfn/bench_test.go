package wasmfn_test

import (
	"fmt"
	"testing"

	"github.com/fanin-ml/fanin/functions"
)

// BenchmarkSGD is the user-written SGD's call on one shard, copies in and out included: the
// module that takes 8 elements a loop turn (sgd) and the one that takes one (sgdloop).
func BenchmarkSGD(b *testing.B) {
	for _, c := range []struct {
		dir string
		n   int
	}{{"sgd", 1024}, {"sgd", 256 << 10}, {"sgdloop", 1024}, {"sgdloop", 256 << 10}} {
		n := c.n
		b.Run(fmt.Sprintf("Module=%s,Elems=%d", c.dir, n), func(b *testing.B) {
			f, err := load(b, "testdata/"+c.dir).New("b/"+c.dir+"@1", map[string]float64{"lr": 0.01}, false)
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
