package functions

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// ErrUnknownFunction is wrapped by the error New returns for a name not in the registry.
var ErrUnknownFunction = errors.New("unknown function")

// ErrBadHyper is wrapped by every hyper-parameter error New returns (see HyperError).
var ErrBadHyper = errors.New("bad hyper-parameter")

// HyperError reports one invalid hyper-parameter. errors.Is(err, ErrBadHyper) holds.
type HyperError struct {
	Func   string   // the function's name
	Key    string   // the hyper-parameter
	Reason string   // e.g. "required", "must be in [0, 1), got 1.5"
	Known  []string // set when Key is unknown: the function's hyper-parameters, sorted
}

func (e *HyperError) Error() string {
	if e.Known != nil {
		return fmt.Sprintf("%s: unknown hyper-parameter %q (known: %s)", e.Func, e.Key, strings.Join(e.Known, ", "))
	}
	return e.Func + ": " + e.Key + ": " + e.Reason
}

func (e *HyperError) Unwrap() error { return ErrBadHyper }

type unknownFunctionError struct{ name string }

func (e *unknownFunctionError) Error() string {
	return fmt.Sprintf("unknown function %q (known: %s)", e.name, strings.Join(names(), ", "))
}

func (e *unknownFunctionError) Unwrap() error { return ErrUnknownFunction }

// FuncInfo describes one function for the API and the docs.
type FuncInfo struct {
	Name     string      `json:"name"`
	Doc      string      `json:"doc"`
	Slots    int         `json:"slots"`    // per-element float32 state vectors
	Weighted bool        `json:"weighted"` // ranks weighted by a per-rank weight (see Weighted)
	Hyper    []HyperInfo `json:"hyper"`
}

// HyperInfo describes one hyper-parameter.
type HyperInfo struct {
	Name     string  `json:"name"`
	Default  float64 `json:"default"` // meaningless when Required
	Required bool    `json:"required"`
	Range    string  `json:"range"` // e.g. "> 0", ">= 0", "in [0, 1)", "0 or 1"
	Doc      string  `json:"doc"`
}

// bound is a hyper-parameter's allowed range: its text and its test. NaN and ±Inf never pass.
type bound struct {
	text string
	ok   func(float64) bool
}

var (
	positive    = bound{"> 0", func(x float64) bool { return x > 0 }}
	nonNegative = bound{">= 0", func(x float64) bool { return x >= 0 }}
	unit        = bound{"in [0, 1)", func(x float64) bool { return x >= 0 && x < 1 }}
	boolean     = bound{"0 or 1", func(x float64) bool { return x == 0 || x == 1 }}
)

type hyperSpec struct {
	name     string
	def      float64
	required bool
	bound    bound
	// rangeText, when set, is the range Describe gives instead of bound's text: the range the
	// function accepts when it is narrower than bound's and build checks the rest.
	rangeText string
	doc       string
}

// funcSpec is one registry entry. build gets the complete, range-checked hyper-parameters and
// checks what involves more than one of them.
type funcSpec struct {
	name     string
	doc      string
	slots    int
	weighted bool
	hyper    []hyperSpec
	build    func(b base) (Func, error)
}

func lr(def float64) hyperSpec {
	return hyperSpec{name: "lr", def: def, bound: positive, doc: "learning rate"}
}

func lrRequired() hyperSpec {
	return hyperSpec{name: "lr", required: true, bound: positive, doc: "learning rate"}
}

func weightDecay(def float64, doc string) hyperSpec {
	return hyperSpec{name: "weight_decay", def: def, bound: nonNegative, doc: doc}
}

var clipNorm = hyperSpec{name: "clip_norm", def: 0, bound: nonNegative,
	doc: "if > 0, scale the shard's gradient so that its L2 norm is at most clip_norm (per shard)"}

const l2Doc = "L2 penalty added to the gradient: g += weight_decay*p"

