package autoscaler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// t0 is the test clock's origin; tests move time by passing t0.Add(...), never by sleeping.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// runtimes returns n healthy 4-core runtimes rt-1..rt-n, registered long ago.
func runtimes(n int) []RuntimeObs {
	rs := make([]RuntimeObs, n)
	for i := range rs {
		rs[i] = RuntimeObs{ID: "rt-" + strconv.Itoa(i+1), Cores: 4, Since: t0.Add(-time.Hour), Speed: 1}
	}
	return rs
}

// job returns n shards of a job, each with the given work per step, bursting every period at phase
// for burst; placed round-robin on the given runtimes ("" leaves them unplaced).
func jobShards(id string, n int, work float64, period, phase, burst time.Duration, on ...string) []ShardObs {
	ss := make([]ShardObs, n)
	for i := range ss {
		rt := ""
		if len(on) > 0 {
			rt = on[i%len(on)]
		}
		ss[i] = ShardObs{Key: fmt.Sprintf("%s.%d", id, i), Job: id, Runtime: rt, Bytes: 4 << 20, Work: work,
			Period: period, Phase: phase, Burst: burst}
	}
	return ss
}

// steady returns n shards that need `cores` cores in total all the time (burst = period).
func steady(id string, n int, cores float64, on ...string) []ShardObs {
	return jobShards(id, n, cores/float64(n), time.Second, 0, time.Second, on...)
}

func hasReason(d Decision, sub string) bool {
	for _, r := range d.Reasons {
		if strings.Contains(r, sub) {
			return true
		}
	}
	return false
}

// runtimesUsed counts the distinct runtimes of a placement.
func runtimesUsed(pl map[string]string) int {
	seen := map[string]bool{}
	for _, rt := range pl {
		seen[rt] = true
	}
	return len(seen)
}

// checkPlacement checks the contract: every shard placed on an observed runtime that is not drained.
func checkPlacement(t *testing.T, obs Observations, d Decision) {
	t.Helper()
	if len(obs.Runtimes) == 0 {
		return // nowhere to place anything
	}
	ids := map[string]bool{}
	for _, r := range obs.Runtimes {
		ids[r.ID] = true
	}
	for _, r := range d.Drain {
		delete(ids, r)
	}
	for _, s := range obs.Shards {
		rt, ok := d.Placement[s.Key]
		if !ok {
			t.Errorf("shard %s not placed", s.Key)
		} else if !ids[rt] {
			t.Errorf("shard %s placed on %q, not an observed runtime outside Drain", s.Key, rt)
		}
	}
}

