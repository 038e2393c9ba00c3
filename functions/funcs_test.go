package functions

import (
	"math"
	"testing"
)

// The test inputs: two ranks, four elements, three steps. The first three elements are dyadic,
// so that the hand computations below are exact; the fourth (0.1, 0.2, ...) exercises rounding.
//
//	step 1: rank0 [1, 2, -3, 0.1]   rank1 [3, -2, 1, 0.2]   Grad [4, 0, -2, 0.3]   g = Grad/2 = [2, 0, -1, .]
//	step 2: rank0 [0.5, 1, 2, -0.3] rank1 [-1.5, 3, 0, 0.7] Grad [-1, 4, 2, 0.4]   g = [-0.5, 2, 1, .]
//	step 3: rank0 [2, 2, 2, 1e-3]   rank1 [2, -2, 0, 5]     Grad [4, 0, 2, 5.001]  g = [2, 0, 1, .]
//
// The initial parameters are [1, -2, 0.5, 3].
var (
	testRank0 = [][]float32{{1, 2, -3, 0.1}, {0.5, 1, 2, -0.3}, {2, 2, 2, 1e-3}}
	testRank1 = [][]float32{{3, -2, 1, 0.2}, {-1.5, 3, 0, 0.7}, {2, -2, 0, 5}}
	testInit  = []float32{1, -2, 0.5, 3}
)

// drive applies fn for three steps to the first k elements of the test inputs, summing the two
// ranks itself (weighted by w when w != nil), and returns the parameters after each step.
func drive(t *testing.T, fn Func, k int, w []float64) [][]float32 {
	t.Helper()
	p := append([]float32(nil), testInit[:k]...)
	state := make([][]float32, fn.Slots())
	for i := range state {
		state[i] = make([]float32, k)
	}
	fn.InitState(state)
	var out [][]float32
	for step := range 3 {
		grad := make([]float32, k)
		ws := 2.0
		for i := range k {
			if w == nil {
				grad[i] = testRank0[step][i] + testRank1[step][i]
			} else {
				grad[i] = float32(float32(w[0])*testRank0[step][i]) + float32(float32(w[1])*testRank1[step][i])
			}
		}
		if w != nil {
			ws = w[0] + w[1]
		}
		fn.Apply(&Update{Params: p, Grad: grad, State: state, Step: int64(step + 1), Ranks: 2, WeightSum: ws})
		out = append(out, append([]float32(nil), p...))
	}
	return out
}

func mustNew(t testing.TB, name string, hyper map[string]float64) Func {
	t.Helper()
	fn, err := New(name, hyper)
	if err != nil {
		t.Fatal(err)
	}
	return fn
}

// sameBits fails unless got and want are the same float32s bit for bit.
func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: len %d, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s[%d] = %v (%#08x), want %v (%#08x)", what, i, got[i], math.Float32bits(got[i]),
				want[i], math.Float32bits(want[i]))
		}
	}
}

func checkSteps(t *testing.T, fn Func, k int, w []float64, want [][]float32) {
	t.Helper()
	got := drive(t, fn, k, w)
	for s := range want {
		sameBits(t, fn.Name()+" step "+string(rune('1'+s)), got[s], want[s])
	}
}

