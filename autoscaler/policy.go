package autoscaler

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Policy is the autoscaler's configuration: how big the pool may be, how full its runtimes should
// run, how fast it reacts and how much it may move per decision. It is read from YAML or JSON
// (ParsePolicy); durations are Go duration strings ("6s", "1m30s"). docs/AUTOSCALING.md ("The
// policy knobs") says what each knob trades.
type Policy struct {
	// MinRuntimes and MaxRuntimes bound the pool. With shards to serve the decider wants at least
	// one runtime even when MinRuntimes is 0.
	MinRuntimes int `json:"min_runtimes" yaml:"min_runtimes"`
	MaxRuntimes int `json:"max_runtimes" yaml:"max_runtimes"`
	// CoresPerRuntime is the size of a new runtime: the unit in which Desired counts capacity. 0
	// means runtimes sized to their machine: the unit is the cores the pool's runtimes report (the
	// median of the healthy ones; until one reports, the pool grows one runtime at a time).
	CoresPerRuntime int `json:"cores_per_runtime" yaml:"cores_per_runtime"`
	// TargetUtilization is the fraction of a runtime's cores that placement fills at the load's
	// predicted peak; the rest is headroom for misprediction.
	TargetUtilization float64 `json:"target_utilization" yaml:"target_utilization"`
	// PanicThreshold is the demand/capacity ratio that enters panic mode: scale up at once, never down.
	PanicThreshold float64 `json:"panic_threshold" yaml:"panic_threshold"`
	// PanicWindow is how long panic lasts after the last decision that saw such demand; in panic the
	// pool is sized for the highest demand seen within it.
	PanicWindow time.Duration `json:"panic_window" yaml:"panic_window"`
	// StableWindow: outside panic the pool is sized for the highest demand seen within it.
	StableWindow time.Duration `json:"stable_window" yaml:"stable_window"`
	// MaxScaleDownFraction bounds how much of the pool one decision may remove (at least one runtime).
	MaxScaleDownFraction float64 `json:"max_scale_down_fraction" yaml:"max_scale_down_fraction"`
	// ScaleUpCooldown and ScaleDownCooldown are the least times since the last change of the pool
	// size before the next increase (outside panic) or decrease.
	ScaleUpCooldown   time.Duration `json:"scale_up_cooldown" yaml:"scale_up_cooldown"`
	ScaleDownCooldown time.Duration `json:"scale_down_cooldown" yaml:"scale_down_cooldown"`
	// MigrationBudget is the number of voluntary shard moves per decision (off stragglers, off
	// overloaded runtimes, consolidation). Placing unplaced shards and shards of dead or draining
	// runtimes is not voluntary and not counted.
	MigrationBudget int `json:"migration_budget" yaml:"migration_budget"`
	// StragglerSpeed: a runtime slower than this fraction of the pool's median speed is a straggler;
	// its shards move off and it is replaced. 0 (the default) disables straggler handling: a
	// runtime's speed is its time per aggregated byte, which depends on the functions it serves
	// (Adam costs about twice SGD per byte), so next to a runtime of SGD shards one of Adam shards
	// looks like a straggler. Until the speed is normalised per function, turn it on only for pools
	// whose jobs share one function. (Before 2026-11-25 the rule never fired live, by a bug.)
	StragglerSpeed float64 `json:"straggler_speed" yaml:"straggler_speed"`
	// Packing makes placement and demand burst-aware: shards of jobs whose bursts do not overlap
	// share cores. Off, every shard is assumed to burst at the same time (its peak rate, always).
	Packing bool `json:"packing" yaml:"packing"`
	// DelayBudget is how much longer than its burst a step's aggregation may take, as a fraction of
	// the step period: a shard's work is planned over Burst + DelayBudget x Period instead of Burst,
	// which lowers its peak rate. 0 plans for no delay at all; the goal is 0.02.
	DelayBudget float64 `json:"delay_budget" yaml:"delay_budget"`
	// OverlapSigmas is the headroom for the bursts of jobs with independent phases coinciding, in
	// standard deviations of their summed load above its mean (see loadmodel.go). Lower is cheaper
	// and queues more often.
	OverlapSigmas float64 `json:"overlap_sigmas" yaml:"overlap_sigmas"`
	// StartupGrace: a runtime younger than this receives shards but is not judged as a straggler.
	StartupGrace time.Duration `json:"startup_grace" yaml:"startup_grace"`
	// UnknownBurst is the burst length assumed for a shard whose step period is not measured yet: it
	// counts as a steady load of Work / max(Burst, UnknownBurst) cores (conservative).
	UnknownBurst time.Duration `json:"unknown_burst" yaml:"unknown_burst"`
	// SlowdownBudget closes the loop: each job's measured step slowdown (its shards' longest queue
	// wait over its period) is kept within it by a per-job headroom on the work the model plans
	// for, grown while the job misses the budget and shrunk while it is well inside (below half).
	// 0 turns the feedback off: the model alone decides.
	SlowdownBudget float64 `json:"slowdown_budget" yaml:"slowdown_budget"`
	// HeadroomPeriod is the least time between two changes of a job's headroom, so that the
	// measurement (an average over the job's recent steps) reflects the last change first.
	HeadroomPeriod time.Duration `json:"headroom_period" yaml:"headroom_period"`
}

