package autoscaler

import (
	"cmp"
	"slices"
)

// candidates is how many of the least loaded runtimes placement weighs a shard on.
const candidates = 4

type shardState struct {
	obs   *ShardObs
	g     int     // group
	w     float64 // work
	cls   int     // priority class: PriorityLow, PriorityNormal or PriorityHigh
	from  int     // observed runtime index; -1 unplaced or on a runtime that is not observed
	to    int     // decided runtime index; -1 unplaced
	cause string  // why it moves
	// in and out are the bytes per second it is planned for through its runtime's node (nic.go).
	in, out float64
}

// size is the shard's bytes per second through its node's NIC, the busier direction.
func (s *shardState) size() float64 { return max(s.in, s.out) }

type rtState struct {
	obs     RuntimeObs
	speed   float64 // Speed, 0 read as 1
	hardCap float64 // cores x speed: above it work queues
	fitCap  float64 // hardCap x target utilization: what placement fills to
	load    load
	node    *nodeState // its node's NIC; nil when no runtime's NIC is known (bytes are not counted)
	// up is nil unless priorities are in force (see round.prio): then up[0] is the load of the
	// normal and high shards, up[1] that of the high ones, what a shard of each class competes with.
	up        []load
	nShards   int
	work      float64
	grace     bool // inside startup grace
	draining  bool // observed draining
	straggler bool
	victim    bool // chosen to be emptied and drained (scale down)
	unknown   bool // its node and NIC not reported yet while other runtimes' are (nodes)
}

func (r *rtState) eligible() bool { return !r.draining && !r.straggler && !r.victim && !r.unknown }

// moveCap is the load above which shards move off a runtime: midway between its share at target
// utilization and its full capacity.
func (r *rtState) moveCap() float64 { return (r.fitCap + r.hardCap) / 2 }

// Priorities. While the pool is short (it wants more runtimes than max_runtimes allows) and its
// shards are of more than one class, a runtime is weighed per class: the runtime gives its cores to
// ready high work before normal before low (runtime/cpu.go), so a shard is slowed by its own class
// and the classes above it, not by those below. A high or normal shard then fits where the load of
// its class and above stays within fitCap (its headroom); a low shard fits where the whole load
// stays within hardCap (packed: it absorbs the slowdown). Otherwise every class sees the whole
// load and fitCap, as before priorities existed.

// loadFor is the load a shard of class cls competes with on the runtime.
func (r *rtState) loadFor(cls int) *load {
	if r.up == nil || cls < PriorityNormal {
		return &r.load
	}
	return &r.up[min(cls, PriorityHigh)]
}

// capFor is what placement fills the runtime to with shards of class cls.
func (r *rtState) capFor(cls int) float64 {
	if r.up != nil && cls < PriorityNormal {
		return r.hardCap
	}
	return r.fitCap
}

// moveCapFor is the load of class cls and above beyond which its shards move off: midway between
// capFor and the full capacity.
func (r *rtState) moveCapFor(cls int) float64 { return (r.capFor(cls) + r.hardCap) / 2 }

// fill is how full a runtime is, at target utilization: ratio, the fuller of its cores and its
// node's NIC, and cores, its cores alone. Runtimes compare by ratio, then by cores: runtimes of one
// node share its NIC's fill, and while that NIC is the fuller their cores still balance.
type fill struct{ ratio, cores float64 }

func newFill(cores, nic float64) fill { return fill{max(cores, nic), cores} }

// compare orders fills, the emptier first; fills within eps of each other are equal.
func (a fill) compare(b fill) int {
	switch {
	case a.ratio < b.ratio-eps:
		return -1
	case a.ratio > b.ratio+eps:
		return 1
	case a.cores < b.cores-eps:
		return -1
	case a.cores > b.cores+eps:
		return 1
	}
	return 0
}

// fillFor is how full the runtime is for a shard of class cls (without priorities, for any shard).
func (r *rtState) fillFor(cls int) fill {
	return newFill(r.loadFor(cls).demand/max(r.capFor(cls), eps), r.node.ratio())
}

// fillAfter is fillFor once shard s is on the runtime.
func (r *rtState) fillAfter(s *shardState) fill {
	return newFill(r.loadFor(s.cls).demandAfter(s.g, s.w)/max(r.capFor(s.cls), eps), r.node.ratioAfter(s.in, s.out))
}

// fits reports whether shard s fits on the runtime: its cores, and its node's NIC.
func (r *rtState) fits(s *shardState) bool {
	return r.loadFor(s.cls).demandAfter(s.g, s.w) <= r.capFor(s.cls)+eps && r.node.fits(s.in, s.out)
}

