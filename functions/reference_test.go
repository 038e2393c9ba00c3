package functions

import (
	"math"
	"math/rand/v2"
	"testing"
)

// configs covers every function, with weight decay where it has one.
var configs = []struct {
	name  string
	hyper map[string]float64
}{
	{"sum", nil},
	{"mean", nil},
	{"fedavg", nil},
	{"sgd", map[string]float64{"lr": 0.1, "weight_decay": 0.01}},
	{"momentum", map[string]float64{"lr": 0.1, "dampening": 0.1, "weight_decay": 0.01}},
	{"nesterov", map[string]float64{"lr": 0.1}},
	{"adam", map[string]float64{"weight_decay": 0.01}},
	{"adamw", nil},
	{"adagrad", map[string]float64{"initial_accumulator": 0.1, "weight_decay": 0.01}},
}

func randomGrads(rng *rand.Rand, ranks, n int) [][]float32 {
	g := make([][]float32, ranks)
	for r := range g {
		g[r] = make([]float32, n)
		for i := range g[r] {
			g[r][i] = float32(rng.NormFloat64())
		}
	}
	return g
}

func randomWeights(rng *rand.Rand, ranks int) []float64 {
	w := make([]float64, ranks)
	for r := range w {
		w[r] = float64(1 + rng.IntN(1000))
	}
	return w
}

// Element-wise functions without clipping do not depend on the shard layout.
func TestReferenceShardingDoesNotMatter(t *testing.T) {
	t.Parallel()
	const n, ranks = 37, 3
	layouts := [][]Range{
		{{0, 37}},
		{{0, 5}, {5, 1}, {6, 16}, {22, 15}},
		{{30, 7}, {0, 10}, {10, 20}}, // any order
	}
	for _, c := range configs {
		rng := rand.New(rand.NewPCG(7, 8))
		init := randomGrads(rng, 1, n)[0]
		refs := make([]*Reference, len(layouts))
		for i, l := range layouts {
			refs[i] = NewReference(mustNew(t, c.name, c.hyper), ranks, l, init)
		}
		for range 3 {
			grads, weights := randomGrads(rng, ranks, n), randomWeights(rng, ranks)
			for _, r := range refs {
				r.Step(grads, weights)
			}
			for i := range refs[1:] {
				sameBits(t, c.name, refs[i+1].Params(), refs[0].Params())
			}
		}
	}
}

// Clipping is per shard, so with clip_norm the layout matters: [3, 4 | 6, 8] with clip_norm 5
// leaves the first shard (norm 5) and halves the second (norm 10) to [3, 4]; as one shard the
// norm is sqrt(125) and every element is scaled by float32(5/sqrt(125)).
func TestReferenceClipIsPerShard(t *testing.T) {
	t.Parallel()
	fn := mustNew(t, "sum", map[string]float64{"clip_norm": 5})
	grads := [][]float32{{3, 4, 6, 8}}
	two := NewReference(fn, 1, []Range{{0, 2}, {2, 2}}, make([]float32, 4))
	two.Step(grads, nil)
	sameBits(t, "two shards", two.Params(), []float32{3, 4, 3, 4})

	one := NewReference(fn, 1, []Range{{0, 4}}, make([]float32, 4))
	one.Step(grads, nil)
	c := float32(5 / math.Sqrt(125))
	sameBits(t, "one shard", one.Params(), []float32{float32(3 * c), float32(4 * c), float32(6 * c), float32(8 * c)})
}

// The rank order is part of the contract, and the tests can tell: with e = 2^-24 (half an ulp of
// 1), (1 + e) + e rounds to 1 twice, while (e + e) + 1 = 1 + 2^-23 exactly.
func TestReferenceRankOrderMatters(t *testing.T) {
	t.Parallel()
	const e = 1.0 / (1 << 24)
	fn := mustNew(t, "sum", nil)
	a := NewReference(fn, 3, nil, []float32{0})
	a.Step([][]float32{{1}, {e}, {e}}, nil)
	sameBits(t, "1, e, e", a.Params(), []float32{1})
	b := NewReference(fn, 3, nil, []float32{0})
	b.Step([][]float32{{e}, {e}, {1}}, nil)
	sameBits(t, "e, e, 1", b.Params(), []float32{1 + 2*e})
}

