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

// TestTrainsThroughModule runs federated rounds of a linear regression over 5 clients of unequal
// sizes (the weights): each client takes local SGD steps from the global model and sends its
// delta; the module's FedAdam step must bring the global model close to the truth, with the bits
// of the same Go code run natively.
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
	if !m.Info().Weighted {
		t.Fatal("the module does not declare itself weighted")
	}
	hyper := map[string]float64{"lr": 0.05}
	user, err := m.New("examples/fedadam@1", hyper, false)
	if err != nil {
		t.Fatal(err)
	}
	const dim, clients = 32, 5
	rng := rand.New(rand.NewPCG(5, 6))
	truth := make([]float32, dim)
	for i := range truth {
		truth[i] = float32(rng.NormFloat64())
	}
	weights := []float64{10, 40, 25, 5, 20} // samples per client
	init := make([]float32, dim)
	ref := functions.NewReference(user, clients, nil, init)
	native := functions.NewReference(wasmbuild.Native(function, "fedadam", hyper), clients, nil, init)
	first := loss(ref.Params(), truth)
	for round := range 200 {
		deltas := make([][]float32, clients)
		for c := range deltas {
			deltas[c] = localDelta(rng, ref.Params(), truth, int(weights[c]))
		}
		if err := ref.TryStep(deltas, weights); err != nil {
			t.Fatal(err)
		}
		native.Step(deltas, weights)
		for i, p := range ref.Params() {
			if math.Float32bits(p) != math.Float32bits(native.Params()[i]) {
				t.Fatalf("round %d: element %d is %v in WebAssembly, %v natively", round+1, i, p, native.Params()[i])
			}
		}
	}
	if last := loss(ref.Params(), truth); !(last < first/100) {
		t.Fatalf("loss %v -> %v: FedAdam did not train", first, last)
	}
}

// localDelta is a client's round: 3 SGD steps on its samples from the global model w, returned
// as the change of its model.
func localDelta(rng *rand.Rand, w, truth []float32, samples int) []float32 {
	local := append([]float32(nil), w...)
	x := make([]float32, len(w))
	for range 3 {
		g := make([]float32, len(w))
		for range samples {
			var pred, y float32
			for i := range x {
				x[i] = float32(rng.NormFloat64())
				pred += local[i] * x[i]
				y += truth[i] * x[i]
			}
			for i := range g {
				g[i] += (pred - y) * x[i] / float32(samples)
			}
		}
		for i := range local {
			local[i] -= 0.05 * g[i]
		}
	}
	for i := range local {
		local[i] -= w[i]
	}
	return local
}

func loss(w, truth []float32) float64 {
	var s float64
	for i := range w {
		d := float64(w[i] - truth[i])
		s += d * d
	}
	return s
}
