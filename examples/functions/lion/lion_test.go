package main

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/functions/wasmfn"
	"github.com/fanin-ml/fanin/lab/wasmbuild"
)

// TestTrainsThroughModule trains a linear regression on 4 ranks with the module built by the
// documented command: the loss falls 20-fold, and every step's parameters are the bits of the same
// Go code run natively.
func TestTrainsThroughModule(t *testing.T) {
	t.Parallel()
	e, err := wasmfn.NewEngine(context.Background(), wasmfn.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	m, err := e.Load(context.Background(), wasmbuild.ForTest(t, "."))
	if err != nil {
		t.Fatal(err)
	}
	hyper := map[string]float64{"lr": 0.003, "weight_decay": 0.001}
	user, err := m.New("examples/lion@1", hyper, false)
	if err != nil {
		t.Fatal(err)
	}
	const dim, ranks, batch = 64, 4, 32
	rng := rand.New(rand.NewPCG(3, 4))
	truth := make([]float32, dim)
	for i := range truth {
		truth[i] = float32(rng.NormFloat64())
	}
	shards := []functions.Range{{Off: 0, Len: 40}, {Off: 40, Len: 24}}
	init := make([]float32, dim)
	ref := functions.NewReference(user, ranks, shards, init)
	native := functions.NewReference(wasmbuild.Native(function, "lion", hyper), ranks, shards, init)
	first := loss(ref.Params(), truth)
	for step := range 600 {
		grads := make([][]float32, ranks)
		for r := range grads {
			grads[r] = gradient(rng, ref.Params(), truth, batch)
		}
		if err := ref.TryStep(grads, nil); err != nil {
			t.Fatal(err)
		}
		native.Step(grads, nil)
		for i, p := range ref.Params() {
			if math.Float32bits(p) != math.Float32bits(native.Params()[i]) {
				t.Fatalf("step %d: element %d is %v in WebAssembly, %v natively", step+1, i, p, native.Params()[i])
			}
		}
	}
	if last := loss(ref.Params(), truth); !(last < first/20) {
		t.Fatalf("loss %v -> %v: Lion did not train", first, last)
	}
}

// gradient is the least-squares gradient of a random batch: x ~ N(0, 1), y = truth.x.
func gradient(rng *rand.Rand, w, truth []float32, batch int) []float32 {
	g := make([]float32, len(w))
	x := make([]float32, len(w))
	for range batch {
		var pred, y float32
		for i := range x {
			x[i] = float32(rng.NormFloat64())
			pred += w[i] * x[i]
			y += truth[i] * x[i]
		}
		for i := range g {
			g[i] += (pred - y) * x[i] / float32(batch)
		}
	}
	return g
}

func loss(w, truth []float32) float64 {
	var s float64
	for i := range w {
		d := float64(w[i] - truth[i])
		s += d * d
	}
	return s
}
