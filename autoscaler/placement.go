package autoscaler

import (
	"cmp"
	"math"
	"slices"
)

// candidates is how many of the least loaded runtimes placement weighs a shard on.
const candidates = 4

type shardState struct {
	obs   *ShardObs
	g     int     // group
	w     float64 // work
	from  int     // observed runtime index; -1 unplaced or on a runtime that is not observed
	to    int     // decided runtime index; -1 unplaced
	cause string  // why it moves
}

type rtState struct {
	obs       RuntimeObs
	speed     float64 // Speed, 0 read as 1
	hardCap   float64 // cores x speed: above it work queues
	fitCap    float64 // hardCap x target utilization: what placement fills to
	load      load
	nShards   int
	work      float64
	grace     bool // inside startup grace
	draining  bool // observed draining
	straggler bool
	victim    bool // chosen to be emptied and drained (scale down)
}

func (r *rtState) eligible() bool { return !r.draining && !r.straggler && !r.victim }

// moveCap is the load above which shards move off a runtime: midway between its share at target
// utilization and its full capacity.
func (r *rtState) moveCap() float64 { return (r.fitCap + r.hardCap) / 2 }

func (r *rtState) ratio() float64 { return r.load.demand / max(r.fitCap, eps) }

// chooseVictims marks the n emptiest healthy runtimes (fewest shards, then least work, then id) to
// be emptied and drained.
func chooseVictims(rts []*rtState, shards []shardState, n int) {
	count := make([]int, len(rts))
	work := make([]float64, len(rts))
	for _, s := range shards {
		if s.from >= 0 {
			count[s.from]++
			work[s.from] += s.w
		}
	}
	var cand []int
	for i, r := range rts {
		if !r.draining && !r.straggler {
			cand = append(cand, i)
		}
	}
	slices.SortStableFunc(cand, func(a, b int) int {
		return cmp.Or(cmp.Compare(count[a], count[b]), cmp.Compare(work[a], work[b]))
	})
	for _, i := range cand[:min(n, len(cand))] {
		rts[i].victim = true
	}
}

// victimOrder lists the victims, emptiest first.
func victimOrder(rts []*rtState) []int {
	var v []int
	for i, r := range rts {
		if r.victim {
			v = append(v, i)
		}
	}
	slices.SortStableFunc(v, func(a, b int) int {
		return cmp.Or(cmp.Compare(rts[a].nShards, rts[b].nShards), cmp.Compare(rts[a].work, rts[b].work))
	})
	return v
}

// overflow returns the shards of an over-capacity runtime that do not fit when its shards are
// re-added job by job, the jobs with most shards on it first (they stay; the small ones move).
func overflow(m *model, r *rtState, ks []int, shards []shardState) []int {
	per := map[int]int{}
	for _, k := range ks {
		per[shards[k].g]++
	}
	sorted := slices.Clone(ks)
	slices.SortStableFunc(sorted, func(a, b int) int {
		ga, gb := shards[a].g, shards[b].g
		return cmp.Or(cmp.Compare(per[gb], per[ga]), cmp.Compare(m.groups[ga].job, m.groups[gb].job), cmp.Compare(ga, gb))
	})
	scratch := m.newLoad()
	var out []int
	for _, k := range sorted {
		s := &shards[k]
		if scratch.demandAfter(s.g, s.w) <= r.fitCap+eps {
			scratch.add(s.g, s.w)
		} else {
			out = append(out, k)
		}
	}
	return out
}

func (r *rtState) place(g int, w float64) {
	r.load.add(g, w)
	r.nShards++
	r.work += w
}

func (r *rtState) unplace(g int, w float64) {
	r.load.remove(g, w)
	r.nShards--
	r.work -= w
}

// placer puts shards on the eligible runtimes (healthy, not draining, not victims): each on the
// least loaded one (demand over capacity at target utilization) where it fits. Balancing, not
// first-fit: first-fit would fill a runtime with one job at its peak, which is static provisioning
// by another name, while spreading gives every runtime a slice of many jobs whose bursts seldom
// coincide. How few runtimes there are is the pool size's business (Desired, and draining the
// emptiest), not placement's.
type placer struct {
	m      *model
	rts    []*rtState
	shards []shardState
	elig   []int
	full   map[int]float64 // group -> least work that found no room in this decision
	// homeless is the demand of the shards that fit on no runtime, each counted alone.
	homeless float64
}

