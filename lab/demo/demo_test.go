package demo

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sync"
	"testing"
)

// defaultProblem is shared by the tests that only read it: generating it takes a while under the
// race detector.
var defaultProblem = sync.OnceValue(func() *Problem { return NewProblem(DefaultConfig()) })

func TestDetExpLogMatchMath(t *testing.T) {
	t.Parallel()
	r := newRNG(42, 0)
	for range 100000 {
		x := -700 * r.uniform()
		if x > -1 {
			x = r.symmetric() // also positive arguments and the neighbourhood of 0
		}
		if got, want := detExp(x), math.Exp(x); !(math.Abs(got-want) <= 1e-15*want) {
			t.Fatalf("detExp(%g) = %g, math.Exp = %g", x, got, want)
		}
		y := math.Exp(700 * r.symmetric())
		if got, want := detLog(y), math.Log(y); !(math.Abs(got-want) <= 1e-15*math.Max(1, math.Abs(want))) {
			t.Fatalf("detLog(%g) = %g, math.Log = %g", y, got, want)
		}
	}
	for _, x := range []float64{0, 1, -1, 2, 10} {
		if got, want := detExp(x), math.Exp(x); !(math.Abs(got-want) <= 1e-15*want) {
			t.Errorf("detExp(%g) = %g, want %g", x, got, want)
		}
		if x > 0 {
			if got, want := detLog(x), math.Log(x); !(math.Abs(got-want) <= 1e-15*math.Max(1, math.Abs(want))) {
				t.Errorf("detLog(%g) = %g, want %g", x, got, want)
			}
		}
	}
	if detExp(-800) != 0 || !math.IsInf(detExp(800), 1) || !math.IsNaN(detExp(math.NaN())) {
		t.Error("detExp: wrong result out of range")
	}
	if !math.IsNaN(detLog(0)) || !math.IsNaN(detLog(-1)) || !math.IsNaN(detLog(math.Inf(1))) {
		t.Error("detLog: wrong result out of domain")
	}
}

// TestGradientMatchesFiniteDifferences compares the analytic gradient with central differences of
// the float64 loss, per coordinate and along a random direction.
func TestGradientMatchesFiniteDifferences(t *testing.T) {
	t.Parallel()
	p := defaultProblem()
	m := NewModel(p)
	r := newRNG(3, 0)
	params := p.InitParams(1)
	_, b1, _, b2 := p.split(params)
	for i := range b1 {
		b1[i] = float32(0.1 * r.symmetric())
	}
	for i := range b2 {
		b2[i] = float32(0.1 * r.symmetric())
	}
	idx := p.batch(nil, 1, 4, 5)
	m.load(params)
	m.gradient(idx)
	analytic := slices.Clone(m.grad)
	base := slices.Clone(m.params)
	lossAt := func(dir []float64, eps float64) float64 {
		for i := range m.params {
			m.params[i] = base[i] + eps*dir[i]
		}
		return m.gradient(idx)
	}

	const eps = 1e-6
	offset := 0
	dir := make([]float64, len(base))
	for _, tensor := range p.Tensors() {
		for range 8 {
			i := offset + r.intn(tensor.Size())
			dir[i] = 1
			numeric := (lossAt(dir, eps) - lossAt(dir, -eps)) / (2 * eps)
			dir[i] = 0
			if math.Abs(analytic[i]-numeric) > 1e-8+1e-5*math.Abs(numeric) {
				t.Errorf("%s[%d]: analytic %.10g, numeric %.10g", tensor.Name, i-offset, analytic[i], numeric)
			}
		}
		offset += tensor.Size()
	}

	var along float64
	for i := range dir {
		dir[i] = r.bell()
		along += analytic[i] * dir[i]
	}
	numeric := (lossAt(dir, eps) - lossAt(dir, -eps)) / (2 * eps)
	if math.Abs(along-numeric) > 1e-6*math.Abs(numeric) {
		t.Errorf("random direction: analytic %.10g, numeric %.10g", along, numeric)
	}
	if math.Abs(along) < 1e-3 {
		t.Errorf("random direction: derivative %g too small to test anything", along)
	}
}