// registry holds every function, keyed by name.
var registry = map[string]*funcSpec{}

func register(s *funcSpec) {
	s.hyper = append(s.hyper, clipNorm)
	registry[s.name] = s
}

func init() {
	register(&funcSpec{
		name: "sum", doc: "p = sum of the ranks' inputs (not divided by N)",
		build: func(b base) (Func, error) { return &sumFunc{base: b}, nil },
	})
	register(&funcSpec{
		name: "mean", doc: "p = sum of the ranks' inputs / N",
		build: func(b base) (Func, error) { return &meanFunc{base: b}, nil },
	})
	register(&funcSpec{
		name: "fedavg", weighted: true,
		doc:   "FedAvg: p = sum of w_r * input_r / sum of w_r, with w_r the rank's weight (e.g. its sample count)",
		build: func(b base) (Func, error) { return &meanFunc{base: b}, nil },
	})
	register(&funcSpec{
		name: "sgd", doc: "stochastic gradient descent: p -= lr*(g + weight_decay*p)",
		hyper: []hyperSpec{lrRequired(), weightDecay(0, l2Doc)},
		build: func(b base) (Func, error) { return newSGD(b), nil },
	})
	momentumHyper := func(withNesterov bool) []hyperSpec {
		// Nesterov momentum takes no dampening (PyTorch refuses it too): newMomentum refuses it.
		dampening := hyperSpec{name: "dampening", def: 0, bound: unit, rangeText: "in [0, 1); 0 when nesterov = 1",
			doc: "dampening for momentum (must be 0 with nesterov = 1)"}
		if !withNesterov {
			dampening.rangeText, dampening.doc = "0", "dampening for momentum: must be 0 (Nesterov momentum takes none)"
		}
		h := []hyperSpec{
			lrRequired(),
			{name: "momentum", def: 0.9, bound: unit, doc: "momentum factor mu"},
			dampening,
			weightDecay(0, l2Doc),
		}
		if withNesterov {
			h = append(h, hyperSpec{name: "nesterov", def: 0, bound: boolean, doc: "1 for Nesterov momentum"})
		}
		return h
	}
	register(&funcSpec{
		name: "momentum", slots: 1,
		doc:   "SGD with momentum, PyTorch semantics (optionally Nesterov)",
		hyper: momentumHyper(true),
		build: func(b base) (Func, error) { return newMomentum(b, b.hyper["nesterov"] == 1) },
	})
	register(&funcSpec{
		name: "nesterov", slots: 1,
		doc:   "SGD with Nesterov momentum, PyTorch semantics (momentum with nesterov=1)",
		hyper: momentumHyper(false),
		build: func(b base) (Func, error) { return newMomentum(b, true) },
	})
	adamHyper := func(wd float64, wdDoc string) []hyperSpec {
		return []hyperSpec{
			lr(0.001),
			{name: "beta1", def: 0.9, bound: unit, doc: "decay rate of the first moment"},
			{name: "beta2", def: 0.999, bound: unit, doc: "decay rate of the second moment"},
			{name: "eps", def: 1e-8, bound: positive, doc: "added to the denominator"},
			weightDecay(wd, wdDoc),
		}
	}
	register(&funcSpec{
		name: "adam", slots: 2, doc: "Adam, PyTorch semantics (L2 weight decay)",
		hyper: adamHyper(0, l2Doc),
		build: func(b base) (Func, error) { return newAdam(b, false), nil },
	})
	register(&funcSpec{
		name: "adamw", slots: 2, doc: "AdamW, PyTorch semantics (decoupled weight decay)",
		hyper: adamHyper(0.01, "decoupled weight decay: p *= 1 - lr*weight_decay before the Adam step"),
		build: func(b base) (Func, error) { return newAdam(b, true), nil },
	})
	register(&funcSpec{
		name: "adagrad", slots: 1, doc: "Adagrad, PyTorch semantics",
		hyper: []hyperSpec{
			lr(0.01),
			{name: "eps", def: 1e-10, bound: positive, doc: "added to the denominator"},
			weightDecay(0, l2Doc),
			{name: "initial_accumulator", def: 0, bound: nonNegative, doc: "initial value of the sum of squared gradients"},
		},
		build: func(b base) (Func, error) { return newAdagrad(b), nil },
	})
}

