package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Synth describes synthesized step times (fanin sim --synth), for workloads beyond the shared
// traces. Each iteration's step time (the slowest rank's compute time) is Step times a lognormal
// factor of mean 1 and coefficient of variation CoV; within the iteration the ranks arrive over the
// last Spread of it: the first rank at (1 - Spread) x the step time, the last at the step time.
// With Groups 0 the ranks are evenly spaced over that interval; with Groups >= 2 they arrive in
// that many groups (ranks split evenly, in rank order), the groups evenly spaced, the ranks of a
// group at the same instant.
type Synth struct {
	Spread float64       // fraction of a step between the first rank and the last, in [0, 1)
	CoV    float64       // coefficient of variation of the step times, in [0, 3]
	Groups int           // 0: ranks evenly spread; >= 2: arrival groups
	Ranks  int           // ranks per job
	Steps  int           // iterations synthesized per job (cycled)
	Step   time.Duration // mean step time
}

// DefaultSynth is the base that ParseSynth's keys change.
func DefaultSynth() Synth {
	return Synth{Spread: 0.2, CoV: 0.1, Ranks: 10, Steps: 200, Step: 1500 * time.Millisecond}
}

// ParseSynth reads "spread=0.8,cov=0.6,groups=2,ranks=10,steps=200,step=1.5s" (any subset; the
// others take DefaultSynth's values).
func ParseSynth(spec string) (*Synth, error) {
	s := DefaultSynth()
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return nil, fmt.Errorf("synth: want key=value, got %q (keys: spread, cov, groups, ranks, steps, step)", kv)
		}
		var err error
		switch strings.TrimSpace(k) {
		case "spread":
			s.Spread, err = strconv.ParseFloat(v, 64)
		case "cov":
			s.CoV, err = strconv.ParseFloat(v, 64)
		case "groups":
			s.Groups, err = strconv.Atoi(v)
		case "ranks":
			s.Ranks, err = strconv.Atoi(v)
		case "steps":
			s.Steps, err = strconv.Atoi(v)
		case "step":
			s.Step, err = time.ParseDuration(v)
		default:
			return nil, fmt.Errorf("synth: unknown key %q (keys: spread, cov, groups, ranks, steps, step)", k)
		}
		if err != nil {
			return nil, fmt.Errorf("synth: %s: %w", k, err)
		}
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Validate checks the description.
func (s *Synth) Validate() error {
	var errs []error
	bad := func(f string, args ...any) { errs = append(errs, fmt.Errorf("synth: "+f, args...)) }
	if !(s.Spread >= 0 && s.Spread < 1) {
		bad("spread must be in [0, 1), got %v", s.Spread)
	}
	if !(s.CoV >= 0 && s.CoV <= 3) {
		bad("cov must be in [0, 3], got %v", s.CoV)
	}
	if s.Ranks < 2 {
		bad("ranks must be >= 2, got %d", s.Ranks)
	}
	if s.Groups == 1 || s.Groups < 0 || s.Groups > s.Ranks {
		bad("groups must be 0 (evenly spread) or 2..ranks, got %d", s.Groups)
	}
	if s.Steps < 10 {
		bad("steps must be >= 10, got %d", s.Steps)
	}
	if s.Step <= 0 {
		bad("step must be > 0, got %v", s.Step)
	}
	return errors.Join(errs...)
}

// String renders the description as ParseSynth reads it.
func (s *Synth) String() string {
	return fmt.Sprintf("spread=%g,cov=%g,groups=%d,ranks=%d,steps=%d,step=%v", s.Spread, s.CoV, s.Groups, s.Ranks, s.Steps, s.Step)
}

// Generate synthesizes the step times (seconds, per iteration and rank) of job number job of a
// workload drawn with seed: deterministic in (seed, job).
func (s *Synth) Generate(seed uint64, job int) [][]float64 {
	rng := rand.New(rand.NewPCG(seed, 0x73796e7468^uint64(job)<<8)) // "synth"
	sigma := math.Sqrt(math.Log1p(s.CoV * s.CoV))
	mu := -sigma * sigma / 2
	// where[r] is rank r's arrival as a fraction of the spread: 0 first, 1 last.
	where := make([]float64, s.Ranks)
	for r := range where {
		switch {
		case s.Groups >= 2:
			where[r] = float64(r*s.Groups/s.Ranks) / float64(s.Groups-1)
		default:
			where[r] = float64(r) / float64(s.Ranks-1)
		}
	}
	out := make([][]float64, s.Steps)
	for k := range out {
		t := s.Step.Seconds() * math.Exp(mu+sigma*rng.NormFloat64())
		row := make([]float64, s.Ranks)
		for r := range row {
			row[r] = max(1e-6, math.Round(t*(1-s.Spread*(1-where[r]))*1e6)/1e6)
		}
		out[k] = row
	}
	return out
}

// MeasureSteps returns the spread (median over iterations of (last - first) / last rank time)
// and the coefficient of variation of the step times (the last rank's) of step times. Empty rows
// and rows whose times are all zero are skipped; with none left both are 0.
func MeasureSteps(steps [][]float64) (spread, cov float64) {
	var spreads, ts []float64
	for _, row := range steps {
		if len(row) == 0 || slices.Max(row) <= 0 {
			continue
		}
		hi := slices.Max(row)
		spreads = append(spreads, (hi-slices.Min(row))/hi)
		ts = append(ts, hi)
	}
	if len(ts) == 0 {
		return 0, 0
	}
	slices.Sort(spreads)
	m := mean(ts)
	v := 0.0
	for _, t := range ts {
		v += (t - m) * (t - m)
	}
	return spreads[len(spreads)/2], math.Sqrt(v/float64(len(ts))) / m
}