// Hand-computed, exact (dyadic) expectations on the first three elements.
func TestHandComputed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		hyper map[string]float64
		want  [][]float32
	}{
		// p = Grad.
		{"sum", nil, [][]float32{{4, 0, -2}, {-1, 4, 2}, {4, 0, 2}}},
		// p = Grad/2.
		{"mean", nil, [][]float32{{2, 0, -1}, {-0.5, 2, 1}, {2, 0, 1}}},
		// p -= 0.5*g: [1-1, -2-0, 0.5+0.5]; [0+0.25, -2-1, 1-0.5]; [0.25-1, -3-0, 0.5-0.5].
		{"sgd", map[string]float64{"lr": 0.5}, [][]float32{{0, -2, 1}, {0.25, -3, 0.5}, {-0.75, -3, 0}}},
		// d = g + 0.5p; p -= 0.5d.
		// 1: d = [2.5, -1, -0.75]            p = [1-1.25, -2+0.5, 0.5+0.375]          = [-0.25, -1.5, 0.875]
		// 2: d = [-0.625, 1.25, 1.4375]      p = [-0.25+0.3125, -1.5-0.625, 0.875-0.71875] = [0.0625, -2.125, 0.15625]
		// 3: d = [2.03125, -1.0625, 1.078125] p = [0.0625-1.015625, -2.125+0.53125, 0.15625-0.5390625]
		{"sgd", map[string]float64{"lr": 0.5, "weight_decay": 0.5},
			[][]float32{{-0.25, -1.5, 0.875}, {0.0625, -2.125, 0.15625}, {-0.953125, -1.59375, -0.3828125}}},
		// v = g at step 1, then v = 0.5v + g; p -= 0.5v.
		// 1: v = [2, 0, -1]        p = [0, -2, 1]
		// 2: v = [0.5, 2, 0.5]     p = [-0.25, -3, 0.75]
		// 3: v = [2.25, 1, 1.25]   p = [-1.375, -3.5, 0.125]
		{"momentum", map[string]float64{"lr": 0.5, "momentum": 0.5},
			[][]float32{{0, -2, 1}, {-0.25, -3, 0.75}, {-1.375, -3.5, 0.125}}},
		// Dampening 0.5: v = g at step 1 (PyTorch clones, no dampening), then v = 0.5v + 0.5g.
		// 1: v = [2, 0, -1]          p = [0, -2, 1]
		// 2: v = [0.75, 1, 0]        p = [-0.375, -2.5, 1]
		// 3: v = [1.375, 0.5, 0.5]   p = [-1.0625, -2.75, 0.75]
		{"momentum", map[string]float64{"lr": 0.5, "momentum": 0.5, "dampening": 0.5},
			[][]float32{{0, -2, 1}, {-0.375, -2.5, 1}, {-1.0625, -2.75, 0.75}}},
		// Same v as undamped momentum; d = g + 0.5v; p -= 0.5d.
		// 1: d = [3, 0, -1.5]          p = [-0.5, -2, 1.25]
		// 2: d = [-0.25, 3, 1.25]      p = [-0.375, -3.5, 0.625]
		// 3: d = [3.125, 0.5, 1.625]   p = [-1.9375, -3.75, -0.1875]
		{"nesterov", map[string]float64{"lr": 0.5, "momentum": 0.5},
			[][]float32{{-0.5, -2, 1.25}, {-0.375, -3.5, 0.625}, {-1.9375, -3.75, -0.1875}}},
		{"momentum", map[string]float64{"lr": 0.5, "momentum": 0.5, "nesterov": 1},
			[][]float32{{-0.5, -2, 1.25}, {-0.375, -3.5, 0.625}, {-1.9375, -3.75, -0.1875}}},
	}
	for _, c := range cases {
		checkSteps(t, mustNew(t, c.name, c.hyper), 3, nil, c.want)
	}
}