func names() []string {
	n := make([]string, 0, len(registry))
	for k := range registry {
		n = append(n, k)
	}
	slices.Sort(n)
	return n
}

// New returns the named function configured with hyper (which may be nil): unset
// hyper-parameters take their defaults. Unknown names give an error wrapping ErrUnknownFunction;
// unknown keys, missing required keys and out-of-range values a *HyperError wrapping ErrBadHyper.
// Keys are checked in sorted order, so the error for a given input is always the same.
func New(name string, hyper map[string]float64) (Func, error) {
	s, ok := registry[name]
	if !ok {
		return nil, &unknownFunctionError{name}
	}
	known := make([]string, len(s.hyper))
	for i, h := range s.hyper {
		known[i] = h.name
	}
	slices.Sort(known)
	keys := make([]string, 0, len(hyper))
	for k := range hyper {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(known, k) {
			return nil, &HyperError{Func: name, Key: k, Known: known}
		}
	}
	b := base{name: name, slots: s.slots, hyper: make(map[string]float64, len(s.hyper))}
	specs := slices.Clone(s.hyper)
	slices.SortFunc(specs, func(x, y hyperSpec) int { return strings.Compare(x.name, y.name) })
	for _, h := range specs {
		v, set := hyper[h.name]
		switch {
		case !set && h.required:
			return nil, &HyperError{Func: name, Key: h.name, Reason: "required"}
		case !set:
			v = h.def
		case math.IsNaN(v) || math.IsInf(v, 0) || !h.bound.ok(v):
			return nil, &HyperError{Func: name, Key: h.name,
				Reason: "must be " + h.bound.text + ", got " + strconv.FormatFloat(v, 'g', -1, 64)}
		case math.Abs(v) > math.MaxFloat32:
			// The kernels compute in float32: a larger value would be +Inf there.
			return nil, &HyperError{Func: name, Key: h.name,
				Reason: "must be at most " + strconv.FormatFloat(math.MaxFloat32, 'g', -1, 64) + " (float32), got " + strconv.FormatFloat(v, 'g', -1, 64)}
		}
		b.hyper[h.name] = v
	}
	b.clip = b.hyper["clip_norm"]
	return s.build(b)
}

// Weighted reports whether the named function weights each rank's input by a per-rank weight
// (fedavg only): the sum is then ScaleLE/AxpyLE with w = float32(weight) and WeightSum is
// SumWeights(weights). It is false for unknown names.
func Weighted(name string) bool {
	s, ok := registry[name]
	return ok && s.weighted
}

// SumWeights returns Update.WeightSum for the given per-rank weights: their float64 sum in rank
// order 0..N-1, so that every deployment computes the same value.
func SumWeights(weights []float64) float64 {
	var sum float64
	for _, w := range weights {
		sum += w
	}
	return sum
}

// Describe lists every function with its hyper-parameters, sorted by function name.
func Describe() []FuncInfo {
	out := make([]FuncInfo, 0, len(registry))
	for _, n := range names() {
		s := registry[n]
		fi := FuncInfo{Name: s.name, Doc: s.doc, Slots: s.slots, Weighted: s.weighted,
			Hyper: make([]HyperInfo, len(s.hyper))}
		for i, h := range s.hyper {
			r := h.bound.text
			if h.rangeText != "" {
				r = h.rangeText
			}
			fi.Hyper[i] = HyperInfo{Name: h.name, Default: h.def, Required: h.required, Range: r, Doc: h.doc}
		}
		out = append(out, fi)
	}
	return out
}