// alone is the demand of shard k on an empty runtime.
func (pl *placer) alone(k int) float64 {
	s := &pl.shards[k]
	l := pl.m.newLoad()
	return l.demandAfter(s.g, s.w)
}

func newPlacer(m *model, rts []*rtState, shards []shardState) *placer {
	pl := &placer{m: m, rts: rts, shards: shards, full: map[int]float64{}}
	for i, r := range rts {
		if r.eligible() {
			pl.elig = append(pl.elig, i)
		}
	}
	return pl
}

// target returns the eligible runtime other than not where shard k fits at target utilization, or
// -1. Of the candidates least loaded now it takes the one least loaded once the shard is on it: a
// runtime that already holds the shard's job at its peak grows more than one that holds other jobs.
func (pl *placer) target(k, not int) int {
	s := &pl.shards[k]
	var best [candidates]int
	n := 0
	for _, i := range pl.elig {
		if i == not {
			continue
		}
		// Insert i into the n least loaded so far, kept sorted by ratio then index.
		j := n
		for j > 0 && pl.rts[i].ratio() < pl.rts[best[j-1]].ratio() {
			j--
		}
		if j >= candidates {
			continue
		}
		if n < candidates {
			n++
		}
		copy(best[j+1:n], best[j:n-1])
		best[j] = i
	}
	to, toRatio := -1, math.Inf(1)
	for _, i := range best[:n] {
		r := pl.rts[i]
		if d := r.load.demandAfter(s.g, s.w); d <= r.fitCap+eps && d/r.fitCap < toRatio {
			to, toRatio = i, d/r.fitCap
		}
	}
	if to >= 0 || n < candidates {
		return to
	}
	// None of them has room; try the others, unless a shard of the same group that was no bigger
	// found no room already.
	if w, ok := pl.full[s.g]; ok && s.w >= w {
		return -1
	}
	cand := slices.DeleteFunc(slices.Clone(pl.elig), func(i int) bool { return i == not || slices.Contains(best[:n], i) })
	slices.SortStableFunc(cand, func(a, b int) int { return cmp.Compare(pl.rts[a].ratio(), pl.rts[b].ratio()) })
	for _, i := range cand {
		if r := pl.rts[i]; r.load.demandAfter(s.g, s.w) <= r.fitCap+eps {
			return i
		}
	}
	pl.full[s.g] = s.w
	return -1
}

// placeAll places shards that have no runtime, jobs in decreasing order of work. A shard that fits
// nowhere goes to the least loaded runtime anyway (over capacity: the pool grows). It returns how
// many shards could not be placed at all (no runtime).
func (pl *placer) placeAll(ks []int) int {
	gw := map[int]float64{}
	for _, k := range ks {
		gw[pl.shards[k].g] += pl.shards[k].w
	}
	slices.SortStableFunc(ks, func(a, b int) int {
		ga, gb := pl.shards[a].g, pl.shards[b].g
		return cmp.Or(cmp.Compare(gw[gb], gw[ga]), cmp.Compare(ga, gb))
	})
	failed := 0
	for _, k := range ks {
		s := &pl.shards[k]
		to := pl.target(k, -1)
		if to < 0 {
			pl.homeless += pl.alone(k)
			for i, r := range pl.rts { // fallback: least loaded, eligible ones first
				if r.draining {
					continue
				}
				if to < 0 || r.eligible() && !pl.rts[to].eligible() ||
					r.eligible() == pl.rts[to].eligible() && r.ratio() < pl.rts[to].ratio() {
					to = i
				}
			}
		}
		if to < 0 {
			failed++
			continue
		}
		pl.rts[to].place(s.g, s.w)
		s.to = to
	}
	return failed
}

// move moves one placed shard to another eligible runtime where it fits; it reports whether it did.
func (pl *placer) move(k int) bool {
	s := &pl.shards[k]
	to := pl.target(k, s.to)
	if to < 0 {
		return false
	}
	pl.rts[s.to].unplace(s.g, s.w)
	pl.rts[to].place(s.g, s.w)
	s.to = to
	return true
}