func TestDecideScaling(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy() // 4 cores at 0.8: 3.2 cores per runtime
	type step struct {
		after   time.Duration
		obs     Observations
		desired int
		mode    string
		reason  string // a substring of one reason
	}
	// load is n runtimes holding a steady load of the given cores, spread evenly over them.
	load := func(n int, cores float64) Observations {
		rs := runtimes(n)
		ids := make([]string, n)
		for i, r := range rs {
			ids[i] = r.ID
		}
		return Observations{Runtimes: rs, Shards: steady("j", 10*n, cores, ids...)}
	}
	for _, tc := range []struct {
		name  string
		pol   func(*Policy)
		steps []step
	}{
		{"scale up on burst", nil, []step{
			{0, load(1, 2), 1, "stable", "demand 2.00 cores now"},
			// 20 cores on 3.2 of capacity: panic, sized at once for ceil(20/3.2) = 7.
			{time.Second, load(1, 20), 7, "panic", "panic: demand 20.00 cores >= 2.0 x capacity 3.20"},
		}},
		{"hold during panic", nil, []step{
			{0, load(1, 20), 7, "panic", "panic"},
			{2 * time.Second, load(7, 1), 7, "panic", "never scaling down"},
			{5 * time.Second, load(7, 1), 7, "panic", ""},
			// The panic window (6s) passed without such demand: stable, but the stable window still
			// holds the 20-core sample.
			{7 * time.Second, load(7, 1), 7, "stable", "panic over"},
			{29 * time.Second, load(7, 1), 7, "stable", ""},
		}},
		{"damped scale-down", func(p *Policy) { p.MaxScaleDownFraction = 0.25; p.StableWindow = 10 * time.Second }, []step{
			{0, load(20, 64), 20, "stable", ""},
			// 0.5 cores want 1 runtime; at most 25% of the pool goes per decision, each after the
			// 5s cooldown since the last change, and only once the stable window forgot the 60.
			{5 * time.Second, load(20, 0.5), 20, "stable", ""},
			{10 * time.Second, load(20, 0.5), 15, "stable", "scale down 20 -> 15"},
			{12 * time.Second, load(15, 0.5), 15, "stable", "scale-down cooldown: holding 15"},
			{15 * time.Second, load(15, 0.5), 12, "stable", "scale down 15 -> 12"},
			{20 * time.Second, load(12, 0.5), 9, "stable", ""},
			{25 * time.Second, load(9, 0.5), 7, "stable", ""},
			{30 * time.Second, load(7, 0.5), 6, "stable", ""},
			{35 * time.Second, load(6, 0.5), 5, "stable", ""},
			{40 * time.Second, load(5, 0.5), 4, "stable", ""},
			{45 * time.Second, load(4, 0.5), 3, "stable", ""},
			{50 * time.Second, load(3, 0.5), 2, "stable", ""},
			{55 * time.Second, load(2, 0.5), 1, "stable", ""},
			{60 * time.Second, load(1, 0.5), 1, "stable", ""},
		}},
		{"min runtimes", func(p *Policy) { p.MinRuntimes = 3 }, []step{
			{0, Observations{Runtimes: runtimes(1)}, 3, "stable", "held at min_runtimes 3"},
			{time.Second, load(3, 0.1), 3, "stable", ""},
		}},
		{"one runtime for any shard even with min 0", func(p *Policy) { p.MinRuntimes = 0 }, []step{
			{0, Observations{}, 0, "stable", ""},
			{time.Second, Observations{Shards: steady("j", 1, 0.1)}, 1, "panic", ""},
		}},
		{"max runtimes", func(p *Policy) { p.MaxRuntimes = 5 }, []step{
			{0, load(1, 100), 5, "panic", "capped at max_runtimes 5 (wanted 32)"},
		}},
		{"scale-up cooldown outside panic", func(p *Policy) { p.ScaleUpCooldown = 10 * time.Second; p.PanicThreshold = 100 }, []step{
			{0, load(2, 6), 2, "stable", ""},
			{time.Second, load(2, 9), 3, "stable", ""},
			{5 * time.Second, load(3, 12), 3, "stable", "scale-up cooldown: holding 3 (want 4; last change 4s ago < 10s)"},
			{11 * time.Second, load(3, 12), 4, "stable", ""},
		}},
		{"panic ignores the scale-up cooldown", func(p *Policy) { p.ScaleUpCooldown = time.Hour }, []step{
			{0, load(1, 6), 2, "stable", ""},
			{time.Second, load(2, 9), 2, "stable", "scale-up cooldown"},
			{2 * time.Second, load(2, 30), 10, "panic", "panic"},
		}},
		{"scale-down cooldown", func(p *Policy) { p.ScaleDownCooldown = 20 * time.Second; p.StableWindow = time.Second }, []step{
			// The first decision takes the observed pool as the current size.
			{0, load(4, 1), 3, "stable", "scale down 4 -> 3"},
			{10 * time.Second, load(3, 1), 3, "stable", "scale-down cooldown: holding 3"},
			{21 * time.Second, load(3, 1), 2, "stable", ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := p
			if tc.pol != nil {
				tc.pol(&pol)
			}
			if err := pol.Validate(); err != nil {
				t.Fatal(err)
			}
			d := NewDecider()
			for i, s := range tc.steps {
				got := d.Decide(pol, s.obs, at(s.after))
				if got.Desired != s.desired || got.Mode != s.mode || (s.reason != "" && !hasReason(got, s.reason)) {
					t.Fatalf("step %d (+%v): desired %d mode %s, want %d %s with a reason containing %q; reasons:\n  %s",
						i, s.after, got.Desired, got.Mode, s.desired, s.mode, s.reason, strings.Join(got.Reasons, "\n  "))
				}
				checkPlacement(t, s.obs, got)
			}
		})
	}
}

func TestDecidePackingOfBursts(t *testing.T) {
	t.Parallel()
	// Two jobs of 10 shards, 0.03 core-seconds each per step: 0.3 core-seconds in a 100ms burst is
	// 3 cores at the peak. One 4-core runtime at 80% (3.2 cores) holds one burst at a time.
	const period, burst = time.Second, 100 * time.Millisecond
	for _, tc := range []struct {
		name        string
		phaseB      time.Duration
		packing     bool
		runtimes    int // the placement uses
		desired     int
		demandAbout float64
	}{
		{"disjoint bursts share a runtime", 500 * time.Millisecond, true, 1, 1, 3},
		{"overlapping bursts do not", 50 * time.Millisecond, true, 2, 2, 6},
		{"disjoint bursts without packing do not", 500 * time.Millisecond, false, 2, 2, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultPolicy()
			p.Packing = tc.packing
			p.MaxScaleDownFraction = 1
			p.DelayBudget = 0
			obs := Observations{
				Runtimes: runtimes(3),
				Shards: slices.Concat(jobShards("a", 10, 0.03, period, 0, burst),
					jobShards("b", 10, 0.03, period, tc.phaseB, burst)),
			}
			got := NewDecider().Decide(p, obs, at(0))
			checkPlacement(t, obs, got)
			if n := runtimesUsed(got.Placement); n != tc.runtimes {
				t.Errorf("placement uses %d runtimes, want %d: %v", n, tc.runtimes, got.Placement)
			}
			if got.Desired != tc.desired || got.Demand < tc.demandAbout-0.01 || got.Demand > tc.demandAbout+0.01 {
				t.Errorf("desired %d demand %.3f, want %d about %.1f; %v", got.Desired, got.Demand, tc.desired, tc.demandAbout, got.Reasons)
			}
			for _, m := range got.Moves {
				if !strings.HasPrefix(m.Reason, "placed "+m.Shard+" on ") {
					t.Errorf("move reason %q", m.Reason)
				}
			}
		})
	}
}