// DefaultPolicy returns the defaults, documented in docs/AUTOSCALING.md.
func DefaultPolicy() Policy {
	return Policy{
		MinRuntimes:          1,
		MaxRuntimes:          100,
		CoresPerRuntime:      4,
		TargetUtilization:    0.8,
		PanicThreshold:       2,
		PanicWindow:          6 * time.Second,
		StableWindow:         30 * time.Second,
		MaxScaleDownFraction: 0.25,
		ScaleUpCooldown:      0,
		ScaleDownCooldown:    5 * time.Second,
		MigrationBudget:      32,
		StragglerSpeed:       0, // off: see the field's comment
		Packing:              true,
		DelayBudget:          0.02,
		OverlapSigmas:        2,
		StartupGrace:         3 * time.Second,
		UnknownBurst:         time.Second,
		SlowdownBudget:       0,
		HeadroomPeriod:       10 * time.Second,
	}
}

// ErrInvalidPolicy is wrapped by every error about a policy's content.
var ErrInvalidPolicy = errors.New("invalid autoscaler policy")

// PolicyError is one problem with one knob of a policy.
type PolicyError struct {
	Field string // the knob's YAML name, e.g. "target_utilization"
	Msg   string
}

func (e *PolicyError) Error() string { return e.Field + ": " + e.Msg }
func (e *PolicyError) Unwrap() error { return ErrInvalidPolicy }

// ParsePolicy decodes a policy from YAML or JSON. Absent knobs keep their defaults; unknown knobs and
// invalid values are errors (all of them are reported, joined).
func ParsePolicy(data []byte) (Policy, error) {
	p := DefaultPolicy()
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return p, fmt.Errorf("%w: not YAML or JSON: %v", ErrInvalidPolicy, err)
	}
	if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
		return p, nil // an empty document: all defaults
	}
	// Report the unknown and malformed knobs and the out-of-range ones in one go.
	if err := p.UnmarshalJSON(js); err != nil {
		var pe *PolicyError
		if !errors.As(err, &pe) {
			return p, err // not a mapping
		}
		return p, errors.Join(err, p.Validate())
	}
	return p, p.Validate()
}