// Expectations computed by rounding to float32 after every float64 operation (which equals
// float32 arithmetic for + - * / sqrt), in an independent program written from the package doc;
// printed as the shortest decimal that rounds to the same float32.
func TestRounded(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		hyper   map[string]float64
		weights []float64
		want    [][]float32
	}{
		// Step 1, element 0: g = 2, d = 2 + float32(0.01)*1 = 2.01, p = 1 - 0.1*2.01 = 0.799.
		{"sgd", map[string]float64{"lr": 0.1, "weight_decay": 0.01}, nil, [][]float32{
			{0.799, -1.998, 0.5995, 2.982},
			{0.84820104, -2.196002, 0.4989005, 2.9590182},
			{0.6473528, -2.193806, 0.3984016, 2.7060091}}},
		{"momentum", map[string]float64{"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}, nil, [][]float32{
			{0.799, -1.998, 0.5995, 2.982},
			{0.66238093, -2.1744018, 0.59851044, 2.9451163},
			{0.35882762, -2.3312063, 0.5070812, 2.6842253}}},
		// Step 1, element 0: d = 2.01, v = d, d + 0.9v = 3.819, p = 1 - 0.3819 = 0.6181.
		{"nesterov", map[string]float64{"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}, nil, [][]float32{
			{0.61810005, -1.9962, 0.68905, 2.9658},
			{0.54911566, -2.3707871, 0.5783358, 2.9075851},
			{0.06154269, -2.5252078, 0.37821436, 2.3952415}}},
		// Step 1: m/bc1 = g, sqrt(v/bc2) = |g|, so p = p - 0.001*g/(|g|+1e-8) = p - 0.001*sign(g):
		// element 0: 1 - 0.001 = 0.999; element 1 (g = 0): -2 exactly.
		{"adam", nil, nil, [][]float32{
			{0.999, -2, 0.501, 2.999},
			{0.99853057, -2.000744, 0.50094736, 2.9980028},
			{0.9978252, -2.0013194, 0.50054514, 2.9972904}}},
		// Step 1: g = g + 0.1p, then as above p = p - 0.1*sign(g): [0.9, -1.9, 0.6, 2.9].
		{"adam", map[string]float64{"lr": 0.1, "weight_decay": 0.1}, nil, [][]float32{
			{0.90000004, -1.9, 0.59999996, 2.9},
			{0.8485031, -1.9666084, 0.5892805, 2.7998688},
			{0.7754023, -2.0109365, 0.5444866, 2.7197397}}},
		// Step 1: p = p*(1 - 0.1*0.01) - 0.1*sign(g): element 0: 0.999 - 0.1 = 0.899; element 1: -1.998.
		{"adamw", map[string]float64{"lr": 0.1}, nil, [][]float32{
			{0.89900005, -1.998, 0.5995, 2.897},
			{0.8511542, -2.0704157, 0.59363735, 2.7943707},
			{0.779765, -2.1258674, 0.55282235, 2.7203472}}},
		// Step 1, element 0: s = 0.1 + 4, p = 1 - 0.1*2/sqrt(4.1) = 0.90122706; element 1: g = 0, p = -2.
		{"adagrad", map[string]float64{"lr": 0.1, "initial_accumulator": 0.1}, nil, [][]float32{
			{0.90122706, -2, 0.5953463, 2.9571428},
			{0.9252002, -2.098773, 0.5263397, 2.9075289},
			{0.85598737, -2.098773, 0.46954352, 2.8088036}}},
		// Step 1: g = g + 0.1p, s = g*g, p = p - 0.1*g/|g| = p - 0.1*sign(g).
		{"adagrad", map[string]float64{"lr": 0.1, "weight_decay": 0.1}, nil, [][]float32{
			{0.9, -1.9, 0.6, 2.9},
			{0.919162, -1.999395, 0.52553105, 2.826347},
			{0.84925336, -1.988481, 0.4660749, 2.7290874}}},
		// Step 1, element 0: (2*1 + 1*3) * float32(1/3) = 5/3.
		{"fedavg", nil, []float64{2, 1}, [][]float32{
			{1.6666667, 0.6666667, -1.6666667, 0.13333334},
			{-0.16666667, 1.6666667, 1.3333334, 0.033333324},
			{2, 0.6666667, 1.3333334, 1.6673334}}},
	}
	for _, c := range cases {
		checkSteps(t, mustNew(t, c.name, c.hyper), 4, c.weights, c.want)
	}
}

// An exact Adam step: lr 0.5, beta1 0.5, beta2 0.75, eps 2, g = 2 (element 0), g = 0 (element 1):
// m = 0.5*2 = 1, v = 0.25*4 = 1, bc1 = 0.5, bc2 = 0.25, lr/bc1 = 1, sqrt(bc2) = 0.5,
// denom = 1/0.5 + 2 = 4, p = 1 - 1*(1/4) = 0.75; with g = 0: m = 0, p = -2.
func TestAdamExactStep(t *testing.T) {
	t.Parallel()
	fn := mustNew(t, "adam", map[string]float64{"lr": 0.5, "beta1": 0.5, "beta2": 0.75, "eps": 2})
	p := []float32{1, -2}
	m, v := make([]float32, 2), make([]float32, 2)
	fn.Apply(&Update{Params: p, Grad: []float32{4, 0}, State: [][]float32{m, v}, Step: 1, Ranks: 2, WeightSum: 2})
	sameBits(t, "p", p, []float32{0.75, -2})
	sameBits(t, "m", m, []float32{1, 0})
	sameBits(t, "v", v, []float32{1, 0})
}

