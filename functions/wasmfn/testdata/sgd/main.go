// Command sgd is plain SGD with fanin's built-in arithmetic (functions/doc.go), written as a
// user function: the tests compare it bit for bit with the built-in "sgd", and the kernel
// benchmark runs it against the built-in kernel.
package main

import "github.com/fanin-ml/fanin/functions/guest"

func init() {
	guest.Register(guest.Function{
		Doc: "SGD: p -= lr*(g/N + weight_decay*p)",
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
	// The loops take 8 elements a turn, written out, and reslice: Go unrolls no loop, and each
	// turn of a loop in its WebAssembly goes back through the function's dispatch (a br_table on
	// its resume point) and the engine's check for a call past its time limit; constant indexes
	// below len >= 8 need no bounds check. Same arithmetic, same order, same bits.
	if wd == 0 {
		for len(p) >= 8 && len(g) >= 8 {
			p[0] -= float32(lr * float32(g[0]*s))
			p[1] -= float32(lr * float32(g[1]*s))
			p[2] -= float32(lr * float32(g[2]*s))
			p[3] -= float32(lr * float32(g[3]*s))
			p[4] -= float32(lr * float32(g[4]*s))
			p[5] -= float32(lr * float32(g[5]*s))
			p[6] -= float32(lr * float32(g[6]*s))
			p[7] -= float32(lr * float32(g[7]*s))
			p, g = p[8:], g[8:]
		}
		for i := range p {
			p[i] -= float32(lr * float32(g[i]*s))
		}
		return nil
	}
	for len(p) >= 8 && len(g) >= 8 {
		p[0] -= float32(lr * (float32(g[0]*s) + float32(wd*p[0])))
		p[1] -= float32(lr * (float32(g[1]*s) + float32(wd*p[1])))
		p[2] -= float32(lr * (float32(g[2]*s) + float32(wd*p[2])))
		p[3] -= float32(lr * (float32(g[3]*s) + float32(wd*p[3])))
		p[4] -= float32(lr * (float32(g[4]*s) + float32(wd*p[4])))
		p[5] -= float32(lr * (float32(g[5]*s) + float32(wd*p[5])))
		p[6] -= float32(lr * (float32(g[6]*s) + float32(wd*p[6])))
		p[7] -= float32(lr * (float32(g[7]*s) + float32(wd*p[7])))
		p, g = p[8:], g[8:]
	}
	for i := range p {
		d := float32(g[i]*s) + float32(wd*p[i])
		p[i] -= float32(lr * d)
	}
	return nil
}

func main() {}
