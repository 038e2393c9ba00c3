package autoscaler

import (
	"slices"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/internal/view"
	"github.com/fanin-ml/fanin/wire"
)

// loadOn sums the steady work (cores) the shards put on each runtime of a placement.
func loadOn(obs Observations, pl map[string]string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range obs.Shards {
		if rt, ok := pl[s.Key]; ok {
			out[rt] += s.Work
		}
	}
	return out
}

// A pool whose total capacity suffices but whose per-runtime fragments would not does not scale
// up: three runtimes of 4 cores (3.2 at the 80% target) each hold 3 cores; a new shard of 0.5
// cores fits within target on none of them, but the pool's 9.5 cores are within its 9.6, so the
// shard goes to a runtime up to its move threshold (3.6) and no runtime is asked for. Likewise an
// overloaded runtime's shards that fit within target nowhere spill to runtimes that stay within
// the threshold. Short of capacity the pool grows, by its demand.
func TestDecideFragmentsDoNotScaleUpAPoolWithCapacity(t *testing.T) {
	t.Parallel()
	on := []string{"rt-1", "rt-2", "rt-3"}
	for _, tc := range []struct {
		name        string
		shards      []ShardObs
		desired     int
		moves       int // voluntary moves (placing the unplaced not counted)
		maxLoad     float64
		fitsNowhere bool // the reason "fit on no runtime" (a scale-up for fragments)
	}{
		{"a new shard over target, pool within capacity", append(steady("a", 6, 9, on...), steady("b", 1, 0.5)...), 3, 0, 3.5, false},
		{"an overloaded runtime spills", append(steady("a", 6, 8.4, on...), steady("c", 2, 0.9, "rt-1")...), 3, 2, 3.25, false},
		{"pool short of capacity", append(steady("a", 6, 9, on...), steady("b", 2, 1)...), 4, 0, 3.5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := Observations{Runtimes: runtimes(3), Shards: tc.shards}
			got := NewDecider().Decide(DefaultPolicy(), obs, at(0))
			checkPlacement(t, obs, got)
			moves := 0
			for _, m := range got.Moves {
				if m.From != "" {
					moves++
				}
			}
			mx := 0.0
			for _, l := range loadOn(obs, got.Placement) {
				mx = max(mx, l)
			}
			if got.Desired != tc.desired || moves != tc.moves || mx > tc.maxLoad+1e-9 || hasReason(got, "fit on no runtime") != tc.fitsNowhere {
				t.Errorf("desired %d (want %d), %d moves (want %d), most loaded runtime %.2f cores (want <= %.2f); reasons %q",
					got.Desired, tc.desired, moves, tc.moves, mx, tc.maxLoad, got.Reasons)
			}
		})
	}
}

// Placement spreads a burst: a new job's shards, all bursting at once, go to different runtimes
// (a slice of its peak on each) rather than filling the first runtime with room; and a burst of
// steady work on an unevenly loaded pool evens the runtimes out.
func TestDecideSpreadsABurstOverRuntimes(t *testing.T) {
	t.Parallel()
	// Four shards of 0.1 core-s in a 100 ms burst every second: 0.83 cores each at the peak with
	// the 2% delay budget; first-fit would put three on one runtime.
	// (min_runtimes 4: the pool does not shrink under the test.)
	p := DefaultPolicy()
	p.MinRuntimes = 4
	obs := Observations{Runtimes: runtimes(4), Shards: jobShards("burst", 4, 0.1, time.Second, 0, 100*time.Millisecond)}
	got := NewDecider().Decide(p, obs, at(0))
	checkPlacement(t, obs, got)
	if n := runtimesUsed(got.Placement); n != 4 {
		t.Errorf("the burst's 4 shards are on %d runtimes, want 4: %v", n, got.Placement)
	}

	// Runtimes holding 0, 1, 2 and 3 cores; 4 cores arrive as 8 shards of 0.5: the three below 3
	// cores end within one shard of each other, and the one at 3 takes none.
	obs = Observations{Runtimes: runtimes(4), Shards: append(append(append(
		steady("one", 2, 1, "rt-2"), steady("two", 4, 2, "rt-3")...), steady("three", 6, 3, "rt-4")...),
		steady("new", 8, 4)...)}
	got = NewDecider().Decide(DefaultPolicy(), obs, at(0))
	checkPlacement(t, obs, got)
	lo, hi := 100.0, 0.0
	for _, id := range []string{"rt-1", "rt-2", "rt-3"} {
		l := loadOn(obs, got.Placement)[id]
		lo, hi = min(lo, l), max(hi, l)
	}
	if hi-lo > 0.5+1e-9 || loadOn(obs, got.Placement)["rt-4"] != 3 {
		t.Errorf("runtime loads from %.2f to %.2f cores after the burst, want within one shard (0.5): %v", lo, hi, loadOn(obs, got.Placement))
	}
}

// cores_per_runtime 0: runtimes sized to their machine. The pool counts in the cores its runtimes
// report (the median of the healthy ones), so 30 cores of work on 16-core runtimes want 3 of them
// (30 / 12.8), not the 10 of 4 cores; with no runtime reporting yet the pool grows one at a time.
func TestDecideRuntimesSizedToTheirMachine(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.CoresPerRuntime = 0
	if err := p.Validate(); err != nil {
		t.Fatalf("cores_per_runtime 0 refused: %v", err)
	}
	big := runtimes(3)
	big[0].Cores, big[1].Cores, big[2].Cores = 16, 16, 8
	work := steady("j", 60, 30, "rt-1", "rt-2", "rt-3")
	draining := slices.Clone(big) // a rolling replacement: every runtime drains
	for i := range draining {
		draining[i].Draining = true
	}
	for _, tc := range []struct {
		name    string
		rts     []RuntimeObs
		cores   int
		desired int
		reason  string
	}{
		{"machine-sized", big, 0, 3, "3 runtimes of 16 cores at 80%"},
		{"fixed 4 cores", big, 4, 10, "10 runtimes of 4 cores at 80%"},
		{"none reports yet", nil, 0, 1, ""},
		{"all draining", draining, 0, 3, "panic: sized for 30.00 cores"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p.CoresPerRuntime = tc.cores
			shards := work
			if tc.rts == nil {
				shards = steady("j", 60, 30)
			}
			got := NewDecider().Decide(p, Observations{Runtimes: tc.rts, Shards: shards}, at(0))
			if got.Desired != tc.desired || tc.reason != "" && !hasReason(got, tc.reason) {
				t.Errorf("desired %d, want %d with the reason %q; reasons %q", got.Desired, tc.desired, tc.reason, got.Reasons)
			}
		})
	}
}

// Before its first load report a runtime counts with the cores of its registration, not as one
// core (which, with cores_per_runtime 0, would size the pool in 1-core runtimes).
func TestObserveTakesCoresFromTheRegistration(t *testing.T) {
	t.Parallel()
	snap := view.Snapshot{Runtimes: map[string]view.Runtime{
		"rt-a": {RuntimeInfo: wire.RuntimeInfo{ID: "rt-a", Cores: 16}, Beat: t0, Registered: t0},
	}}
	obs := (&Controller{}).observe(snap, t0, -1)
	if len(obs.Runtimes) != 1 || obs.Runtimes[0].Cores != 16 {
		t.Fatalf("observed %+v, want rt-a with 16 cores", obs.Runtimes)
	}
}
