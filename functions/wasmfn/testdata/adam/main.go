// Command adam is Adam with fanin's built-in arithmetic (functions/doc.go), written as a user
// function with two state vectors: the tests compare it bit for bit with the built-in "adam".
package main

import (
	"math"

	"github.com/fanin-ml/fanin/functions/guest"
)

func init() {
	guest.Register(guest.Function{
		Doc:   "Adam, PyTorch semantics, L2 weight decay",
		State: []string{"m", "v"},
		Hyper: []guest.Hyper{
			{Name: "lr", Default: 0.001, Range: "> 0"},
			{Name: "beta1", Default: 0.9, Range: "[0, 1)"},
			{Name: "beta2", Default: 0.999, Range: "[0, 1)"},
			{Name: "eps", Default: 1e-8, Range: "> 0"},
			{Name: "weight_decay", Range: ">= 0"},
		},
		Apply: apply,
	})
}

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

func apply(u *guest.Update) error {
	h := u.Hyper
	b1, b2 := h.Get("beta1"), h.Get("beta2")
	f1, f2 := float32(b1), float32(b2)
	omb1, omb2 := float32(1-b1), float32(1-b2)
	eps, wd := float32(h.Get("eps")), float32(h.Get("weight_decay"))
	bc1, bc2 := 1-powInt(b1, u.Step), 1-powInt(b2, u.Step)
	sqrtBC2, step := float32(math.Sqrt(bc2)), float32(h.Get("lr")/bc1)
	s := float32(1 / u.WeightSum)
	p, g, m, v := u.Params, u.Grad, u.State[0], u.State[1]
	for i := range p {
		gi := float32(g[i] * s)
		if wd != 0 {
			gi += float32(wd * p[i])
		}
		mi := float32(f1*m[i]) + float32(omb1*gi)
		vi := float32(f2*v[i]) + float32(omb2*float32(gi*gi))
		m[i], v[i] = mi, vi
		denom := float32(float32(math.Sqrt(float64(vi)))/sqrtBC2) + eps
		p[i] -= float32(step * float32(mi/denom))
	}
	return nil
}

func main() {}