func bitsOf(v []float32) []uint32 {
	b := make([]uint32, len(v))
	for i, x := range v {
		b[i] = math.Float32bits(x)
	}
	return b
}

// fingerprint hashes the bits of a few vectors, to pin them across platforms and releases.
func fingerprint(vs ...[]float32) string {
	h := fnv.New64a()
	for _, v := range vs {
		for _, x := range v {
			b := math.Float32bits(x)
			h.Write([]byte{byte(b), byte(b >> 8), byte(b >> 16), byte(b >> 24)})
		}
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

func labels(y []int32) []float32 {
	f := make([]float32, len(y))
	for i, l := range y {
		f[i] = float32(l)
	}
	return f
}

func TestDeterminism(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	p, q := NewProblem(cfg), NewProblem(cfg)
	if !slices.Equal(bitsOf(p.trainX), bitsOf(q.trainX)) || !slices.Equal(p.trainY, q.trainY) ||
		!slices.Equal(bitsOf(p.testX), bitsOf(q.testX)) || !slices.Equal(p.testY, q.testY) {
		t.Fatal("same config, different data")
	}
	if !slices.Equal(bitsOf(p.InitParams(5)), bitsOf(q.InitParams(5))) {
		t.Fatal("same seed, different parameters")
	}
	if slices.Equal(p.InitParams(5), p.InitParams(6)) {
		t.Error("different seeds, same parameters")
	}
	other := cfg
	other.Seed++
	if slices.Equal(NewProblem(other).trainX, p.trainX) {
		t.Error("different seeds, same data")
	}

	// The sizes only truncate: the test set does not depend on the training set's size.
	small := cfg
	small.TrainSize, small.TestSize = 1000, 3000
	s := NewProblem(small)
	if !slices.Equal(s.trainX, p.trainX[:1000*cfg.Features]) || !slices.Equal(s.testX[:len(p.testX)], p.testX) {
		t.Error("changing the sizes changed the data")
	}

	params := p.InitParams(5)
	m1, m2 := NewModel(p), NewModel(q)
	g1, g2 := make([]float32, p.NumParams()), make([]float32, p.NumParams())
	l1 := m1.Gradient(params, 2, 4, 17, g1)
	m2.Gradient(params, 0, 3, 4, g2) // leave different state in m2's scratch buffers
	l2 := m2.Gradient(params, 2, 4, 17, g2)
	if math.Float32bits(l1) != math.Float32bits(l2) || !slices.Equal(bitsOf(g1), bitsOf(g2)) {
		t.Fatal("same inputs, different gradients")
	}
	el1, ea1 := m1.Evaluate(params)
	el2, ea2 := m2.Evaluate(params)
	if math.Float32bits(el1) != math.Float32bits(el2) || ea1 != ea2 {
		t.Fatal("same inputs, different evaluations")
	}

	// Pinned values: these must be the same on every platform. If they change after a deliberate
	// change to the data or the model, update them; otherwise something platform- or
	// release-dependent has crept in.
	for _, c := range []struct {
		what, got, want string
	}{
		{"train set", fingerprint(p.trainX, labels(p.trainY)), "850dd4a38c12bd7f"},
		{"test set", fingerprint(p.testX, labels(p.testY)), "2be910d0b2e410a4"},
		{"parameters", fingerprint(params), "a2ad0f30ddcb69bd"},
		{"gradient", fingerprint(g1, []float32{l1}), "8991f8cfa141ac46"},
		{"evaluation", fingerprint([]float32{el1, ea1}), "fed20d6373b8af8c"},
	} {
		if c.got != c.want {
			t.Errorf("%s: fingerprint %s, want %s", c.what, c.got, c.want)
		}
	}
}

func TestBatches(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.TrainSize = 1000 // not a multiple of the rank counts below
	p := NewProblem(cfg)
	for _, ranks := range []int{1, 2, 3, 4, 7, 256} {
		b := max(cfg.BatchSize/ranks, 1)
		for _, step := range []int64{0, 1, 2, 3, 1 << 40, -1} {
			seen := map[int]int{}
			for rank := range ranks {
				batch := p.batch(nil, rank, ranks, step)
				if len(batch) != b {
					t.Fatalf("ranks %d step %d: rank %d has %d examples, want %d", ranks, step, rank, len(batch), b)
				}
				for _, k := range batch {
					if k < 0 || k >= cfg.TrainSize {
						t.Fatalf("ranks %d step %d: index %d out of range", ranks, step, k)
					}
					if r, dup := seen[k]; dup {
						t.Fatalf("ranks %d step %d: example %d in the batches of ranks %d and %d", ranks, step, k, r, rank)
					}
					seen[k] = rank
				}
			}
		}
	}

	// Consecutive steps walk through the part: one rank of 4 owns 250 examples, takes 64 a step,
	// and sees every one of them in ceil(250/64) = 4 steps.
	count := map[int]int{}
	for step := range int64(4) {
		for _, k := range p.batch(nil, 3, 4, step) {
			count[k]++
		}
	}
	if len(count) != 250 {
		t.Errorf("4 steps covered %d examples, want 250", len(count))
	}
	for k := range count {
		if k < 750 {
			t.Errorf("rank 3 of 4 took example %d, outside its part [750, 1000)", k)
		}
	}
}

func TestTensors(t *testing.T) {
	t.Parallel()
	p := defaultProblem()
	var names []string
	n := 0
	for _, tensor := range p.Tensors() {
		names = append(names, fmt.Sprint(tensor.Name, tensor.Shape))
		n += tensor.Size()
	}
	if got, want := fmt.Sprint(names), "[w1[32 64] b1[64] w2[64 10] b2[10]]"; got != want {
		t.Errorf("tensors %s, want %s", got, want)
	}
	if n != p.NumParams() || n != 2762 || len(p.InitParams(0)) != n {
		t.Errorf("tensor sizes add up to %d, NumParams is %d", n, p.NumParams())
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.Classes = 1
	if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Classes 1: error %v, want ErrInvalidConfig", err)
	}
	defer func() {
		if recover() == nil {
			t.Error("NewProblem accepted an invalid config")
		}
	}()
	NewProblem(c)
}

func TestPanicsOnMisuse(t *testing.T) {
	t.Parallel()
	p := defaultProblem()
	m := NewModel(p)
	params, grad := p.InitParams(0), make([]float32, p.NumParams())
	for name, f := range map[string]func(){
		"short params":  func() { m.Gradient(params[1:], 0, 1, 0, grad) },
		"short grad":    func() { m.Gradient(params, 0, 1, 0, grad[1:]) },
		"rank too big":  func() { m.Gradient(params, 4, 4, 0, grad) },
		"negative rank": func() { m.Gradient(params, -1, 4, 0, grad) },
		"no ranks":      func() { m.Gradient(params, 0, 0, 0, grad) },
		"too many":      func() { m.Gradient(params, 0, 10000, 0, grad) },
		"eval params":   func() { m.Evaluate(params[1:]) },
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

// Not parallel: testing.AllocsPerRun counts the whole process's allocations.
func TestNoAllocations(t *testing.T) {
	p := defaultProblem()
	m := NewModel(p)
	params, grad := p.InitParams(0), make([]float32, p.NumParams())
	step := int64(0)
	if n := testing.AllocsPerRun(10, func() { m.Gradient(params, 1, 4, step, grad); step++ }); n != 0 {
		t.Errorf("Gradient: %v allocations per call", n)
	}
	if n := testing.AllocsPerRun(2, func() { m.Evaluate(params) }); n != 0 {
		t.Errorf("Evaluate: %v allocations per call", n)
	}
	// Fewer ranks than at construction means bigger batches: still no allocation.
	if n := testing.AllocsPerRun(2, func() { m.Gradient(params, 0, 1, 0, grad) }); n != 0 {
		t.Errorf("Gradient with one rank: %v allocations per call", n)
	}
}

// adam is the textbook optimizer, enough to drive the training test.
type adam struct {
	lr   float64
	m, v []float64
	t    int
}

func (a *adam) step(params, grad []float32) {
	const beta1, beta2, epsilon = 0.9, 0.999, 1e-8
	if a.m == nil {
		a.m, a.v = make([]float64, len(params)), make([]float64, len(params))
	}
	a.t++
	c1, c2 := 1-math.Pow(beta1, float64(a.t)), 1-math.Pow(beta2, float64(a.t))
	for i, g := range grad {
		g := float64(g)
		a.m[i] = beta1*a.m[i] + (1-beta1)*g
		a.v[i] = beta2*a.v[i] + (1-beta2)*g*g
		params[i] -= float32(a.lr * (a.m[i] / c1) / (math.Sqrt(a.v[i]/c2) + epsilon))
	}
}

type sgd struct{ lr float32 }

func (s sgd) step(params, grad []float32) {
	for i, g := range grad {
		params[i] -= s.lr * g
	}
}

// TestTraining runs the demo job in miniature: 4 ranks, a global batch of 256, the ranks'
// gradients averaged and applied by one optimizer.
func TestTraining(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		opt  interface{ step(params, grad []float32) }
	}{
		{"Adam lr=0.01", &adam{lr: 0.01}},
		{"SGD lr=0.5", sgd{lr: 0.5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // sharing the Problem between goroutines is also under test here
			const ranks, steps = 4, 50
			p := defaultProblem()
			var models [ranks]*Model
			for r := range models {
				models[r] = NewModel(p)
			}
			params := p.InitParams(1)
			grad, mean := make([]float32, p.NumParams()), make([]float32, p.NumParams())
			loss0, acc0 := models[0].Evaluate(params)
			var trainLoss [steps]float32
			for step := range steps {
				clear(mean)
				for r, m := range models {
					trainLoss[step] += m.Gradient(params, r, ranks, int64(step), grad) / ranks
					for i, g := range grad {
						mean[i] += g / ranks
					}
				}
				c.opt.step(params, mean)
				if step == 9 {
					loss, acc := models[0].Evaluate(params)
					t.Logf("step 10: test loss %.3f, accuracy %.3f", loss, acc)
				}
			}
			loss, acc := models[0].Evaluate(params)
			t.Logf("step 0: test loss %.3f, accuracy %.3f; step %d: test loss %.3f, accuracy %.3f",
				loss0, acc0, steps, loss, acc)
			if acc < acc0+0.3 {
				t.Errorf("accuracy went from %.3f to %.3f in %d steps, want a gain above 0.3", acc0, acc, steps)
			}
			if loss >= loss0 {
				t.Errorf("test loss went from %.3f to %.3f", loss0, loss)
			}
			first, last := mean32(trainLoss[:5]), mean32(trainLoss[steps-5:])
			if last >= first {
				t.Errorf("training loss went from %.3f to %.3f", first, last)
			}
		})
	}
}

func mean32(v []float32) float32 {
	var s float32
	for _, x := range v {
		s += x
	}
	return s / float32(len(v))
}

func BenchmarkGradient(b *testing.B) {
	cfg := DefaultConfig()
	p := NewProblem(cfg)
	for _, ranks := range []int{1, 4} {
		b.Run(fmt.Sprintf("Batch=%d", cfg.BatchSize/ranks), func(b *testing.B) {
			m := NewModel(p)
			params, grad := p.InitParams(0), make([]float32, p.NumParams())
			b.ReportAllocs()
			step := int64(0)
			for b.Loop() {
				m.Gradient(params, 0, ranks, step, grad)
				step++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(cfg.BatchSize/ranks), "ns/example")
		})
	}
}

func BenchmarkEvaluate(b *testing.B) {
	p := defaultProblem()
	m := NewModel(p)
	params := p.InitParams(0)
	b.ReportAllocs()
	for b.Loop() {
		m.Evaluate(params)
	}
}

func BenchmarkNewProblem(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		NewProblem(DefaultConfig())
	}
}
