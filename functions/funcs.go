package functions

import (
	"maps"
	"math"
	"strconv"
)

// Func is one configured aggregation function. Apply is called once per shard per step.
// A Func holds only its configuration, so one value may serve many shards and goroutines.
type Func interface {
	Name() string
	// Slots is the number of per-element float32 state vectors the function keeps
	// (sum, mean, fedavg, sgd 0; momentum, nesterov, adagrad 1; adam, adamw 2).
	Slots() int
	// InitState fills freshly allocated state vectors (zero, or e.g. adagrad's
	// initial_accumulator).
	InitState(state [][]float32)
	// Apply performs one update of one shard; see Update and the package doc for the exact
	// arithmetic. It does not allocate. It panics on a malformed Update (lengths that differ,
	// len(State) != Slots(), Step < 1, WeightSum not > 0): those are bugs of the caller.
	Apply(u *Update)
	// Hyper returns the validated hyper-parameters including defaults (for display /
	// persistence); New(Name(), Hyper()) configures an identical function.
	Hyper() map[string]float64
}

// Update is one application of a function to one shard.
type Update struct {
	Params    []float32   // in/out: the shard's parameters (for sum/mean/fedavg: the output aggregate, overwritten)
	Grad      []float32   // in: the rank-order (weighted) sum of the ranks' inputs; scratch: Apply may overwrite it
	State     [][]float32 // in/out: Slots() vectors, each len(Params)
	Step      int64       // 1-based step number (Adam's bias correction and momentum's first step use it)
	Ranks     int         // N, number of logical ranks summed
	WeightSum float64     // sum of the ranks' weights (FedAvg, see SumWeights); equals Ranks for unweighted functions
}

// base is what every function shares.
type base struct {
	name  string
	slots int
	hyper map[string]float64 // complete and validated; never modified after New
	clip  float64            // clip_norm, 0 = off
}

func (b *base) Name() string                { return b.name }
func (b *base) Slots() int                  { return b.slots }
func (b *base) Hyper() map[string]float64   { return maps.Clone(b.hyper) }
func (b *base) InitState(state [][]float32) { fill(state, 0) }

func fill(state [][]float32, v float32) {
	for _, s := range state {
		for i := range s {
			s[i] = v
		}
	}
}

// f32 returns a hyper-parameter rounded to float32, as the update loops use it.
func f32(b *base, key string) float32 { return float32(b.hyper[key]) }

func bad(b *base, key, reason string) *HyperError {
	return &HyperError{Func: b.name, Key: key, Reason: reason}
}

// prepare checks u and turns u.Grad into the gradient the function sees, up to a factor: on
// return g[i] = float32(u.Grad[i]*s). Without clipping it leaves u.Grad alone and returns the
// scale (1 for sum, float32(1/WeightSum) otherwise), so that the function can fuse the scaling
// into its own loop. With clipping it scales and clips u.Grad in place and returns 1 (x*1 == x
// exactly).
func (b *base) prepare(u *Update, mean bool) float32 {
	if len(u.Grad) != len(u.Params) {
		panic("functions: " + b.name + ": len(Grad) " + strconv.Itoa(len(u.Grad)) + " != len(Params) " + strconv.Itoa(len(u.Params)))
	}
	if len(u.State) != b.slots {
		panic("functions: " + b.name + ": len(State) " + strconv.Itoa(len(u.State)) + " != Slots() " + strconv.Itoa(b.slots))
	}
	for _, s := range u.State {
		if len(s) != len(u.Params) {
			panic("functions: " + b.name + ": state length " + strconv.Itoa(len(s)) + " != len(Params) " + strconv.Itoa(len(u.Params)))
		}
	}
	if u.Step < 1 {
		panic("functions: " + b.name + ": Step " + strconv.FormatInt(u.Step, 10) + " < 1")
	}
	if !(u.WeightSum > 0) {
		panic("functions: " + b.name + ": WeightSum " + strconv.FormatFloat(u.WeightSum, 'g', -1, 64) + " is not > 0")
	}
	s := float32(1)
	if mean {
		s = float32(1 / u.WeightSum)
	}
	if b.clip <= 0 {
		return s
	}
	g := u.Grad
	var sq float64
	for i, x := range g {
		x = float32(x * s)
		g[i] = x
		sq += float64(float64(x) * float64(x))
	}
	if norm := math.Sqrt(sq); norm > b.clip {
		c := float32(b.clip / norm)
		for i, x := range g {
			g[i] = float32(x * c)
		}
	}
	return 1
}

func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }

// powInt returns x^n for n >= 1 by binary exponentiation (multiplications only, in a fixed
// order), so that Adam's bias corrections are the same bits on every platform and Go version.
func powInt(x float64, n int64) float64 {
	r := 1.0
	for ; n > 0; n >>= 1 {
		if n&1 == 1 {
			r = float64(r * x)
		}
		x = float64(x * x)
	}
	return r
}

// The update loops below are written for speed without changing a bit of the arithmetic:
//   - each loop has no branch: optional terms (L2 weight decay, AdamW's decay, momentum's first
//     step) are separate passes or separate loops, since the compiler does not unswitch loops;
//     a pass that computes g[i] + wd*p[i] into Grad (which is scratch) performs the very same
//     float32 operations, in the same order per element, as doing it inside the loop;
//   - each iteration loads all its inputs before its first store: parameters and state are
//     separate large allocations, often at the same address modulo 4 KiB, and a load issued
//     after a store to the same page offset can be stalled as if it depended on it.

// sumFunc: p = Grad (clipped).
type sumFunc struct{ base }

func (f *sumFunc) Apply(u *Update) {
	f.prepare(u, false)
	copy(u.Params, u.Grad)
}

// meanFunc is mean and fedavg: p = Grad/WeightSum (clipped). They differ only in how the caller
// sums and what WeightSum is.
type meanFunc struct{ base }

func (f *meanFunc) Apply(u *Update) {
	s := f.prepare(u, true)
	Scale(u.Params, s, u.Grad) // p[i] = float32(s*g[i])
}

type sgd struct {
	base
	lr, wd float32
}

func newSGD(b base) *sgd {
	return &sgd{base: b, lr: f32(&b, "lr"), wd: f32(&b, "weight_decay")}
}

func (f *sgd) Apply(u *Update) {
	k := applyConsts{adam: adamConsts{s: f.prepare(u, true)}}
	f.block(u, &k, 0, len(u.Params))
}

func (f *sgd) begin(u *Update, k *applyConsts) bool {
	if f.clip > 0 {
		return false
	}
	k.adam.s = f.prepare(u, true)
	return true
}

func (f *sgd) block(u *Update, k *applyConsts, lo, hi int) {
	p, g := u.Params[lo:hi], u.Grad[lo:hi]
	if f.wd == 0 {
		sgdLoop(p, g, k.adam.s, f.lr)
	} else {
		sgdWDLoop(p, g, k.adam.s, f.lr, f.wd)
	}
}

type momentum struct {
	base
	lr, mu, damp1, wd float32 // damp1 = float32(1 - dampening)
	nesterov          bool
}

func newMomentum(b base, nesterov bool) (*momentum, error) {
	if nesterov && b.hyper["momentum"] == 0 {
		return nil, bad(&b, "momentum", "must be > 0 with Nesterov momentum, got 0")
	}
	if d := b.hyper["dampening"]; nesterov && d != 0 {
		return nil, bad(&b, "dampening", "must be 0 with Nesterov momentum, got "+strconv.FormatFloat(d, 'g', -1, 64))
	}
	return &momentum{base: b, lr: f32(&b, "lr"), mu: f32(&b, "momentum"),
		damp1: float32(1 - b.hyper["dampening"]), wd: f32(&b, "weight_decay"), nesterov: nesterov}, nil
}

func (f *momentum) Apply(u *Update) {
	k := applyConsts{adam: adamConsts{s: f.prepare(u, true)}}
	f.block(u, &k, 0, len(u.Params))
}

func (f *momentum) begin(u *Update, k *applyConsts) bool {
	if f.clip > 0 {
		return false
	}
	k.adam.s = f.prepare(u, true)
	return true
}

func (f *momentum) block(u *Update, k *applyConsts, lo, hi int) {
	p, g, v := u.Params[lo:hi], u.Grad[lo:hi], u.State[0][lo:hi]
	lr, mu, damp1, s := f.lr, f.mu, f.damp1, k.adam.s
	if f.wd != 0 {
		addDecay(g, s, f.wd, p)
		s = 1
	}
	mode := 0 // momentumAVX's: 0 plain, 1 Nesterov, 2 and 3 the same at step 1
	if f.nesterov {
		mode = 1
	}
	if u.Step == 1 {
		mode += 2
	}
	if n := len(p) &^ 7; useSIMD && n > 0 {
		c := [4]float32{s, mu, damp1, lr}
		momentumAVX(&p[0], &g[0], &v[0], n, &c, mode)
		p, g, v = p[n:], g[n:], v[n:]
	}
	switch {
	case u.Step == 1: // v = d: PyTorch starts the buffer with a copy of the first d
		for i := range p {
			pi, d := p[i], float32(g[i]*s)
			v[i] = d
			if f.nesterov {
				d += float32(mu * d)
			}
			p[i] = pi - float32(lr*d)
		}
	case f.nesterov:
		for i := range p {
			pi, d, vi := p[i], float32(g[i]*s), v[i]
			vi = float32(mu*vi) + float32(damp1*d)
			d += float32(mu * vi)
			v[i] = vi
			p[i] = pi - float32(lr*d)
		}
	default:
		for i := range p {
			pi, d, vi := p[i], float32(g[i]*s), v[i]
			vi = float32(mu*vi) + float32(damp1*d)
			v[i] = vi
			p[i] = pi - float32(lr*vi)
		}
	}
}