func TestDecidePhaseIsAbsolute(t *testing.T) {
	t.Parallel()
	// The same jobs seen at any later time make the same placement: phases are offsets from the
	// Unix epoch, not from now.
	p := DefaultPolicy()
	p.MaxScaleDownFraction = 1
	obs := Observations{Runtimes: runtimes(3), Shards: slices.Concat(
		jobShards("a", 10, 0.03, time.Second, 0, 100*time.Millisecond),
		jobShards("b", 10, 0.03, time.Second, 500*time.Millisecond, 100*time.Millisecond))}
	for _, off := range []time.Duration{0, 123 * time.Millisecond, 456789 * time.Millisecond} {
		if n := runtimesUsed(NewDecider().Decide(p, obs, at(off)).Placement); n != 1 {
			t.Errorf("at +%v: %d runtimes, want 1", off, n)
		}
	}
}

func TestDecideDelayBudget(t *testing.T) {
	t.Parallel()
	// 0.3 core-seconds per 1s step in a 100ms burst: 3 cores; allowed to take 2% of the step
	// longer, 0.3/0.12s = 2.5 cores.
	for _, tc := range []struct{ budget, demand float64 }{{0, 3}, {0.02, 2.5}, {1, 0.3}} {
		p := DefaultPolicy()
		p.DelayBudget = tc.budget
		obs := Observations{Runtimes: runtimes(1), Shards: jobShards("a", 10, 0.03, time.Second, 0, 100*time.Millisecond)}
		if got := NewDecider().Decide(p, obs, at(0)); got.Demand < tc.demand-0.01 || got.Demand > tc.demand+0.01 {
			t.Errorf("delay budget %v: demand %.3f, want %.2f", tc.budget, got.Demand, tc.demand)
		}
	}
}

func TestDecideUnknownPeriodIsConservative(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.UnknownBurst = 100 * time.Millisecond
	p.DelayBudget = 0
	// Work 0.02 per shard, burst unknown: steady at 0.02/100ms = 0.2 cores each, 2 cores in all.
	obs := Observations{Runtimes: runtimes(2), Shards: jobShards("new", 10, 0.02, 0, 0, 0)}
	got := NewDecider().Decide(p, obs, at(0))
	if got.Demand < 1.999 || got.Demand > 2.001 {
		t.Fatalf("demand %.3f, want 2", got.Demand)
	}
	// Once measured (1s period, 400ms burst) the same work needs 0.5 cores at the peak.
	obs.Shards = jobShards("new", 10, 0.02, time.Second, 0, 400*time.Millisecond)
	got = NewDecider().Decide(p, obs, at(0))
	if got.Demand < 0.49 || got.Demand > 0.51 {
		t.Fatalf("measured demand %.3f, want 0.5", got.Demand)
	}
}