// What the runtime does, emulated: each rank's shard encoded to bytes (at any alignment), summed
// with CopyLE/AddLE (ScaleLE/AxpyLE for fedavg), then Apply on a separately configured Func with
// its own state. It gives the reference's bits, with and without clipping.
func TestReferenceMatchesByteSum(t *testing.T) {
	t.Parallel()
	const n, ranks = 50, 4
	shards := []Range{{0, 13}, {13, 13}, {26, 24}}
	for _, c := range configs {
		for _, clip := range []float64{0, 0.5} {
			hyper := map[string]float64{"clip_norm": clip}
			for k, v := range c.hyper {
				hyper[k] = v
			}
			rng := rand.New(rand.NewPCG(9, 10))
			init := randomGrads(rng, 1, n)[0]
			ref := NewReference(mustNew(t, c.name, hyper), ranks, shards, init)

			fn := mustNew(t, c.name, hyper) // a runtime's own instance
			params := append([]float32(nil), init...)
			states := make([][][]float32, len(shards))
			for i, s := range shards {
				states[i] = make([][]float32, fn.Slots())
				for j := range states[i] {
					states[i][j] = make([]float32, s.Len)
				}
				fn.InitState(states[i])
			}
			for step := int64(1); step <= 3; step++ {
				grads, weights := randomGrads(rng, ranks, n), randomWeights(rng, ranks)
				ref.Step(grads, weights)
				for i, s := range shards {
					acc := make([]float32, s.Len)
					for r := range ranks {
						aligned, unaligned := byteBufs(4 * s.Len)
						payload := aligned
						if (r+i)%2 == 1 {
							payload = unaligned
						}
						EncodeLE(payload, grads[r][s.Off:s.Off+s.Len])
						switch {
						case Weighted(c.name) && r == 0:
							ScaleLE(acc, float32(weights[r]), payload)
						case Weighted(c.name):
							AxpyLE(acc, float32(weights[r]), payload)
						case r == 0:
							CopyLE(acc, payload)
						default:
							AddLE(acc, payload)
						}
					}
					ws := float64(ranks)
					if Weighted(c.name) {
						ws = SumWeights(weights)
					}
					fn.Apply(&Update{Params: params[s.Off : s.Off+s.Len], Grad: acc, State: states[i],
						Step: step, Ranks: ranks, WeightSum: ws})
				}
				sameBits(t, c.name, params, ref.Params())
				if ref.StepCount() != step {
					t.Fatalf("StepCount() = %d, want %d", ref.StepCount(), step)
				}
			}
		}
	}
}

// fedavg with nil weights is the mean; weights are ignored by unweighted functions.
func TestReferenceWeights(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(11, 12))
	grads := randomGrads(rng, 3, 20)
	fed := NewReference(mustNew(t, "fedavg", nil), 3, nil, make([]float32, 20))
	fed.Step(grads, nil)
	mean := NewReference(mustNew(t, "mean", nil), 3, nil, make([]float32, 20))
	mean.Step(grads, []float64{5, 6, 7})
	sameBits(t, "fedavg(nil) vs mean", fed.Params(), mean.Params())
	ones := NewReference(mustNew(t, "fedavg", nil), 3, nil, make([]float32, 20))
	ones.Step(grads, []float64{1, 1, 1})
	sameBits(t, "fedavg(1, 1, 1) vs mean", ones.Params(), mean.Params())
}

func TestReferenceLayout(t *testing.T) {
	t.Parallel()
	init := []float32{1, 2, 3, 4, 5}
	r := NewReference(mustNew(t, "sum", nil), 1, []Range{{1, 2}}, init)
	init[1] = 100 // NewReference copied init
	r.Step([][]float32{{9, 9, 9, 9, 9}}, nil)
	// Elements outside every shard keep their values.
	sameBits(t, "params", r.Params(), []float32{1, 9, 9, 4, 5})

	for name, shards := range map[string][]Range{
		"overlap":  {{0, 3}, {2, 2}},
		"outside":  {{3, 3}},
		"negative": {{-1, 2}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			NewReference(mustNew(t, "sum", nil), 1, shards, init)
		}()
	}
	for name, f := range map[string]func(){
		"ranks":   func() { r.Step([][]float32{{1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}}, nil) },
		"length":  func() { r.Step([][]float32{{1, 1}}, nil) },
		"weights": func() { NewReference(mustNew(t, "fedavg", nil), 1, nil, init).Step([][]float32{init}, []float64{1, 2}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// ApplyRank is a one-rank step of one shard, whatever the job's rank count: applied to every
// shard in turn it gives the bits of a one-rank reference's Step (Ranks 1, WeightSum the weight,
// Step the shard's own update count), for every function.
func TestApplyRankIsAOneRankStep(t *testing.T) {
	t.Parallel()
	shards := []Range{{0, 300}, {300, 200}, {500, 13}}
	for _, c := range configs {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 8))
			init := randomGrads(rng, 1, 513)[0]
			f1, err := New(c.name, c.hyper)
			if err != nil {
				t.Fatal(err)
			}
			f3, _ := New(c.name, c.hyper)
			one := NewReference(f1, 1, shards, init)
			asp := NewReference(f3, 3, shards, init)
			for step := range 6 {
				g := randomGrads(rng, 1, 513)
				w := randomWeights(rng, 1)
				one.Step(g, w)
				for s := range shards {
					asp.ApplyRank(s, g[0], w[0])
				}
				for i, p := range one.Params() {
					if math.Float32bits(p) != math.Float32bits(asp.Params()[i]) {
						t.Fatalf("update %d, element %d: ApplyRank %v, one-rank Step %v", step+1, i, asp.Params()[i], p)
					}
				}
			}
			// Each shard counts its own updates: one more on shard 0 is its 7th (Adam's bias
			// correction), while shards 1 and 2 stay where they were.
			g := randomGrads(rng, 1, 513)
			before := append([]float32(nil), asp.Params()...)
			asp.ApplyRank(0, g[0], 1)
			for i := 300; i < 513; i++ {
				if math.Float32bits(before[i]) != math.Float32bits(asp.Params()[i]) {
					t.Fatalf("element %d of another shard changed", i)
				}
			}
		})
	}
}
