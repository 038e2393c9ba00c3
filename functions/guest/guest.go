package guest

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ABI is the version of the function ABI this package speaks (the descriptor's "abi").
const ABI = 1

// Function is a user-defined aggregation function.
type Function struct {
	// Doc is one line shown by GET /v1/functions.
	Doc string
	// State names the per-element float32 state vectors the function keeps (for example "m" and
	// "v" for Adam); fanin stores, checkpoints and migrates them with the parameters.
	State []string
	// Weighted makes the runtime weight each rank's input by its Fanin-Weight before the sum
	// (as fedavg does): Update.Grad is then sum(w_r * g_r) and Update.WeightSum sum(w_r).
	Weighted bool
	// Hyper declares the hyper-parameters; fanin refuses a job whose spec gives an unknown
	// name, misses a required one or gives a value out of its range.
	Hyper []Hyper
	// Init fills fresh state vectors before step 1; nil leaves them zero.
	Init func(state [][]float32, h Values) error
	// Apply updates one shard in place: Params and State are in/out, Grad is the rank-order sum
	// of the ranks' inputs (not divided by WeightSum), scratch.
	Apply func(u *Update) error
}

// Hyper declares one hyper-parameter.
type Hyper struct {
	Name     string
	Doc      string
	Default  float64 // used when the spec omits the name (unless Required)
	Required bool
	// Range is "" (any finite value), "> a", ">= a", "< b", "<= b", or an interval such as
	// "[0, 1)", "(0, 1]".
	Range string
}

// Update is one call of Apply: one step of one shard.
type Update struct {
	Params    []float32
	Grad      []float32
	State     [][]float32
	Step      int64   // 1-based: the shard's step (asp: its count of updates)
	Ranks     int     // logical ranks summed into Grad
	WeightSum float64 // Ranks, or the float64 sum of the weights of a Weighted function
	Hyper     Values
}

// Values holds the validated hyper-parameters, defaults filled in.
type Values struct {
	names []string
	vals  []float64
}

// Get returns the named hyper-parameter. It panics for a name the function did not declare
// (a bug of the function, reported as its failure).
func (v Values) Get(name string) float64 {
	for i, n := range v.names {
		if n == name {
			return v.vals[i]
		}
	}
	panic("guest: hyper-parameter " + strconv.Quote(name) + " is not declared")
}

var fn *Function

// Register makes f the module's function. Call it once, from an init function.
func Register(f Function) {
	if fn != nil {
		panic("guest: Register called twice")
	}
	if f.Apply == nil {
		panic("guest: Register: Apply is nil")
	}
	fn = &f
}

// descriptor is the JSON document fanin_describe returns (hand-written: encoding/json would
// double the module's size).
func descriptor(f *Function) (string, error) {
	var b strings.Builder
	b.WriteString(`{"abi":` + strconv.Itoa(ABI) + `,"doc":` + quote(f.Doc) + `,"weighted":` + strconv.FormatBool(f.Weighted) + `,"state":[`)
	for i, s := range f.State {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(quote(s))
	}
	b.WriteString(`],"hyper":[`)
	for i, h := range f.Hyper {
		if math.IsNaN(h.Default) || math.IsInf(h.Default, 0) {
			return "", fmt.Errorf("hyper-parameter %q: default %v is not finite", h.Name, h.Default)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"name":` + quote(h.Name) + `,"doc":` + quote(h.Doc) +
			`,"default":` + strconv.FormatFloat(h.Default, 'g', -1, 64) +
			`,"required":` + strconv.FormatBool(h.Required) + `,"range":` + quote(h.Range) + `}`)
	}
	b.WriteString(`]}`)
	return b.String(), nil
}

// quote writes s as a JSON string.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte("0123456789abcdef"[r>>4])
			b.WriteByte("0123456789abcdef"[r&15])
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// errNoFunction is the failure of every call when no function registered.
var errNoFunction = errors.New("guest: no function registered (call guest.Register in an init function)")

// ValuesOf returns hyper-parameters as Apply sees them, for tests that call a function's Apply
// natively: names in declared order, vals their values.
func ValuesOf(names []string, vals []float64) Values {
	return Values{names: names, vals: vals}
}
