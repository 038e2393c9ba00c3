package autoscaler

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/internal/view"
	"github.com/fanin-ml/fanin/job"
)

// withPriority sets the class of a job's shards.
func withPriority(ss []ShardObs, cls int) []ShardObs {
	for i := range ss {
		ss[i].Priority = cls
	}
	return ss
}

// classLoadOn sums the steady work (cores) of the shards of each class on each runtime of a placement.
func classLoadOn(obs Observations, pl map[string]string) map[string][3]float64 {
	out := map[string][3]float64{}
	for _, s := range obs.Shards {
		rt, ok := pl[s.Key]
		if !ok {
			continue
		}
		v := out[rt]
		v[s.Priority+1] += s.Work
		out[rt] = v
	}
	return out
}

// At max_runtimes, a high job and a low job compete: rt-1 holds a high job, rt-2 a low one, each
// 3 cores of its 4 (3.2 at target utilization), and a second high job of 2 cores arrives; the pool
// wants 3 runtimes and may have 2. With priorities the new high job goes where the high load is
// (rt-2: no high work), and the low job's shards it crowds are packed up to the cores, moving to
// rt-1's spare cores: every runtime's high load stays within its headroom (3.2 cores), and the low
// work fills the rest. Without priorities (every job normal) the new job's shards fit nowhere and
// are spread over both runtimes: rt-1's high load is 4 cores, no headroom. Below max_runtimes the
// classes change nothing.
func TestDecidePrioritiesAtMaxRuntimes(t *testing.T) {
	t.Parallel()
	build := func(prio bool) Observations {
		h1 := jobShards("h1", 6, 0.5, time.Second, 0, time.Second, "rt-1")
		lo := jobShards("lo", 6, 0.5, time.Second, 0, time.Second, "rt-2")
		h2 := jobShards("h2", 4, 0.5, time.Second, 0, time.Second, "")
		if prio {
			withPriority(h1, PriorityHigh)
			withPriority(lo, PriorityLow)
			withPriority(h2, PriorityHigh)
		}
		return Observations{Runtimes: runtimes(2), Shards: append(append(h1, lo...), h2...)}
	}
	highOf := func(obs Observations, pl map[string]string) map[string]float64 {
		out := map[string]float64{}
		for _, s := range obs.Shards {
			if s.Job != "lo" {
				out[pl[s.Key]] += s.Work
			}
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		max      int
		prio     bool
		headroom bool // every runtime's high load within its 3.2 cores at target utilization
	}{
		{"at max, priorities", 2, true, true},
		{"at max, all normal", 2, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultPolicy()
			p.MaxRuntimes = tc.max
			obs := build(tc.prio)
			d := NewDecider()
			var dec Decision
			for i := range 3 { // place, then let the overflow settle
				dec = d.Decide(p, obs, at(time.Duration(i)*time.Second))
				checkPlacement(t, obs, dec)
				apply(&obs, dec)
			}
			if dec.Desired != tc.max || len(dec.Placement) != len(obs.Shards) {
				t.Fatalf("desired %d, %d of %d shards placed; reasons %q", dec.Desired, len(dec.Placement), len(obs.Shards), dec.Reasons)
			}
			if hasReason(dec, "priorities in force") != tc.prio {
				t.Errorf("priorities in force %v, reasons %q", tc.prio, dec.Reasons)
			}
			high := highOf(obs, dec.Placement)
			ok := true
			for rt, l := range classLoadOn(obs, dec.Placement) {
				total := l[0] + l[1] + l[2]
				t.Logf("%s: high jobs %.2f cores, total %.2f", rt, high[rt], total)
				if high[rt] > 3.2+1e-9 {
					ok = false
				}
				if tc.prio && total > 4+1e-9 {
					t.Errorf("%s holds %.2f cores of work on 4 cores: the low job is packed beyond the cores", rt, total)
				}
			}
			if ok != tc.headroom {
				t.Errorf("high load within its headroom on every runtime: %v, want %v; placement %v", ok, tc.headroom, dec.Placement)
			}
		})
	}

	// Below max_runtimes the classes change nothing: the same decisions, bit for bit.
	p := DefaultPolicy()
	p.MaxRuntimes = 10
	plain, classed := NewDecider(), NewDecider()
	o1, o2 := build(false), build(true)
	for i := range 3 {
		d1, d2 := plain.Decide(p, o1, at(time.Duration(i)*time.Second)), classed.Decide(p, o2, at(time.Duration(i)*time.Second))
		if !reflect.DeepEqual(d1, d2) {
			t.Fatalf("decision %d below max_runtimes depends on the classes:\n%+v\n%+v", i, d1, d2)
		}
		if d1.Desired < 3 {
			t.Fatalf("the scenario should want 3 runtimes below max, wants %d", d1.Desired)
		}
		apply(&o1, d1)
		apply(&o2, d2)
	}
}