func TestDecidePlacesUnplacedAndOrphans(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.MigrationBudget = 0 // none of these moves is voluntary
	rs := runtimes(3)
	rs[2].Draining = true
	obs := Observations{Runtimes: rs, Shards: slices.Concat(
		steady("new", 4, 0.4),           // unplaced
		steady("lost", 4, 0.4, "rt-9"),  // its runtime is gone
		steady("drain", 4, 0.4, "rt-3"), // its runtime drains
		steady("stay", 4, 0.4, "rt-1", "rt-2"))}
	got := NewDecider().Decide(p, obs, at(0))
	checkPlacement(t, obs, got)
	if len(got.Moves) != 12 {
		t.Fatalf("%d moves, want 12: %+v", len(got.Moves), got.Moves)
	}
	for _, s := range obs.Shards[12:] {
		if got.Placement[s.Key] != s.Runtime {
			t.Errorf("%s moved from %s to %s although it fits", s.Key, s.Runtime, got.Placement[s.Key])
		}
	}
	if !slices.Equal(got.Drain, []string{"rt-3"}) {
		t.Errorf("drain %v, want [rt-3]", got.Drain)
	}
	want := map[string]string{
		"new.0":   "placed new.0 on rt-",
		"lost.0":  "moved lost.0 off rt-9: runtime rt-9 is gone",
		"drain.0": "moved drain.0 off rt-3: runtime rt-3 is draining",
	}
	for _, m := range got.Moves {
		if w, ok := want[m.Shard]; ok && !strings.HasPrefix(m.Reason, w) {
			t.Errorf("%s: reason %q, want %q", m.Shard, m.Reason, w)
		}
	}
	if !hasReason(got, "placed 4 unplaced shards") || !hasReason(got, "moved 4 shards off rt-9: runtime rt-9 is gone") {
		t.Errorf("reasons: %v", got.Reasons)
	}
}

func TestDecideKeepsShardsThatFit(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	rs := runtimes(4)
	// Spread thinly, but the pool is the right size (4 runtimes wanted): nothing moves.
	obs := Observations{Runtimes: rs, Shards: steady("j", 40, 12, "rt-1", "rt-2", "rt-3", "rt-4")}
	d := NewDecider()
	for i := range 3 {
		got := d.Decide(p, obs, at(time.Duration(i)*time.Second))
		if len(got.Moves) != 0 || got.Desired != 4 {
			t.Fatalf("decision %d: desired %d, moves %+v", i, got.Desired, got.Moves)
		}
	}
}

func TestDecideMovesOffOverloadedRuntime(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	// rt-1 holds 6 cores of steady load on 4 cores (moves start above 3.6, midway from the 80%
	// target to full); rt-2 is empty.
	obs := Observations{Runtimes: runtimes(2), Shards: slices.Concat(steady("big", 8, 2.4, "rt-1"), steady("small", 6, 3.6, "rt-1"))}
	got := NewDecider().Decide(p, obs, at(0))
	checkPlacement(t, obs, got)
	if len(got.Moves) == 0 {
		t.Fatalf("no moves: %v", got.Reasons)
	}
	for _, m := range got.Moves {
		if m.From != "rt-1" || m.To != "rt-2" || !strings.Contains(m.Reason, "demand 6.00 cores > 3.60 of its 4.00") {
			t.Errorf("move %+v", m)
		}
		if !strings.HasPrefix(m.Shard, "small.") {
			t.Errorf("moved %s: the job with most shards on the runtime should stay", m.Shard)
		}
	}
}

func TestDecideMigrationBudget(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.StragglerSpeed = 0.6 // off by default (policy.go): these tests turn it on
	p.MigrationBudget = 3
	rs := runtimes(4)
	rs[1].Speed = 0.3 // rt-2 is a straggler
	obs := Observations{Runtimes: rs, Shards: slices.Concat(
		steady("slow", 10, 1, "rt-2"),
		steady("new", 20, 1))} // unplaced: placed beyond the budget
	d := NewDecider()
	got := d.Decide(p, obs, at(0))
	checkPlacement(t, obs, got)
	voluntary := 0
	for _, m := range got.Moves {
		if m.From == "rt-2" {
			voluntary++
		}
	}
	if voluntary != 3 || len(got.Moves) != 23 {
		t.Fatalf("%d moves off the straggler (want 3), %d in all (want 23)", voluntary, len(got.Moves))
	}
	if !hasReason(got, "migration budget 3 spent; 7 voluntary moves wait") {
		t.Errorf("reasons: %v", got.Reasons)
	}
	if slices.Contains(got.Drain, "rt-2") {
		t.Errorf("rt-2 drained with shards on it")
	}
	// Applying the decision and deciding again moves 3 more.
	apply(&obs, got)
	got = d.Decide(p, obs, at(time.Second))
	if len(got.Moves) != 3 {
		t.Fatalf("second decision: %d moves, want 3", len(got.Moves))
	}
}

// apply makes the observations follow a decision, as the control loop would: shards move, drained
// runtimes go, and new runtimes up to Desired appear (rt-101, rt-102, ...).
func apply(obs *Observations, d Decision) {
	for i := range obs.Shards {
		if rt, ok := d.Placement[obs.Shards[i].Key]; ok {
			obs.Shards[i].Runtime = rt
		}
	}
	var kept []RuntimeObs
	for _, r := range obs.Runtimes {
		if !slices.Contains(d.Drain, r.ID) {
			kept = append(kept, r)
		}
	}
	for n := 0; len(kept) < d.Desired; n++ {
		id := "rt-" + strconv.Itoa(101+len(obs.Runtimes)+n)
		kept = append(kept, RuntimeObs{ID: id, Cores: 4, Since: d.At, Speed: 1})
	}
	obs.Runtimes = kept
}