// Validate checks every knob and returns the problems joined (each a *PolicyError), or nil.
func (p Policy) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &PolicyError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	if p.MinRuntimes < 0 {
		bad("min_runtimes", "must be >= 0, got %d", p.MinRuntimes)
	}
	if p.MaxRuntimes < 1 {
		bad("max_runtimes", "must be >= 1, got %d", p.MaxRuntimes)
	} else if p.MaxRuntimes < p.MinRuntimes {
		bad("max_runtimes", "must be >= min_runtimes (%d), got %d", p.MinRuntimes, p.MaxRuntimes)
	}
	if p.CoresPerRuntime < 0 {
		bad("cores_per_runtime", "must be >= 1, or 0 for the cores the runtimes report, got %d", p.CoresPerRuntime)
	}
	if !(p.TargetUtilization > 0 && p.TargetUtilization <= 1) {
		bad("target_utilization", "must be in (0, 1], got %v", p.TargetUtilization)
	}
	if !(p.PanicThreshold >= 1 && p.PanicThreshold <= 100) {
		bad("panic_threshold", "must be in [1, 100] (a demand/capacity ratio), got %v", p.PanicThreshold)
	}
	if p.PanicWindow <= 0 {
		bad("panic_window", "must be > 0, got %v", p.PanicWindow)
	}
	if p.StableWindow <= 0 {
		bad("stable_window", "must be > 0, got %v", p.StableWindow)
	}
	if !(p.MaxScaleDownFraction > 0 && p.MaxScaleDownFraction <= 1) {
		bad("max_scale_down_fraction", "must be in (0, 1], got %v", p.MaxScaleDownFraction)
	}
	if p.ScaleUpCooldown < 0 {
		bad("scale_up_cooldown", "must be >= 0, got %v", p.ScaleUpCooldown)
	}
	if p.ScaleDownCooldown < 0 {
		bad("scale_down_cooldown", "must be >= 0, got %v", p.ScaleDownCooldown)
	}
	if p.MigrationBudget < 0 {
		bad("migration_budget", "must be >= 0, got %d", p.MigrationBudget)
	}
	if !(p.StragglerSpeed >= 0 && p.StragglerSpeed < 1) {
		bad("straggler_speed", "must be in [0, 1) (0 disables), got %v", p.StragglerSpeed)
	}
	if !(p.DelayBudget >= 0 && p.DelayBudget <= 1) {
		bad("delay_budget", "must be in [0, 1] (a fraction of the step period), got %v", p.DelayBudget)
	}
	if !(p.OverlapSigmas >= 0 && p.OverlapSigmas <= 10) {
		bad("overlap_sigmas", "must be in [0, 10], got %v", p.OverlapSigmas)
	}
	if p.StartupGrace < 0 {
		bad("startup_grace", "must be >= 0, got %v", p.StartupGrace)
	}
	if p.UnknownBurst <= 0 {
		bad("unknown_burst", "must be > 0, got %v", p.UnknownBurst)
	}
	if !(p.SlowdownBudget >= 0 && p.SlowdownBudget < 1) {
		bad("slowdown_budget", "must be in [0, 1) (a fraction of the step period; 0 disables), got %v", p.SlowdownBudget)
	}
	if p.HeadroomPeriod < 0 {
		bad("headroom_period", "must be >= 0, got %v", p.HeadroomPeriod)
	}
	return errors.Join(errs...)
}

// knob is one field of Policy, addressed by its YAML name.
type knob struct {
	name  string
	index int
	kind  reflect.Kind // Int, Float64, Bool, or Int64 for time.Duration
}

var durationType = reflect.TypeFor[time.Duration]()

// knobs lists Policy's fields in declaration order; Set, Get, MarshalJSON and UnmarshalJSON all
// work from it, so a new field needs nothing but its tag.
var knobs = func() []knob {
	t := reflect.TypeFor[Policy]()
	ks := make([]knob, t.NumField())
	for i := range ks {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		ks[i] = knob{name: name, index: i, kind: f.Type.Kind()}
		switch {
		case f.Type == durationType, f.Type.Kind() == reflect.Int, f.Type.Kind() == reflect.Float64, f.Type.Kind() == reflect.Bool:
		default:
			panic("autoscaler: Policy." + f.Name + " has a type Set cannot parse")
		}
	}
	return ks
}()

func findKnob(name string) (knob, error) {
	for _, k := range knobs {
		if k.name == name {
			return k, nil
		}
	}
	return knob{}, &PolicyError{Field: name, Msg: "unknown knob; known: " + strings.Join(KnobNames(), ", ")}
}