// overloaded returns the class whose shards should move off the runtime, the highest whose load
// (its own and above) exceeds its move cap, and that load and cap; ok is false when none does.
func (r *rtState) overloaded() (cls int, demand, limit float64, ok bool) {
	if r.up == nil {
		return PriorityNormal, r.load.demand, r.moveCap(), r.load.demand > r.moveCap()+eps
	}
	for c := PriorityHigh; c >= PriorityLow; c-- {
		if l := r.loadFor(c); l.demand > r.moveCapFor(c)+eps {
			return c, l.demand, r.moveCapFor(c), true
		}
	}
	return 0, 0, 0, false
}

// chooseVictims marks the n emptiest healthy runtimes (fewest shards, then least work, then id) to
// be emptied and drained; while NICs are counted, those that share their node with another healthy
// runtime go first, so that the pool keeps the nodes, and their NICs, it spans.
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
	if len(cand) == 0 || rts[cand[0]].node == nil {
		for _, i := range cand[:min(n, len(cand))] {
			rts[i].victim = true
		}
		return
	}
	left := map[*nodeState]int{} // healthy runtimes per node, victims not counted
	for _, i := range cand {
		left[rts[i].node]++
	}
	for range min(n, len(cand)) {
		pick := -1
		for _, i := range cand { // the emptiest sharing its node, else the emptiest
			if rts[i].victim {
				continue
			}
			if pick < 0 || left[rts[i].node] > 1 && left[rts[pick].node] <= 1 {
				pick = i
			}
		}
		rts[pick].victim = true
		left[rts[pick].node]--
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
// With priorities in force the higher classes are re-added first, each shard weighed as placement
// weighs it (rtState.fits), so that the lower classes' shards are the ones that move; and the shards
// of classes above over (the class that rtState.overloaded found over its limit) stay whatever
// their weight: their own classes are within their limits, so moving them would make a higher job
// pay the pause for a lower one's load.
func overflow(m *model, r *rtState, ks []int, shards []shardState, over int) []int {
	per := map[int]int{}
	for _, k := range ks {
		per[shards[k].g]++
	}
	prio := r.up != nil
	sorted := slices.Clone(ks)
	slices.SortStableFunc(sorted, func(a, b int) int {
		ga, gb := shards[a].g, shards[b].g
		c := 0
		if prio {
			c = cmp.Compare(shards[b].cls, shards[a].cls)
		}
		return cmp.Or(c, cmp.Compare(per[gb], per[ga]), cmp.Compare(m.groups[ga].job, m.groups[gb].job), cmp.Compare(ga, gb))
	})
	scratch := &rtState{hardCap: r.hardCap, fitCap: r.fitCap, load: m.newLoad()} // cores only: nicOverflow weighs bytes
	if prio {
		scratch.up = []load{m.newLoad(), m.newLoad()}
	}
	var out []int
	for _, k := range sorted {
		s := &shards[k]
		if (prio && s.cls > over) || scratch.fits(s) {
			scratch.place(s)
		} else {
			out = append(out, k)
		}
	}
	return out
}

func (r *rtState) place(s *shardState) {
	r.load.add(s.g, s.w)
	for c := range r.up {
		if s.cls >= c {
			r.up[c].add(s.g, s.w)
		}
	}
	r.node.add(s.in, s.out)
	r.nShards++
	r.work += s.w
}

func (r *rtState) unplace(s *shardState) {
	r.load.remove(s.g, s.w)
	for c := range r.up {
		if s.cls >= c {
			r.up[c].remove(s.g, s.w)
		}
	}
	r.node.remove(s.in, s.out)
	r.nShards--
	r.work -= s.w
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
	prio   bool            // priorities in force (the runtimes' up loads are kept)
	// slack: the pool as a whole has capacity (its demand is within its cores at target
	// utilization). A runtime over its target then triggers moves, not a scale-up: see tolerates.
	slack bool
	// homeless is the demand of the shards that fit on no runtime, each counted alone.
	homeless float64
	// overNIC counts the shards placed where their node's NIC is past its move cap: more runtimes
	// on the same nodes would not help them, so they are not homeless.
	overNIC int
}

// alone is the demand of shard k on an empty runtime.
func (pl *placer) alone(k int) float64 {
	s := &pl.shards[k]
	l := pl.m.newLoad()
	return l.demandAfter(s.g, s.w)
}

func newPlacer(m *model, rts []*rtState, shards []shardState, prio, slack bool) *placer {
	pl := &placer{m: m, rts: rts, shards: shards, full: map[int]float64{}, prio: prio, slack: slack}
	for i, r := range rts {
		if r.eligible() {
			pl.elig = append(pl.elig, i)
		}
	}
	return pl
}

// onLeader reports whether runtime i is connected to the NATS server that leads shard s's job's
// parameter stream.
func (pl *placer) onLeader(i int, s *shardState) bool {
	return s.obs.Leader != "" && pl.rts[i].obs.Server == s.obs.Leader
}

// onGradLeader reports whether runtime i is connected to the NATS server that leads the stream of
// shard s's gradients, when its job has several (ShardObs.GradLeader).
func (pl *placer) onGradLeader(i int, s *shardState) bool {
	return s.obs.GradLeader != "" && pl.rts[i].obs.Server == s.obs.GradLeader
}

// better reports whether runtime a, at fill fa, is a better place for shard s than b at fb:
// connected to the leader of the shard's gradient stream when b is not (every gradient of the
// shard then crosses the network once, not twice: the job has several gradient streams so that
// its shards' bytes stay on their streams' nodes); else less full; else as full and connected to
// the leader of the job's parameter stream when b is not (its parameters then cross the network
// once, not twice). Whether a has room is the caller's question (target).
func (pl *placer) better(s *shardState, a int, fa fill, b int, fb fill) bool {
	if ga, gb := pl.onGradLeader(a, s), pl.onGradLeader(b, s); ga != gb {
		return ga
	}
	if c := fa.compare(fb); c != 0 {
		return c < 0
	}
	return pl.onLeader(a, s) && !pl.onLeader(b, s)
}

// target returns the eligible runtime other than not where shard k fits at target utilization
// (cores and NIC), or -1. Of the candidates least loaded now it takes the one least loaded once the
// shard is on it: a runtime that already holds the shard's job at its peak grows more than one that
// holds other jobs, and one on a node whose NIC carries the job's bytes more than one on another.
func (pl *placer) target(k, not int) int {
	s := &pl.shards[k]
	if h := pl.home(k, not); h >= 0 {
		return h
	}
	var best [candidates]int
	n := 0
	for _, i := range pl.elig {
		if i == not {
			continue
		}
		// Insert i into the n least loaded so far, kept sorted by ratio, the leader, then index.
		j := n
		for j > 0 && pl.better(s, i, pl.rts[i].fillFor(s.cls), best[j-1], pl.rts[best[j-1]].fillFor(s.cls)) {
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
	to, toFill := -1, fill{}
	for _, i := range best[:n] {
		r := pl.rts[i]
		if !r.fits(s) {
			continue
		}
		if x := r.fillAfter(s); to < 0 || pl.better(s, i, x, to, toFill) {
			to, toFill = i, x
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
	slices.SortStableFunc(cand, func(a, b int) int { // exact, for a strict order
		fa, fb := pl.rts[a].fillFor(s.cls), pl.rts[b].fillFor(s.cls)
		return cmp.Or(cmp.Compare(fa.ratio, fb.ratio), cmp.Compare(fa.cores, fb.cores))
	})
	for _, i := range cand {
		if pl.rts[i].fits(s) {
			return i
		}
	}
	pl.full[s.g] = s.w
	return -1
}

// placeAll places shards that have no runtime, jobs in decreasing order of work (with priorities in
// force, higher classes first: they take their headroom before the lower ones), and a job's shards
// in decreasing order of bytes: each goes to the emptiest node (target), so that the largest are
// spread first and the small ones even out what is left (longest processing time first). A shard that fits
// nowhere goes to the least loaded runtime anyway (over capacity: the pool grows). It returns how
// many shards could not be placed at all (no runtime).
func (pl *placer) placeAll(ks []int) int {
	gw := map[int]float64{}
	for _, k := range ks {
		gw[pl.shards[k].g] += pl.shards[k].w
	}
	slices.SortStableFunc(ks, func(a, b int) int {
		ga, gb := pl.shards[a].g, pl.shards[b].g
		c := 0
		if pl.prio {
			c = cmp.Compare(pl.shards[b].cls, pl.shards[a].cls)
		}
		return cmp.Or(c, cmp.Compare(gw[gb], gw[ga]), cmp.Compare(ga, gb), cmp.Compare(pl.shards[b].size(), pl.shards[a].size()))
	})
	failed := 0
	for _, k := range ks {
		s := &pl.shards[k]
		to := pl.target(k, -1)
		if to < 0 {
			// Fallback: least loaded, eligible ones first, and among those the runtimes on the
			// shard's gradient stream's server: its bytes load that node's NIC wherever it runs.
			for i, r := range pl.rts {
				if r.draining {
					continue
				}
				if to < 0 || pl.fallbackBefore(s, i, to) {
					to = i
				}
			}
			switch {
			case !pl.toleratesCores(to, k):
				pl.homeless += pl.alone(k)
			case !pl.toleratesNIC(to, k):
				pl.overNIC++
			}
		}
		if to < 0 {
			failed++
			continue
		}
		pl.rts[to].place(s)
		s.to = to
	}
	return failed
}

// home returns the eligible runtime other than not, connected to the server of shard k's gradient
// stream (ShardObs.GradLeader), whose cores have room for it at target, the least full of them;
// -1 if there is none. Its node's NIC is not asked: the shard's gradients cross into that node to
// their stream wherever the shard runs, and served elsewhere they cross out again.
func (pl *placer) home(k, not int) int {
	s := &pl.shards[k]
	if s.obs.GradLeader == "" {
		return -1
	}
	to := -1
	for _, i := range pl.elig {
		r := pl.rts[i]
		if i == not || !pl.onGradLeader(i, s) || r.loadFor(s.cls).demandAfter(s.g, s.w) > r.capFor(s.cls)+eps {
			continue
		}
		if to < 0 || r.fillAfter(s).compare(pl.rts[to].fillAfter(s)) < 0 {
			to = i
		}
	}
	return to
}

// atHome reports whether shard s is placed on a runtime connected to its gradient stream's server:
// moving it to another node for its NIC's sake would not take its gradients off this node's link,
// and would send them out again.
func atHome(rts []*rtState, s *shardState) bool {
	return s.obs.GradLeader != "" && s.to >= 0 && rts[s.to].obs.Server == s.obs.GradLeader
}

// fallbackBefore orders the runtimes of placeAll's fallback for shard s: eligible first, then on
// the shard's gradient stream's server, then less full.
func (pl *placer) fallbackBefore(s *shardState, a, b int) bool {
	ra, rb := pl.rts[a], pl.rts[b]
	if ra.eligible() != rb.eligible() {
		return ra.eligible()
	}
	if ga, gb := pl.onGradLeader(a, s), pl.onGradLeader(b, s); ga != gb {
		return ga
	}
	return ra.fillFor(s.cls).compare(rb.fillFor(s.cls)) < 0
}

// move moves one placed shard to another eligible runtime where it fits; it reports whether it did.
func (pl *placer) move(k int) bool {
	s := &pl.shards[k]
	to := pl.target(k, s.to)
	if to < 0 {
		return false
	}
	pl.relocate(s, to)
	return true
}

// homecoming moves shards that this decision left where they were, away from their gradient
// stream's server, back to a runtime of it with room (home): after their runtime there died or was
// full, say. At most budget moves; it returns how many it made.
func (pl *placer) homecoming(budget int) int {
	moves := 0
	for k := range pl.shards {
		if moves >= budget {
			break
		}
		s := &pl.shards[k]
		if s.obs.GradLeader == "" || s.from < 0 || s.to != s.from || atHome(pl.rts, s) {
			continue
		}
		if h := pl.home(k, s.to); h >= 0 {
			s.cause = "back to the server of its gradient stream, " + s.obs.GradLeader
			pl.relocate(s, h)
			moves++
		}
	}
	return moves
}

// relocate moves placed shard s from its runtime to runtime to.
func (pl *placer) relocate(s *shardState, to int) {
	pl.rts[s.to].unplace(s)
	pl.rts[to].place(s)
	s.to = to
}

// Work-conserving placement. A runtime is one pooled server: any ready shard of it runs on any of
// its free cores (runtime/cpu.go), so its target utilization is a coarse affinity, not a
// reservation per shard. While the pool as a whole has capacity (slack), a shard that fits within
// target on no runtime may take a runtime up to its move threshold (midway from target to its
// cores) without asking for a new runtime: the pool is sized from its total demand, not from its
// fragments. Without slack, or beyond the threshold, such a shard is homeless and the pool grows.

// tolerates reports whether shard k, which fits within target nowhere, may go to runtime i without
// a new runtime: the pool has slack, i is eligible, and k keeps i within its move threshold, and
// i's node's NIC within its own.
func (pl *placer) tolerates(i, k int) bool { return pl.toleratesCores(i, k) && pl.toleratesNIC(i, k) }

func (pl *placer) toleratesCores(i, k int) bool {
	if !pl.slack || i < 0 || !pl.rts[i].eligible() {
		return false
	}
	s, r := &pl.shards[k], pl.rts[i]
	return r.loadFor(s.cls).demandAfter(s.g, s.w) <= r.moveCapFor(s.cls)+eps
}

func (pl *placer) toleratesNIC(i, k int) bool {
	s, n := &pl.shards[k], pl.rts[i].node
	return !n.limited() || n.ratioAfter(s.in, s.out) <= n.moveCap()+eps
}

// spill moves a shard off an overloaded runtime that fits within target nowhere else to the
// eligible runtime, other than its own, that is least loaded once it holds it and that the pool's
// slack tolerates; it reports whether it did.
func (pl *placer) spill(k int) bool {
	if !pl.slack {
		return false
	}
	s := &pl.shards[k]
	to, toFill := -1, fill{}
	for _, i := range pl.elig {
		if i == s.to || !pl.tolerates(i, k) {
			continue
		}
		if x := pl.rts[i].fillAfter(s); to < 0 || x.compare(toFill) < 0 {
			to, toFill = i, x
		}
	}
	if to < 0 {
		return false
	}
	pl.relocate(s, to)
	return true
}