func TestDecideStragglers(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.StragglerSpeed = 0.6 // off by default (policy.go): these tests turn it on
	p.MinRuntimes = 2      // no consolidation in this test
	rs := runtimes(3)
	rs[1].Speed = 0.4
	obs := Observations{Runtimes: rs, Shards: slices.Concat(
		steady("a", 4, 0.8, "rt-1"), steady("b", 4, 0.8, "rt-2"), steady("c", 4, 0.8, "rt-3"))}
	d := NewDecider()
	got := d.Decide(p, obs, at(0))
	checkPlacement(t, obs, got)
	if len(got.Moves) != 4 {
		t.Fatalf("moves %+v", got.Moves)
	}
	for _, m := range got.Moves {
		if m.From != "rt-2" || m.To == "rt-2" || m.Reason != "moved "+m.Shard+" off rt-2: straggler at 0.40x median" {
			t.Errorf("move %+v", m)
		}
	}
	// Emptied, it is drained; Desired counts its replacement until it is gone.
	if !slices.Equal(got.Drain, []string{"rt-2"}) {
		t.Errorf("drain %v", got.Drain)
	}
	if got.Desired != 2 {
		t.Errorf("desired %d, want 2 (rt-2 drained, 2 healthy)", got.Desired)
	}
	// Not emptied (no budget), it stays and Desired asks for its replacement on top.
	p.MigrationBudget = 0
	got = NewDecider().Decide(p, obs, at(0))
	if got.Desired != 3 || len(got.Drain) != 0 || len(got.Moves) != 0 {
		t.Errorf("budget 0: desired %d (want 3), drain %v, moves %d", got.Desired, got.Drain, len(got.Moves))
	}
	p.MigrationBudget = DefaultPolicy().MigrationBudget

	// A slow runtime inside its startup grace is not judged.
	p.MinRuntimes = 3
	rs = runtimes(3)
	rs[1].Speed, rs[1].Since = 0.4, at(-2*time.Second)
	obs.Runtimes = rs
	got = NewDecider().Decide(p, obs, at(0))
	if len(got.Moves) != 0 {
		t.Errorf("moved off a runtime in startup grace: %+v", got.Moves)
	}
	// It can receive shards, though.
	obs.Shards = append(obs.Shards, steady("n", 1, 0.5)...)
	rs[0].Cores, rs[2].Cores = 1, 1
	got = NewDecider().Decide(p, obs, at(0))
	if got.Placement["n.0"] != "rt-2" {
		t.Errorf("new shard placed on %s, want rt-2 (the only one with room)", got.Placement["n.0"])
	}
	// Straggler handling off.
	p.StragglerSpeed = 0
	rs = runtimes(3)
	rs[1].Speed = 0.1
	obs.Runtimes = rs
	got = NewDecider().Decide(p, obs, at(0))
	for _, m := range got.Moves {
		if strings.Contains(m.Reason, "straggler") {
			t.Errorf("straggler_speed 0 still judges stragglers: %+v", m)
		}
	}
	if len(got.Drain) != 0 || got.Desired != 3 {
		t.Errorf("straggler_speed 0: drain %v desired %d", got.Drain, got.Desired)
	}
}

func TestDecideScaleDownDrainsEmptiest(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.StableWindow = time.Second
	p.MaxScaleDownFraction = 1
	rs := runtimes(4)
	// 1.2 cores in all, fits on one runtime: the three emptiest are emptied and drained.
	obs := Observations{Runtimes: rs, Shards: slices.Concat(
		steady("a", 6, 0.6, "rt-1"), steady("b", 2, 0.2, "rt-2"), steady("c", 2, 0.2, "rt-3"), steady("d", 2, 0.2, "rt-4"))}
	d := NewDecider()
	got := d.Decide(p, obs, at(0))
	checkPlacement(t, obs, got)
	if got.Desired != 1 || !slices.Equal(got.Drain, []string{"rt-2", "rt-3", "rt-4"}) || runtimesUsed(got.Placement) != 1 {
		t.Fatalf("desired %d drain %v placement %v; %v", got.Desired, got.Drain, got.Placement, got.Reasons)
	}
	for _, m := range got.Moves {
		if m.To != "rt-1" || !strings.HasSuffix(m.Reason, "consolidating to drain it") {
			t.Errorf("move %+v", m)
		}
	}
	// With a budget of 1 only one victim can be emptied per decision; the others stay until then.
	p.MigrationBudget = 1
	got = NewDecider().Decide(p, obs, at(0))
	checkPlacement(t, obs, got)
	if len(got.Moves) != 1 || len(got.Drain) != 0 {
		t.Fatalf("budget 1: moves %+v drain %v", got.Moves, got.Drain)
	}
}

