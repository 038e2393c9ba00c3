// Command sgdloop is testdata/sgd written the plain way, one element a loop turn: the kernel
// benchmark runs both in the same rounds, so that what the unrolled loop gains is measured, not
// remembered. Same arithmetic, same bits.
package main

import "github.com/fanin-ml/fanin/functions/guest"

func init() {
	guest.Register(guest.Function{
		Doc: "SGD: p -= lr*(g/N + weight_decay*p), one element a loop turn",
		Hyper: []guest.Hyper{
			{Name: "lr", Required: true, Range: "> 0", Doc: "learning rate"},
			{Name: "weight_decay", Range: ">= 0", Doc: "L2 penalty"},
		},
		Apply: apply,
	})
}

func apply(u *guest.Update) error {
	lr, wd := float32(u.Hyper.Get("lr")), float32(u.Hyper.Get("weight_decay"))
	s := float32(1 / u.WeightSum)
	p, g := u.Params, u.Grad[:len(u.Params)]
	if wd == 0 {
		for i := range p {
			p[i] -= float32(lr * float32(g[i]*s))
		}
		return nil
	}
	for i := range p {
		d := float32(g[i]*s) + float32(wd*p[i])
		p[i] -= float32(lr * d)
	}
	return nil
}

func main() {}
