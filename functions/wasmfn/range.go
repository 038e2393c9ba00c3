package wasmfn

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// valueRange is a declared range of a hyper-parameter: lo..hi, each end open or closed, ±Inf
// for none. NaN and ±Inf values never pass.
type valueRange struct {
	lo, hi         float64
	loOpen, hiOpen bool
	src            string
}

// parseRange reads "" (any finite value), "> a", ">= a", "< b", "<= b", or an interval
// "[a, b]", "[a, b)", "(a, b]", "(a, b)".
func parseRange(s string) (valueRange, error) {
	r := valueRange{lo: math.Inf(-1), hi: math.Inf(1), src: strings.TrimSpace(s)}
	t := r.src
	num := func(x string) (float64, error) {
		v, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("range %q: %q is not a finite number", s, x)
		}
		return v, nil
	}
	var err error
	switch {
	case t == "":
	case strings.HasPrefix(t, ">="):
		r.lo, err = num(t[2:])
	case strings.HasPrefix(t, ">"):
		r.lo, err = num(t[1:])
		r.loOpen = true
	case strings.HasPrefix(t, "<="):
		r.hi, err = num(t[2:])
	case strings.HasPrefix(t, "<"):
		r.hi, err = num(t[1:])
		r.hiOpen = true
	case len(t) >= 5 && (t[0] == '[' || t[0] == '(') && (t[len(t)-1] == ']' || t[len(t)-1] == ')'):
		lo, hi, ok := strings.Cut(t[1:len(t)-1], ",")
		if !ok {
			return r, fmt.Errorf("range %q: an interval is written [a, b], (a, b), [a, b) or (a, b]", s)
		}
		if r.lo, err = num(lo); err != nil {
			return r, err
		}
		if r.hi, err = num(hi); err != nil {
			return r, err
		}
		r.loOpen, r.hiOpen = t[0] == '(', t[len(t)-1] == ')'
		if r.lo > r.hi || (r.lo == r.hi && (r.loOpen || r.hiOpen)) {
			return r, fmt.Errorf("range %q is empty", s)
		}
	default:
		return r, fmt.Errorf("range %q: write \"\" (any), \"> a\", \">= a\", \"< b\", \"<= b\" or an interval such as \"[0, 1)\"", s)
	}
	return r, err
}

func (r valueRange) ok(x float64) bool {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return false
	}
	if x < r.lo || (r.loOpen && x == r.lo) || x > r.hi || (r.hiOpen && x == r.hi) {
		return false
	}
	return true
}

func (r valueRange) text() string {
	if r.src == "" {
		return "finite"
	}
	if r.src[0] == '[' || r.src[0] == '(' {
		return "in " + r.src
	}
	return r.src
}