func TestDecideDeterministic(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	obs := bigObservations(2000, 40, 7)
	want := NewDecider().Decide(p, obs, at(0))
	rng := rand.New(rand.NewPCG(1, 2))
	for range 3 {
		shuffled := Observations{Runtimes: slices.Clone(obs.Runtimes), Shards: slices.Clone(obs.Shards)}
		rng.Shuffle(len(shuffled.Runtimes), func(i, j int) {
			shuffled.Runtimes[i], shuffled.Runtimes[j] = shuffled.Runtimes[j], shuffled.Runtimes[i]
		})
		rng.Shuffle(len(shuffled.Shards), func(i, j int) { shuffled.Shards[i], shuffled.Shards[j] = shuffled.Shards[j], shuffled.Shards[i] })
		got := NewDecider().Decide(p, shuffled, at(0))
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decision depends on the order of the observations")
		}
	}
	if len(want.Moves) == 0 {
		t.Fatalf("the scenario should move something")
	}
}

// bigObservations builds a pool of nRuntimes (a few slow) holding nShards of jobs of 100 shards with
// periods of 1-2s, random phases and 100-400ms bursts, placed at random, some unplaced.
func bigObservations(nShards, nRuntimes int, seed uint64) Observations {
	rng := rand.New(rand.NewPCG(seed, 99))
	obs := Observations{Runtimes: make([]RuntimeObs, nRuntimes)}
	for i := range obs.Runtimes {
		speed := 0.9 + 0.2*rng.Float64()
		if i%25 == 7 {
			speed = 0.3
		}
		obs.Runtimes[i] = RuntimeObs{ID: fmt.Sprintf("rt-%03d", i), Cores: 8, Since: t0.Add(-time.Hour), Speed: speed}
	}
	for j := 0; len(obs.Shards) < nShards; j++ {
		period := time.Second + time.Duration(rng.IntN(1000))*time.Millisecond
		phase := time.Duration(rng.Int64N(int64(period)))
		burst := time.Duration(100+rng.IntN(300)) * time.Millisecond
		ss := jobShards(fmt.Sprintf("job%04d", j), min(100, nShards-len(obs.Shards)), 0.002+0.004*rng.Float64(), period, phase, burst)
		for i := range ss {
			if rng.IntN(50) > 0 {
				ss[i].Runtime = obs.Runtimes[rng.IntN(nRuntimes)].ID
			}
		}
		obs.Shards = append(obs.Shards, ss...)
	}
	return obs
}

// BenchmarkDecide measures one decision; the goal is 10,000 shards on 200 runtimes in <= 50ms.
// Placed: a pool in use (2% of the shards unplaced, a few stragglers); Cold: nothing placed yet;
// Classes=3,AtMax: placed, the jobs in three priority classes, 20x the work and the pool at
// max_runtimes, so that placement weighs every runtime per class.
func BenchmarkDecide(b *testing.B) {
	for _, c := range []struct {
		shards, runtimes    int
		cold, classes, nics bool
	}{{1000, 20, false, false, false}, {10000, 200, false, false, false}, {10000, 200, true, false, false},
		{10000, 200, false, true, false}, {10000, 200, false, false, true}} {
		name := fmt.Sprintf("Shards=%d,Runtimes=%d,Placed", c.shards, c.runtimes)
		if c.cold {
			name = fmt.Sprintf("Shards=%d,Runtimes=%d,Cold", c.shards, c.runtimes)
		}
		if c.classes {
			name += ",Classes=3,AtMax"
		}
		if c.nics {
			name += ",NICs"
		}
		b.Run(name, func(b *testing.B) {
			p := DefaultPolicy()
			p.MaxRuntimes = 1000
			obs := bigObservations(c.shards, c.runtimes, 1)
			if c.cold {
				for i := range obs.Shards {
					obs.Shards[i].Runtime = ""
				}
			}
			if c.classes {
				p.MaxRuntimes = c.runtimes
				for i := range obs.Shards {
					obs.Shards[i].Priority = i/100%3 - 1 // by job (100 shards each)
					obs.Shards[i].Work *= 20             // 780 cores of demand: 244 runtimes wanted
				}
				if d := NewDecider().Decide(p, obs, at(0)); !hasReason(d, "priorities in force") {
					b.Fatalf("the pool is not short: %q", d.Reasons)
				}
			}
			if c.nics { // 50 nodes of 4 runtimes, their NICs near full
				for i := range obs.Runtimes {
					obs.Runtimes[i].Node, obs.Runtimes[i].NIC = strconv.Itoa(i/4), 12.5e6
				}
				for i := range obs.Shards {
					obs.Shards[i].BytesIn, obs.Shards[i].BytesOut = 40e3, 40e3
				}
			}
			b.ReportAllocs()
			var d Decision
			i := 0
			for b.Loop() {
				d = NewDecider().Decide(p, obs, at(time.Duration(i)*time.Millisecond))
				i++
			}
			b.ReportMetric(float64(len(d.Moves)), "moves")
		})
	}
}

