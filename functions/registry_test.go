package functions

import (
	"encoding/json"
	"errors"
	"maps"
	"math"
	"slices"
	"testing"
)

func TestNewErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		hyper map[string]float64
		is    error
		msg   string
	}{
		{"adamx", nil, ErrUnknownFunction,
			`unknown function "adamx" (known: adagrad, adam, adamw, fedavg, mean, momentum, nesterov, sgd, sum)`},
		{"", nil, ErrUnknownFunction,
			`unknown function "" (known: adagrad, adam, adamw, fedavg, mean, momentum, nesterov, sgd, sum)`},
		{"adam", map[string]float64{"beta1": 1.5}, ErrBadHyper, `adam: beta1: must be in [0, 1), got 1.5`},
		{"adam", map[string]float64{"beta2": 1}, ErrBadHyper, `adam: beta2: must be in [0, 1), got 1`},
		{"adam", map[string]float64{"eps": 0}, ErrBadHyper, `adam: eps: must be > 0, got 0`},
		{"adam", map[string]float64{"lr": math.NaN()}, ErrBadHyper, `adam: lr: must be > 0, got NaN`},
		{"adam", map[string]float64{"lr": math.Inf(1)}, ErrBadHyper, `adam: lr: must be > 0, got +Inf`},
		{"sgd", nil, ErrBadHyper, `sgd: lr: required`},
		{"sgd", map[string]float64{"weight_decay": 0.1}, ErrBadHyper, `sgd: lr: required`},
		{"sgd", map[string]float64{"lr": -1}, ErrBadHyper, `sgd: lr: must be > 0, got -1`},
		{"sgd", map[string]float64{"lr": 0.1, "weight_decay": -0.5}, ErrBadHyper, `sgd: weight_decay: must be >= 0, got -0.5`},
		{"sgd", map[string]float64{"lrr": 0.1}, ErrBadHyper,
			`sgd: unknown hyper-parameter "lrr" (known: clip_norm, lr, weight_decay)`},
		{"sum", map[string]float64{"clip_norm": -1}, ErrBadHyper, `sum: clip_norm: must be >= 0, got -1`},
		{"sum", map[string]float64{"lr": 1}, ErrBadHyper, `sum: unknown hyper-parameter "lr" (known: clip_norm)`},
		{"fedavg", map[string]float64{"clip_norm": math.Inf(1)}, ErrBadHyper, `fedavg: clip_norm: must be >= 0, got +Inf`},
		{"momentum", map[string]float64{"lr": 0.1, "nesterov": 0.5}, ErrBadHyper, `momentum: nesterov: must be 0 or 1, got 0.5`},
		{"momentum", map[string]float64{"lr": 0.1, "momentum": -0.1}, ErrBadHyper, `momentum: momentum: must be in [0, 1), got -0.1`},
		{"momentum", map[string]float64{"lr": 0.1, "dampening": 1}, ErrBadHyper, `momentum: dampening: must be in [0, 1), got 1`},
		{"momentum", map[string]float64{"lr": 0.1, "nesterov": 1, "dampening": 0.1}, ErrBadHyper,
			`momentum: dampening: must be 0 with Nesterov momentum, got 0.1`},
		{"momentum", map[string]float64{"lr": 0.1, "nesterov": 1, "momentum": 0}, ErrBadHyper,
			`momentum: momentum: must be > 0 with Nesterov momentum, got 0`},
		{"nesterov", map[string]float64{"lr": 0.1, "nesterov": 1}, ErrBadHyper,
			`nesterov: unknown hyper-parameter "nesterov" (known: clip_norm, dampening, lr, momentum, weight_decay)`},
		{"nesterov", map[string]float64{"lr": 0.1, "dampening": 0.2}, ErrBadHyper,
			`nesterov: dampening: must be 0 with Nesterov momentum, got 0.2`},
		{"adagrad", map[string]float64{"initial_accumulator": -1}, ErrBadHyper,
			`adagrad: initial_accumulator: must be >= 0, got -1`},
		// Several problems: unknown keys first, then the keys in sorted order.
		{"adam", map[string]float64{"zz": 1, "beta1": 2, "beta2": 2}, ErrBadHyper,
			`adam: unknown hyper-parameter "zz" (known: beta1, beta2, clip_norm, eps, lr, weight_decay)`},
		{"adam", map[string]float64{"eps": -1, "beta2": 2}, ErrBadHyper, `adam: beta2: must be in [0, 1), got 2`},
	}
	for _, c := range cases {
		fn, err := New(c.name, c.hyper)
		if err == nil {
			t.Errorf("New(%q, %v) = %v, want an error", c.name, c.hyper, fn.Hyper())
			continue
		}
		if err.Error() != c.msg {
			t.Errorf("New(%q, %v): %q\nwant %q", c.name, c.hyper, err, c.msg)
		}
		if !errors.Is(err, c.is) {
			t.Errorf("New(%q, %v): %v is not %v", c.name, c.hyper, err, c.is)
		}
		if c.is == ErrBadHyper {
			var he *HyperError
			if !errors.As(err, &he) || he.Func != c.name || he.Key == "" {
				t.Errorf("New(%q, %v): %#v is not a *HyperError for the function", c.name, c.hyper, err)
			}
		}
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		hyper map[string]float64
		want  map[string]float64
	}{
		{"sum", nil, map[string]float64{"clip_norm": 0}},
		{"mean", nil, map[string]float64{"clip_norm": 0}},
		{"fedavg", map[string]float64{"clip_norm": 2}, map[string]float64{"clip_norm": 2}},
		{"sgd", map[string]float64{"lr": 0.1}, map[string]float64{"lr": 0.1, "weight_decay": 0, "clip_norm": 0}},
		{"momentum", map[string]float64{"lr": 0.1}, map[string]float64{"lr": 0.1, "momentum": 0.9, "dampening": 0,
			"weight_decay": 0, "nesterov": 0, "clip_norm": 0}},
		{"nesterov", map[string]float64{"lr": 0.1}, map[string]float64{"lr": 0.1, "momentum": 0.9, "dampening": 0,
			"weight_decay": 0, "clip_norm": 0}},
		{"adam", nil, map[string]float64{"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0, "clip_norm": 0}},
		{"adamw", nil, map[string]float64{"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01, "clip_norm": 0}},
		{"adagrad", map[string]float64{"eps": 1e-6}, map[string]float64{"lr": 0.01, "eps": 1e-6, "weight_decay": 0,
			"initial_accumulator": 0, "clip_norm": 0}},
	}
	for _, c := range cases {
		fn := mustNew(t, c.name, c.hyper)
		if fn.Name() != c.name {
			t.Errorf("Name() = %q, want %q", fn.Name(), c.name)
		}
		got := fn.Hyper()
		if !maps.Equal(got, c.want) {
			t.Errorf("%s: Hyper() = %v, want %v", c.name, got, c.want)
		}
		// Hyper returns a copy, and it configures the same function again.
		got["clip_norm"] = 123
		if fn.Hyper()["clip_norm"] == 123 {
			t.Errorf("%s: Hyper() shares its map", c.name)
		}
		again := mustNew(t, c.name, fn.Hyper())
		if !maps.Equal(again.Hyper(), fn.Hyper()) {
			t.Errorf("%s: New(Name(), Hyper()) = %v, want %v", c.name, again.Hyper(), fn.Hyper())
		}
	}
	// New copies the caller's map.
	h := map[string]float64{"lr": 0.5}
	fn := mustNew(t, "sgd", h)
	h["lr"] = 1
	if fn.Hyper()["lr"] != 0.5 {
		t.Errorf("New kept the caller's map")
	}
}

func TestWeighted(t *testing.T) {
	t.Parallel()
	for _, fi := range Describe() {
		if got := Weighted(fi.Name); got != (fi.Name == "fedavg") || got != fi.Weighted {
			t.Errorf("Weighted(%q) = %v, Describe %v", fi.Name, got, fi.Weighted)
		}
	}
	if Weighted("nope") {
		t.Errorf(`Weighted("nope") = true`)
	}
	// In rank order, in float64: (0.1 + 0.2) + 0.3 = 0.6000000000000001, while 0.1 + (0.2 + 0.3) = 0.6.
	if got := SumWeights([]float64{0.1, 0.2, 0.3}); got != 0.6000000000000001 {
		t.Errorf("SumWeights = %v", got)
	}
}

func TestDescribe(t *testing.T) {
	t.Parallel()
	infos := Describe()
	var names []string
	for _, fi := range infos {
		names = append(names, fi.Name)
		if fi.Doc == "" {
			t.Errorf("%s: no doc", fi.Name)
		}
		// Every described hyper-parameter is accepted with its default, and New fills exactly these.
		hyper := map[string]float64{}
		for _, h := range fi.Hyper {
			if h.Doc == "" || h.Range == "" {
				t.Errorf("%s.%s: no doc or range", fi.Name, h.Name)
			}
			hyper[h.Name] = h.Default
			if h.Required {
				hyper[h.Name] = 0.1
			}
		}
		if _, ok := hyper["clip_norm"]; !ok {
			t.Errorf("%s: no clip_norm", fi.Name)
		}
		fn := mustNew(t, fi.Name, hyper)
		if !maps.Equal(fn.Hyper(), hyper) {
			t.Errorf("%s: Hyper() = %v, Describe gives %v", fi.Name, fn.Hyper(), hyper)
		}
	}
	want := []string{"adagrad", "adam", "adamw", "fedavg", "mean", "momentum", "nesterov", "sgd", "sum"}
	if !slices.Equal(names, want) {
		t.Errorf("Describe names %v, want %v", names, want)
	}
	if _, err := json.Marshal(infos); err != nil {
		t.Error(err)
	}
	// Describe returns copies.
	infos[0].Hyper[0].Name = "x"
	if Describe()[0].Hyper[0].Name == "x" {
		t.Errorf("Describe shares its slices")
	}
}

// A value inside the range Describe gives (GET /v1/functions) is accepted, the other
// hyper-parameters at their defaults: the range says everything New checks, dampening's bond with
// Nesterov momentum included.
func TestDescribedRangesAreAccepted(t *testing.T) {
	t.Parallel()
	inside := map[string]float64{"> 0": 0.5, ">= 0": 0.5, "in [0, 1)": 0.5, "0 or 1": 1, "0": 0,
		"in [0, 1); 0 when nesterov = 1": 0.5}
	for _, fi := range Describe() {
		for _, h := range fi.Hyper {
			v, ok := inside[h.Range]
			if !ok {
				t.Errorf("%s.%s: range %q: add a value inside it to this test", fi.Name, h.Name, h.Range)
				continue
			}
			hyper := map[string]float64{h.Name: v}
			for _, o := range fi.Hyper {
				if o.Required && o.Name != h.Name {
					hyper[o.Name] = 0.1
				}
			}
			if _, err := New(fi.Name, hyper); err != nil {
				t.Errorf("%s.%s = %v, inside its described range %q: %v", fi.Name, h.Name, v, h.Range, err)
			}
		}
	}
	for f, want := range map[string]string{"momentum": "in [0, 1); 0 when nesterov = 1", "nesterov": "0"} {
		for _, h := range describe(t, f).Hyper {
			if h.Name == "dampening" && h.Range != want {
				t.Errorf("%s: dampening's range is %q, want %q", f, h.Range, want)
			}
		}
	}
}

func describe(t *testing.T, name string) FuncInfo {
	t.Helper()
	for _, fi := range Describe() {
		if fi.Name == name {
			return fi
		}
	}
	t.Fatalf("no function %q", name)
	return FuncInfo{}
}
