package wasmbuild

import (
	"maps"
	"slices"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/functions/guest"
)

// Native runs a guest function's Go code natively, as a functions.Func, so that a test can
// compare a module's bits with the same code compiled for the host. hyper must give every
// declared hyper-parameter or take its default; it is not range-checked.
func Native(fn guest.Function, name string, hyper map[string]float64) functions.Func {
	names := make([]string, len(fn.Hyper))
	vals := make([]float64, len(fn.Hyper))
	full := map[string]float64{}
	for i, h := range fn.Hyper {
		names[i], vals[i] = h.Name, h.Default
		if v, ok := hyper[h.Name]; ok {
			vals[i] = v
		}
		full[h.Name] = vals[i]
	}
	return &native{fn: fn, name: name, vals: guest.ValuesOf(names, vals), hyper: full}
}

type native struct {
	fn    guest.Function
	name  string
	vals  guest.Values
	hyper map[string]float64
}

func (n *native) Name() string              { return n.name }
func (n *native) Slots() int                { return len(n.fn.State) }
func (n *native) Weighted() bool            { return n.fn.Weighted }
func (n *native) Hyper() map[string]float64 { return maps.Clone(n.hyper) }
func (n *native) Apply(u *functions.Update) {
	if err := n.TryApply(u); err != nil {
		panic(err)
	}
}
func (n *native) InitState(s [][]float32) {
	if err := n.TryInitState(s); err != nil {
		panic(err)
	}
}

func (n *native) TryInitState(s [][]float32) error {
	for _, v := range s {
		clear(v)
	}
	if n.fn.Init != nil {
		return n.fn.Init(s, n.vals)
	}
	return nil
}

// TryApply applies on copies, as the engine does, so that a failure changes nothing.
func (n *native) TryApply(u *functions.Update) error {
	p := slices.Clone(u.Params)
	st := make([][]float32, len(u.State))
	for i, s := range u.State {
		st[i] = slices.Clone(s)
	}
	g := &guest.Update{Params: p, Grad: slices.Clone(u.Grad), State: st, Step: u.Step, Ranks: u.Ranks,
		WeightSum: u.WeightSum, Hyper: n.vals}
	if err := n.fn.Apply(g); err != nil {
		return err
	}
	copy(u.Params, p)
	for i, s := range st {
		copy(u.State[i], s)
	}
	return nil
}