// mirrorAdam is a second, straightforward transcription of the Adam/AdamW formulas.
// b^t is computed by repeated multiplication, equal to binary exponentiation for t <= 3.
func mirrorAdam(p, g, m, v []float32, t int, lr, b1, b2, eps, wd float64, decoupled bool) {
	pow := func(b float64) float64 {
		r := 1.0
		for range t {
			r = float64(r * b)
		}
		return r
	}
	stepSize := float32(lr / (1 - pow(b1)))
	sqrtBC2 := float32(math.Sqrt(1 - pow(b2)))
	for i := range p {
		gi := g[i]
		if decoupled {
			p[i] = float32(p[i] * float32(1-float64(lr*wd)))
		} else if wd != 0 {
			gi = gi + float32(float32(wd)*p[i])
		}
		m[i] = float32(float32(b1)*m[i]) + float32(float32(1-b1)*gi)
		v[i] = float32(float32(b2)*v[i]) + float32(float32(1-b2)*float32(gi*gi))
		denom := float32(float32(math.Sqrt(float64(v[i])))/sqrtBC2) + float32(eps)
		p[i] = p[i] - float32(stepSize*float32(m[i]/denom))
	}
}

func TestAdamMirror(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name                string
		lr, b1, b2, eps, wd float64
	}{
		{"adam", 0.001, 0.9, 0.999, 1e-8, 0},
		{"adam", 0.01, 0.8, 0.99, 1e-6, 0.05},
		{"adamw", 0.001, 0.9, 0.999, 1e-8, 0.01},
		{"adamw", 0.1, 0.5, 0.9, 1e-3, 0.2},
	} {
		fn := mustNew(t, c.name, map[string]float64{"lr": c.lr, "beta1": c.b1, "beta2": c.b2, "eps": c.eps, "weight_decay": c.wd})
		got := drive(t, fn, 4, nil)
		p := append([]float32(nil), testInit...)
		m, v := make([]float32, 4), make([]float32, 4)
		for s := range 3 {
			g := make([]float32, 4)
			for i := range g {
				g[i] = float32((testRank0[s][i] + testRank1[s][i]) * 0.5)
			}
			mirrorAdam(p, g, m, v, s+1, c.lr, c.b1, c.b2, c.eps, c.wd, c.name == "adamw")
			sameBits(t, c.name, got[s], p)
		}
	}
}

// Clipping: Grad [3, 4] has norm 5; clip_norm 2.5 scales by float32(2.5/5) = 0.5.
func TestClip(t *testing.T) {
	t.Parallel()
	apply := func(name string, hyper map[string]float64, grad []float32, ws float64) []float32 {
		fn := mustNew(t, name, hyper)
		p := []float32{10, 20}
		state := make([][]float32, fn.Slots())
		for i := range state {
			state[i] = make([]float32, 2)
		}
		fn.Apply(&Update{Params: p, Grad: grad, State: state, Step: 1, Ranks: 2, WeightSum: ws})
		return p
	}
	sameBits(t, "sum clipped", apply("sum", map[string]float64{"clip_norm": 2.5}, []float32{3, 4}, 2), []float32{1.5, 2})
	// The norm equals clip_norm: no clipping (norm > clip_norm is required).
	sameBits(t, "sum at the norm", apply("sum", map[string]float64{"clip_norm": 5}, []float32{3, 4}, 2), []float32{3, 4})
	// mean clips the mean: g = [3, 4] from Grad [6, 8].
	sameBits(t, "mean clipped", apply("mean", map[string]float64{"clip_norm": 2.5}, []float32{6, 8}, 2), []float32{1.5, 2})
	// sgd: g = [1.5, 2] after clipping, p = [10 - 1.5, 20 - 2].
	sameBits(t, "sgd clipped", apply("sgd", map[string]float64{"lr": 1, "clip_norm": 2.5}, []float32{6, 8}, 2), []float32{8.5, 18})
	// fedavg clips the weighted mean: Grad [12, 16] / 4 = [3, 4].
	sameBits(t, "fedavg clipped", apply("fedavg", map[string]float64{"clip_norm": 2.5}, []float32{12, 16}, 4), []float32{1.5, 2})
	// A non-dyadic factor: norm sqrt(2), clip 1, c = float32(1/sqrt(2)), g = float32(1*c).
	c := float32(1 / math.Sqrt(2))
	sameBits(t, "sum sqrt2", apply("sum", map[string]float64{"clip_norm": 1}, []float32{1, -1}, 2), []float32{c, -c})
}