func TestDecideIndependentJobsShareButRuntimesHoldTheirPeaks(t *testing.T) {
	t.Parallel()
	// Three jobs with periods of 1, 1.3 and 1.7s (their bursts drift against each other), each 0.3
	// core-s in a 100ms burst: 3 cores at the peak. As independent loads the pool needs mean + 2 sd
	// = 0.71 + 2 x 1.40 = 3.5 cores, not the 9 of their peaks: 2 runtimes. But each sits on a runtime
	// of its own at its peak, so the placement needs 3 and the pool does not shrink below that.
	p := DefaultPolicy()
	p.DelayBudget = 0
	obs := Observations{Runtimes: runtimes(3), Shards: slices.Concat(
		jobShards("a", 10, 0.03, 1000*time.Millisecond, 0, 100*time.Millisecond, "rt-1"),
		jobShards("b", 10, 0.03, 1300*time.Millisecond, 0, 100*time.Millisecond, "rt-2"),
		jobShards("c", 10, 0.03, 1700*time.Millisecond, 0, 100*time.Millisecond, "rt-3"))}
	got := NewDecider().Decide(p, obs, at(0))
	if got.Demand < 3.45 || got.Demand > 3.6 {
		t.Errorf("demand %.2f, want about 3.5", got.Demand)
	}
	if got.Desired != 3 || len(got.Moves) != 0 || !hasReason(got, "holding 3: the runtimes' own demands add up to 9.00 cores") {
		t.Errorf("desired %d, moves %d; %v", got.Desired, len(got.Moves), got.Reasons)
	}
	// Without packing every burst is assumed to coincide: 9 cores, 3 runtimes.
	p.Packing = false
	if got := NewDecider().Decide(p, obs, at(0)); got.Demand < 8.99 || got.Demand > 9.01 || got.Desired != 3 {
		t.Errorf("packing off: demand %.2f desired %d", got.Demand, got.Desired)
	}
}

func TestDecideAsksForRuntimesForShardsThatFitNowhere(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	rs := runtimes(2)
	rs[0].Cores, rs[1].Cores = 1, 1 // smaller than the policy's runtimes
	obs := Observations{Runtimes: rs, Shards: steady("big", 10, 2)}
	got := NewDecider().Decide(p, obs, at(0))
	checkPlacement(t, obs, got)
	if got.Desired <= 2 || !hasReason(got, "fit on no runtime") {
		t.Errorf("desired %d; %v", got.Desired, got.Reasons)
	}
	if len(got.Drain) != 0 {
		t.Errorf("drains %v while short of room", got.Drain)
	}
}