// The closed loop at max_runtimes: a high job and a low job both miss the slowdown budget. While
// the pool is short the high job's headroom grows and the low one's is held; once the pool is no
// longer short (a higher max_runtimes) both grow. A low job well inside the budget still shrinks.
func TestDecideFeedbackHoldsLowJobsWhilePoolIsShort(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.SlowdownBudget = 0.02
	p.HeadroomPeriod = 0
	shards := func(loWait time.Duration) []ShardObs {
		hi := withPriority(jobShards("hi", 8, 0.5, time.Second, 0, time.Second, "rt-1", "rt-2"), PriorityHigh)
		lo := withPriority(jobShards("lo", 8, 0.5, time.Second, 0, time.Second, "rt-1", "rt-2"), PriorityLow)
		for i := range hi {
			hi[i].QueueWait, lo[i].QueueWait = 100*time.Millisecond, loWait
		}
		return append(hi, lo...)
	}
	d := NewDecider()
	for i, row := range []struct {
		max            int
		loWait         time.Duration
		wantHi, wantLo float64
		reason         string
	}{
		// The first decision finds the pool short (8 cores of work, 6.4 at target): it cannot know
		// before, so both grow once.
		{2, 100 * time.Millisecond, 1.25, 1.25, ""},
		{2, 100 * time.Millisecond, 1.5625, 1.25, "headroom held for 1 low-priority jobs over the 2.0% slowdown budget while the pool is short: lo 1.25 at 10.0%"},
		{2, 100 * time.Millisecond, 1.953125, 1.25, "while the pool is short"},
		{2, 0, 2.44140625, 1.125, "headroom down for 1 jobs"},  // well inside: it shrinks even when short
		{100, 100 * time.Millisecond, 3.0517578125, 1.125, ""}, // the last decision was short: held once more
		{100, 100 * time.Millisecond, 3.814697265625, 1.40625, ""},
	} {
		p.MaxRuntimes = row.max
		dec := d.Decide(p, Observations{Runtimes: runtimes(2), Shards: shards(row.loWait)}, at(time.Duration(i)*time.Second))
		hr := d.Headroom()
		if math.Abs(hr["hi"]-row.wantHi) > 1e-9 || math.Abs(hr["lo"]-row.wantLo) > 1e-9 {
			t.Errorf("row %d (max %d): headroom hi %v lo %v, want %v %v; reasons %q", i, row.max, hr["hi"], hr["lo"], row.wantHi, row.wantLo, dec.Reasons)
		}
		if row.reason != "" && !hasReason(dec, row.reason) {
			t.Errorf("row %d: no reason %q in %q", i, row.reason, dec.Reasons)
		}
	}
}

// The control loop gives every shard its job's class from the job's record; a record stored before
// priorities existed reads as normal.
func TestObserveTakesPriorityFromTheRecord(t *testing.T) {
	t.Parallel()
	snap := view.Snapshot{Jobs: map[string]job.Record{}}
	for id, prio := range map[string]string{"hi": job.PriorityHigh, "lo": job.PriorityLow, "old": ""} {
		s := job.Spec{ID: id, Tensors: []job.Tensor{{Name: "w", Shape: []int{4096}}}, Ranks: 2,
			Function: job.Function{Name: "sum"}, ShardSize: 4096, Priority: prio}
		snap.Jobs[id] = job.NewRecord(s, t0)
	}
	want := map[string]int{"hi": PriorityHigh, "lo": PriorityLow, "old": PriorityNormal}
	obs := (&Controller{}).observe(snap, t0, -1)
	if len(obs.Shards) != 12 {
		t.Fatalf("%d shards observed, want 12", len(obs.Shards))
	}
	for _, s := range obs.Shards {
		if s.Priority != want[s.Job] {
			t.Errorf("shard %s: priority %d, want %d", s.Key, s.Priority, want[s.Job])
		}
	}
}