func TestInitState(t *testing.T) {
	t.Parallel()
	fn := mustNew(t, "adagrad", map[string]float64{"initial_accumulator": 0.25})
	s := [][]float32{{1, 2, 3}}
	fn.InitState(s)
	sameBits(t, "adagrad state", s[0], []float32{0.25, 0.25, 0.25})
	fn = mustNew(t, "adam", nil)
	s = [][]float32{{1, 2}, {3, 4}}
	fn.InitState(s)
	sameBits(t, "adam m", s[0], []float32{0, 0})
	sameBits(t, "adam v", s[1], []float32{0, 0})
}

func TestSlots(t *testing.T) {
	t.Parallel()
	want := map[string]int{"sum": 0, "mean": 0, "fedavg": 0, "sgd": 0, "momentum": 1, "nesterov": 1, "adagrad": 1, "adam": 2, "adamw": 2}
	for _, fi := range Describe() {
		fn := mustNew(t, fi.Name, withLR(fi, map[string]float64{}))
		if fn.Slots() != want[fi.Name] || fi.Slots != want[fi.Name] {
			t.Errorf("%s: Slots() = %d, Describe %d, want %d", fi.Name, fn.Slots(), fi.Slots, want[fi.Name])
		}
	}
}

func TestPowInt(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		x    float64
		n    int64
		want float64
	}{{0.5, 1, 0.5}, {0.5, 10, 1.0 / 1024}, {0.9, 2, 0.9 * 0.9}, {0, 5, 0}, {0.999, 1 << 40, 0}} {
		if got := powInt(c.x, c.n); got != c.want {
			t.Errorf("powInt(%v, %d) = %v, want %v", c.x, c.n, got, c.want)
		}
	}
}

func TestApplyPanicsOnMalformedUpdate(t *testing.T) {
	t.Parallel()
	fn := mustNew(t, "adam", nil)
	ok := func() *Update {
		return &Update{Params: make([]float32, 2), Grad: make([]float32, 2),
			State: [][]float32{make([]float32, 2), make([]float32, 2)}, Step: 1, Ranks: 1, WeightSum: 1}
	}
	for name, mutate := range map[string]func(u *Update){
		"grad length":  func(u *Update) { u.Grad = u.Grad[:1] },
		"state count":  func(u *Update) { u.State = u.State[:1] },
		"state length": func(u *Update) { u.State[1] = u.State[1][:1] },
		"step 0":       func(u *Update) { u.Step = 0 },
		"weight sum 0": func(u *Update) { u.WeightSum = 0 },
		"weight NaN":   func(u *Update) { u.WeightSum = math.NaN() },
	} {
		u := ok()
		mutate(u)
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			fn.Apply(u)
		}()
	}
	fn.Apply(ok()) // and the unmodified one is fine
}

// Not parallel: testing.AllocsPerRun counts the whole process's allocations.
func TestApplyDoesNotAllocate(t *testing.T) {
	for _, fi := range Describe() {
		for _, clip := range []float64{0, 1} {
			fn := mustNew(t, fi.Name, withLR(fi, map[string]float64{"clip_norm": clip}))
			u := &Update{Params: make([]float32, 100), Grad: make([]float32, 100), State: make([][]float32, fn.Slots()),
				Ranks: 2, WeightSum: 2}
			for i := range u.State {
				u.State[i] = make([]float32, 100)
			}
			if a := testing.AllocsPerRun(10, func() { u.Step++; fn.Apply(u) }); a != 0 {
				t.Errorf("%s clip %v: %v allocations per Apply", fi.Name, clip, a)
			}
		}
	}
}

// withLR adds lr = 0.1 to hyper when the function has a learning rate.
func withLR(fi FuncInfo, hyper map[string]float64) map[string]float64 {
	for _, h := range fi.Hyper {
		if h.Name == "lr" {
			hyper["lr"] = 0.1
		}
	}
	return hyper
}