// The closed loop (slowdown_budget): a job whose measured slowdown (queue wait over period) misses
// the budget gets more headroom, at most once per headroom_period; one well inside it (below half)
// gets less; one in between keeps its headroom; the bounds hold; the planned demand follows.
func TestDecideFeedbackKeepsJobsWithinTheirBudget(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.SlowdownBudget = 0.02
	p.HeadroomPeriod = 10 * time.Second
	p.StableWindow = 5 * time.Second // the demand of each row, not the peak of the rows before
	const period = time.Second
	obs := func(hotWait, coolWait time.Duration) Observations {
		hot := jobShards("hot", 4, 0.1, period, 0, 200*time.Millisecond, "rt-1", "rt-2")
		cool := jobShards("cool", 4, 0.1, period, 500*time.Millisecond, 200*time.Millisecond, "rt-1", "rt-2")
		for i := range hot {
			hot[i].QueueWait, cool[i].QueueWait = hotWait, coolWait
		}
		hot[0].QueueWait = hotWait / 4 // the job's slowdown is its slowest shard's
		return Observations{Runtimes: runtimes(2), Shards: append(hot, cool...)}
	}
	d := NewDecider()
	off := NewDecider()
	pOff := p
	pOff.SlowdownBudget = 0
	for i, row := range []struct {
		at                time.Duration
		hotWait, coolWait time.Duration
		wantHot, wantCool float64
	}{
		{0, 100 * time.Millisecond, 0, 1.25, 0.9},                                         // 10% > 2%; 0% < 1%
		{time.Second, 100 * time.Millisecond, 0, 1.25, 0.9},                               // within headroom_period: held
		{10 * time.Second, 100 * time.Millisecond, 0, 1.5625, 0.81},                       // again
		{20 * time.Second, 15 * time.Millisecond, 5 * time.Millisecond, 1.5625, 0.729},    // hot 1.5%: inside, not well inside
		{30 * time.Second, 5 * time.Millisecond, 50 * time.Millisecond, 1.40625, 0.91125}, // hot well inside, cool missing
		{40 * time.Second, time.Second, time.Second, 1.7578125, 1.1390625},                // both miss (100%)
	} {
		o := obs(row.hotWait, row.coolWait)
		dec := d.Decide(p, o, at(row.at))
		open := off.Decide(pOff, o, at(row.at))
		hr := d.Headroom()
		if math.Abs(hr["hot"]-row.wantHot) > 1e-9 || math.Abs(hr["cool"]-row.wantCool) > 1e-9 {
			t.Errorf("row %d at %v: headroom hot %v cool %v, want %v %v; reasons %q", i, row.at, hr["hot"], hr["cool"], row.wantHot, row.wantCool, dec.Reasons)
		}
		if len(off.Headroom()) != 0 {
			t.Fatalf("headroom with the feedback off: %v", off.Headroom())
		}
		// The hot job's work counts for more than measured, the cool one's for less: on the whole,
		// more here.
		if dec.Demand <= open.Demand+1e-9 {
			t.Errorf("row %d: demand %.3f with feedback, %.3f without", i, dec.Demand, open.Demand)
		}
		checkPlacement(t, o, dec)
	}
	if !hasReason(d.Decide(p, obs(time.Second, 0), at(time.Minute)), "headroom up for 1 jobs over the 2.0% slowdown budget: hot 1.76->2.20 at 100.0%") {
		t.Errorf("no reason names the job whose headroom grew")
	}
}

// A job missing its budget on its own: its headroom grows to the bound and the pool grows with it;
// well inside, it shrinks to the lower bound and the pool follows it down. A job no longer observed
// is forgotten; one whose period is unknown keeps its headroom.
func TestDecideFeedbackMovesThePool(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.SlowdownBudget = 0.02
	p.HeadroomPeriod = 0
	p.StableWindow, p.ScaleDownCooldown = time.Second, 0
	p.MaxScaleDownFraction = 1
	shards := func(wait time.Duration, period time.Duration) []ShardObs {
		ss := jobShards("j", 8, 0.5, time.Second, 0, 400*time.Millisecond, "rt-1", "rt-2")
		for i := range ss {
			ss[i].QueueWait, ss[i].Period = wait, period
		}
		return ss
	}
	d := NewDecider()
	var desired []int
	for i := range 10 { // missing: 25% more each decision, up to 4
		dec := d.Decide(p, Observations{Runtimes: runtimes(2), Shards: shards(200*time.Millisecond, time.Second)}, at(time.Duration(i)*2*time.Second))
		desired = append(desired, dec.Desired)
	}
	if hr := d.Headroom()["j"]; hr != maxHeadroom {
		t.Errorf("headroom %v after 10 decisions missing the budget, want the bound %v", hr, float64(maxHeadroom))
	}
	t.Logf("desired runtimes while missing the budget: %v", desired)
	if desired[len(desired)-1] <= desired[0] {
		t.Errorf("desired runtimes %v: the pool did not grow with the headroom", desired)
	}
	grown := desired[len(desired)-1]
	// Period unknown (a restarted job): no measurement, the headroom stays.
	d.Decide(p, Observations{Runtimes: runtimes(grown), Shards: shards(0, 0)}, at(time.Minute))
	if hr := d.Headroom()["j"]; hr != maxHeadroom {
		t.Errorf("headroom %v with no measured period, want it kept", hr)
	}
	var last Decision
	for i := range 20 { // well inside: 10% less each decision, down to 0.5
		last = d.Decide(p, Observations{Runtimes: runtimes(grown), Shards: shards(0, time.Second)}, at(2*time.Minute+time.Duration(i)*2*time.Second))
	}
	if hr := d.Headroom()["j"]; hr != minHeadroom {
		t.Errorf("headroom %v after 20 decisions well inside the budget, want the bound %v", hr, minHeadroom)
	}
	t.Logf("desired runtimes well inside the budget: %d", last.Desired)
	if last.Desired >= grown {
		t.Errorf("desired %d, from %d: the pool did not shrink with the headroom", last.Desired, grown)
	}
	d.Decide(p, Observations{Runtimes: runtimes(1)}, at(time.Hour))
	if len(d.Headroom()) != 0 {
		t.Errorf("headroom of jobs gone: %v", d.Headroom())
	}
}