// With priorities in force the decisions still depend only on the observations, not their order.
func TestDecidePrioritiesDeterministic(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	obs := bigObservations(2000, 40, 7)
	p.MaxRuntimes = 40
	for i := range obs.Shards {
		obs.Shards[i].Priority = i/100%3 - 1
		obs.Shards[i].Work *= 20
	}
	want := NewDecider().Decide(p, obs, at(0))
	if !hasReason(want, "priorities in force") || len(want.Moves) == 0 {
		t.Fatalf("the scenario should be short and move something: %q", want.Reasons)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 3 {
		shuffled := Observations{Runtimes: slices.Clone(obs.Runtimes), Shards: slices.Clone(obs.Shards)}
		rng.Shuffle(len(shuffled.Runtimes), func(i, j int) {
			shuffled.Runtimes[i], shuffled.Runtimes[j] = shuffled.Runtimes[j], shuffled.Runtimes[i]
		})
		rng.Shuffle(len(shuffled.Shards), func(i, j int) { shuffled.Shards[i], shuffled.Shards[j] = shuffled.Shards[j], shuffled.Shards[i] })
		if got := NewDecider().Decide(p, shuffled, at(0)); !reflect.DeepEqual(got, want) {
			t.Fatalf("decision depends on the order of the observations")
		}
	}
}

// A runtime overloaded by its low class sheds low shards, not high ones: rt-1 holds a high job of
// 3.5 cores (within the high class's limit) and a low job of 0.8 (4.3 in all, over the cores),
// rt-2 a normal job of 3, and the pool is short (it wants 3 runtimes, max_runtimes is 2). The low
// shards are the ones to move; the high job keeps its runtime and pays no migration pause.
func TestDecideOverloadByLowClassMovesLowShards(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.MaxRuntimes = 2
	hi := withPriority(jobShards("hi", 7, 0.5, time.Second, 0, time.Second, "rt-1"), PriorityHigh)
	lo := withPriority(jobShards("lo", 2, 0.4, time.Second, 0, time.Second, "rt-1"), PriorityLow)
	no := jobShards("no", 6, 0.5, time.Second, 0, time.Second, "rt-2")
	obs := Observations{Runtimes: runtimes(2), Shards: append(append(hi, lo...), no...)}
	d := NewDecider()
	for i := range 3 {
		dec := d.Decide(p, obs, at(time.Duration(i)*time.Second))
		checkPlacement(t, obs, dec)
		if !hasReason(dec, "priorities in force") {
			t.Fatalf("decision %d: the pool should be short with priorities in force; reasons %q", i, dec.Reasons)
		}
		for _, m := range dec.Moves {
			if sh := obs.Shards[slices.IndexFunc(obs.Shards, func(s ShardObs) bool { return s.Key == m.Shard })]; sh.Job == "hi" {
				t.Errorf("decision %d moves high shard %s (%s -> %s) off a runtime overloaded by the low class; reasons %q", i, m.Shard, m.From, m.To, dec.Reasons)
			}
		}
		apply(&obs, dec)
	}
}

// A pool short only because a low shard fits nowhere until priorities pack it: max_runtimes 2,
// a high job of 2 x 2.6 cores (one shard on each 4-core runtime) and a low shard of 1.1 cores
// (6.3 cores in all, within the pool's 6.4 at target, so the demand alone never caps it). With
// priorities the low shard is packed beside a high one; the pool stays short (and the priorities
// in force) for the stable window, instead of turning them off at the next decision, finding the
// low shard homeless again and moving it back and forth.
func TestDecideShortPoolIsHeld(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.MaxRuntimes = 2
	hi := withPriority(jobShards("hi", 2, 2.6, time.Second, 0, time.Second, "rt-1", "rt-2"), PriorityHigh)
	lo := withPriority(jobShards("lo", 1, 1.1, time.Second, 0, time.Second, ""), PriorityLow)
	obs := Observations{Runtimes: runtimes(2), Shards: append(hi, lo...)}
	d := NewDecider()
	moves := 0
	for i := range 8 {
		dec := d.Decide(p, obs, at(time.Duration(i)*time.Second))
		checkPlacement(t, obs, dec)
		if i > 0 && !hasReason(dec, "priorities in force") {
			t.Errorf("decision %d: priorities not in force %ds after the pool was short; reasons %q", i, i, dec.Reasons)
		}
		if i > 0 {
			moves += len(dec.Moves)
		}
		apply(&obs, dec)
	}
	if moves != 0 {
		t.Errorf("%d moves after the low shard was placed, want none", moves)
	}
}
