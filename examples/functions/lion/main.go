// Command lion is the Lion optimizer (Chen et al., 2023, "Symbolic Discovery of Optimization
// Algorithms") as a fanin user function. Build it with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o lion.wasm .
//
// and upload it with `fanin functions push lion.wasm --name lion --version 1`.
package main

import "github.com/fanin-ml/fanin/functions/guest"

// function is what the module registers; the tests also run it natively.
var function = guest.Function{
	Doc:   "Lion: p -= lr*(sign(b1*m + (1-b1)*g) + weight_decay*p); m = b2*m + (1-b2)*g",
	State: []string{"m"},
	Hyper: []guest.Hyper{
		{Name: "lr", Default: 1e-4, Range: "> 0", Doc: "learning rate"},
		{Name: "beta1", Default: 0.9, Range: "[0, 1)", Doc: "interpolation of the update"},
		{Name: "beta2", Default: 0.99, Range: "[0, 1)", Doc: "decay of the momentum"},
		{Name: "weight_decay", Default: 0, Range: ">= 0", Doc: "decoupled weight decay"},
	},
	Apply: apply,
}

func init() { guest.Register(function) }

// apply is written with an explicit float32 conversion around every product, so that no
// compiler fuses a multiply-add and every platform computes the same bits.
func apply(u *guest.Update) error {
	h := u.Hyper
	lr, wd := float32(h.Get("lr")), float32(h.Get("weight_decay"))
	b1, b2 := h.Get("beta1"), h.Get("beta2")
	f1, f2 := float32(b1), float32(b2)
	omb1, omb2 := float32(1-b1), float32(1-b2)
	s := float32(1 / u.WeightSum) // the mean gradient
	p, g, m := u.Params, u.Grad[:len(u.Params)], u.State[0][:len(u.Params)]
	for i := range p {
		gi, mi, pi := float32(g[i]*s), m[i], p[i]
		c := float32(f1*mi) + float32(omb1*gi)
		var sign float32
		switch {
		case c > 0:
			sign = 1
		case c < 0:
			sign = -1
		}
		p[i] = pi - float32(lr*(sign+float32(wd*pi)))
		m[i] = float32(f2*mi) + float32(omb2*gi)
	}
	return nil
}

func main() {}
