// Command fedadam is the FedAdam server step (Reddi et al., 2021, "Adaptive Federated
// Optimization") as a fanin user function: each rank is a client that sends its model delta
// (local model minus the global one) weighted by its sample count, and the server moves the
// global model along the weighted mean delta with Adam's moments. Build it with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o fedadam.wasm .
package main

import (
	"math"

	"github.com/fanin-ml/fanin/functions/guest"
)

// function is what the module registers; the tests also run it natively.
var function = guest.Function{
	Doc:      "FedAdam server step: d = weighted mean delta; m = b1*m + (1-b1)*d; v = b2*v + (1-b2)*d*d; p += lr*m/(sqrt(v)+tau)",
	State:    []string{"m", "v"},
	Weighted: true,
	Hyper: []guest.Hyper{
		{Name: "lr", Default: 0.01, Range: "> 0", Doc: "server learning rate"},
		{Name: "beta1", Default: 0.9, Range: "[0, 1)"},
		{Name: "beta2", Default: 0.99, Range: "[0, 1)"},
		{Name: "tau", Default: 1e-3, Range: "> 0", Doc: "adaptivity: added to sqrt(v)"},
	},
	Apply: apply,
}

func init() { guest.Register(function) }

func apply(u *guest.Update) error {
	h := u.Hyper
	lr, tau := float32(h.Get("lr")), float32(h.Get("tau"))
	b1, b2 := h.Get("beta1"), h.Get("beta2")
	f1, f2 := float32(b1), float32(b2)
	omb1, omb2 := float32(1-b1), float32(1-b2)
	s := float32(1 / u.WeightSum)
	p, g := u.Params, u.Grad[:len(u.Params)]
	m, v := u.State[0][:len(p)], u.State[1][:len(p)]
	for i := range p {
		d := float32(g[i] * s)
		mi := float32(f1*m[i]) + float32(omb1*d)
		vi := float32(f2*v[i]) + float32(omb2*float32(d*d))
		m[i], v[i] = mi, vi
		p[i] += float32(lr * float32(mi/(float32(math.Sqrt(float64(vi)))+tau)))
	}
	return nil
}

func main() {}