type adam struct {
	base
	lr64        float64
	wd          float32 // L2 (adam); 0 for adamw, whose weight decay is decay
	b1, b2, eps float32
	omb1, omb2  float32 // float32(1 - beta)
	decay       float32 // adamw: float32(1 - lr*weight_decay)
	decoupled   bool
}

func newAdam(b base, decoupled bool) *adam {
	h := b.hyper
	f := &adam{base: b, lr64: h["lr"], b1: f32(&b, "beta1"), b2: f32(&b, "beta2"), eps: f32(&b, "eps"),
		omb1: float32(1 - h["beta1"]), omb2: float32(1 - h["beta2"]), decay: 1, decoupled: decoupled}
	if decoupled {
		f.decay = float32(1 - float64(h["lr"]*h["weight_decay"]))
	} else {
		f.wd = f32(&b, "weight_decay")
	}
	return f
}

func (f *adam) Apply(u *Update) {
	var k applyConsts
	f.consts(u, f.prepare(u, true), &k)
	f.block(u, &k, 0, len(u.Params))
}

func (f *adam) begin(u *Update, k *applyConsts) bool {
	if f.clip > 0 {
		return false
	}
	f.consts(u, f.prepare(u, true), k)
	return true
}

// consts sets the constants of step u.Step, s being prepare's scale.
func (f *adam) consts(u *Update, s float32, k *applyConsts) {
	bc1 := 1 - powInt(f.hyper["beta1"], u.Step)
	bc2 := 1 - powInt(f.hyper["beta2"], u.Step)
	k.adam = adamConsts{s: s, b1: f.b1, b2: f.b2, omb1: f.omb1, omb2: f.omb2, eps: f.eps,
		sqrtBC2: float32(math.Sqrt(bc2)), step: float32(f.lr64 / bc1)}
}

// block updates elements lo..hi-1: AdamW's decay or the L2 term first (a pass over the block),
// then the moments and the parameters.
func (f *adam) block(u *Update, k *applyConsts, lo, hi int) {
	p, g := u.Params[lo:hi], u.Grad[lo:hi]
	m, v := u.State[0][lo:hi], u.State[1][lo:hi]
	c := k.adam
	if f.decoupled {
		scaleLoop(p, f.decay)
	} else if f.wd != 0 {
		addDecay(g, c.s, f.wd, p)
		c.s = 1
	}
	adamLoop(p, g, m, v, &c)
}

type adagrad struct {
	base
	lr, eps, wd, init float32
}

func newAdagrad(b base) *adagrad {
	return &adagrad{base: b, lr: f32(&b, "lr"), eps: f32(&b, "eps"), wd: f32(&b, "weight_decay"),
		init: f32(&b, "initial_accumulator")}
}

func (f *adagrad) InitState(state [][]float32) { fill(state, f.init) }

func (f *adagrad) Apply(u *Update) {
	k := applyConsts{adam: adamConsts{s: f.prepare(u, true)}}
	f.block(u, &k, 0, len(u.Params))
}

func (f *adagrad) begin(u *Update, k *applyConsts) bool {
	if f.clip > 0 {
		return false
	}
	k.adam.s = f.prepare(u, true)
	return true
}

func (f *adagrad) block(u *Update, k *applyConsts, lo, hi int) {
	p, g, acc := u.Params[lo:hi], u.Grad[lo:hi], u.State[0][lo:hi]
	lr, eps, s := f.lr, f.eps, k.adam.s
	if f.wd != 0 {
		addDecay(g, s, f.wd, p)
		s = 1
	}
	if n := len(p) &^ 7; useSIMD && n > 0 {
		c := [4]float32{s, lr, eps, 0}
		adagradAVX(&p[0], &g[0], &acc[0], n, &c)
		p, g, acc = p[n:], g[n:], acc[n:]
	}
	for i := range p {
		pi, gi, si := p[i], float32(g[i]*s), acc[i]
		si += float32(gi * gi)
		acc[i] = si
		p[i] = pi - float32(lr*float32(gi/(sqrt32(si)+eps)))
	}
}