// KnobNames lists the policy's knobs by their YAML names, in declaration order.
func KnobNames() []string {
	names := make([]string, len(knobs))
	for i, k := range knobs {
		names[i] = k.name
	}
	return names
}

// Set sets one knob by its YAML name from a string ("0.7", "6s", "true"), e.g. for a sweep. It
// checks the syntax, not the range: call Validate after.
func (p *Policy) Set(name, value string) error {
	k, err := findKnob(name)
	if err != nil {
		return err
	}
	f := reflect.ValueOf(p).Elem().Field(k.index)
	value = strings.TrimSpace(value)
	switch {
	case f.Type() == durationType:
		d, err := time.ParseDuration(value)
		if err != nil {
			return &PolicyError{Field: name, Msg: fmt.Sprintf("want a duration such as \"6s\", got %q", value)}
		}
		f.SetInt(int64(d))
	case k.kind == reflect.Int:
		n, err := strconv.Atoi(value)
		if err != nil {
			return &PolicyError{Field: name, Msg: fmt.Sprintf("want an integer, got %q", value)}
		}
		f.SetInt(int64(n))
	case k.kind == reflect.Float64:
		x, err := strconv.ParseFloat(value, 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			return &PolicyError{Field: name, Msg: fmt.Sprintf("want a number, got %q", value)}
		}
		f.SetFloat(x)
	case k.kind == reflect.Bool:
		b, err := strconv.ParseBool(value)
		if err != nil {
			return &PolicyError{Field: name, Msg: fmt.Sprintf("want true or false, got %q", value)}
		}
		f.SetBool(b)
	}
	return nil
}

// Get formats one knob by its YAML name as Set would read it back.
func (p Policy) Get(name string) (string, error) {
	k, err := findKnob(name)
	if err != nil {
		return "", err
	}
	f := reflect.ValueOf(p).Field(k.index)
	switch {
	case f.Type() == durationType:
		return time.Duration(f.Int()).String(), nil
	case k.kind == reflect.Int:
		return strconv.FormatInt(f.Int(), 10), nil
	case k.kind == reflect.Float64:
		return strconv.FormatFloat(f.Float(), 'g', -1, 64), nil
	default:
		return strconv.FormatBool(f.Bool()), nil
	}
}

// MarshalJSON writes every knob in declaration order, durations as strings.
func (p Policy) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range knobs {
		if i > 0 {
			b.WriteByte(',')
		}
		v, _ := p.Get(k.name)
		b.WriteString(strconv.Quote(k.name))
		b.WriteByte(':')
		if reflect.TypeFor[Policy]().Field(k.index).Type == durationType {
			v = strconv.Quote(v)
		}
		b.WriteString(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON sets the knobs present in data over p's current values, rejecting unknown knobs and
// values of the wrong type (durations must be strings). It does not check ranges: see Validate.
func (p *Policy) UnmarshalJSON(data []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidPolicy, err)
	}
	var errs []error
	for _, name := range sortedKeys(raw) {
		k, err := findKnob(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		msg := bytes.TrimSpace(raw[name])
		var s string
		if reflect.TypeFor[Policy]().Field(k.index).Type == durationType {
			if json.Unmarshal(msg, &s) != nil {
				errs = append(errs, &PolicyError{Field: name, Msg: fmt.Sprintf("want a duration string such as \"6s\", got %s", msg)})
				continue
			}
		} else {
			if len(msg) > 0 && msg[0] == '"' {
				errs = append(errs, &PolicyError{Field: name, Msg: fmt.Sprintf("want %s, not a string: %s", kindWord(k.kind), msg)})
				continue
			}
			s = string(msg)
		}
		if err := p.Set(name, s); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func kindWord(k reflect.Kind) string {
	switch k {
	case reflect.Int:
		return "an integer"
	case reflect.Bool:
		return "a boolean"
	default:
		return "a number"
	}
}

// YAML renders the policy as a YAML document, knobs in alphabetical order.
func (p Policy) YAML() string {
	js, _ := p.MarshalJSON()
	y, err := yaml.JSONToYAML(js)
	if err != nil {
		return string(js)
	}
	return string(y)
}
