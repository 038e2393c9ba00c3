package autoscaler

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Bytes. A shard costs cores on its runtime and bytes on its runtime's node: the ranks' gradients
// come in through the node's NIC and its parameters go out through it, once for each rank's
// worker. Runtimes of one node share its NIC. The NIC is counted as a steady rate (bytes per
// second, averaged over the step), each way on its own (links are full duplex): placement fills a
// node to TargetUtilization of its NIC, and moves shards off a node whose NIC is past midway
// between that and full, as it does with cores.
//
// A node whose NIC is unknown (0) has no limit, and a runtime that does not report its node is a
// node of its own: without the operator's --nic-bandwidth or a link speed the kernel knows, the
// decider places by cores alone, as before bytes were counted. A runtime that has not sent its
// first load report yet (RuntimeObs.Unreported) gets no new shards while other runtimes' NICs are
// known: taken for a node without a limit, it drew every shard of a job created as it started, and
// the job stayed uneven once the shards that did not fit moved off (4, 2, 2, 2 of 10 on 4 nodes).
//
// A NIC-bound job steps at the pace of its fullest node. Placement puts a job's shards, the most
// bytes first, each on the emptiest node; and once a node's NIC is past balanceFrom of its target,
// it moves shards from the fullest node to others while a move lowers it by at least half the
// shard (balanceBytes): 10 equal shards on 4 nodes end 3, 3, 2, 2 from wherever they start.
//
// The pool is sized in cores; bytes add a floor: while the shards' bytes need more than one NIC,
// the pool keeps a runtime on as many of the nodes it spans as they need (nicFloor), and a
// scale-down drains the runtimes that share a node with another first (chooseVictims). It does not
// grow for bytes: a new runtime may start on a node that is full already (a process pool is all on
// one machine); the reasons say how many nodes the bytes need.

// nodeState is one node's NIC in one decision: its capacity and the bytes placed on it.
type nodeState struct {
	name    string
	cap     float64 // bytes per second each way; 0: unknown, no limit
	fit     float64 // cap x target utilization: what placement fills to
	in, out float64 // bytes per second of the shards placed on its runtimes
}

func (n *nodeState) limited() bool { return n != nil && n.cap > 0 }

// ratio is how full the NIC is at target utilization, the busier direction; 0 without a limit.
func (n *nodeState) ratio() float64 { return n.ratioAfter(0, 0) }

func (n *nodeState) ratioAfter(in, out float64) float64 {
	if !n.limited() {
		return 0
	}
	return max(n.in+in, n.out+out) / n.fit
}

// fits reports whether in and out more bytes per second stay within the target.
func (n *nodeState) fits(in, out float64) bool { return n.ratioAfter(in, out) <= 1+eps }

// moveCap is the ratio past which shards move off the node: midway between the target and full.
func (n *nodeState) moveCap() float64 { return (1 + n.cap/max(n.fit, eps)) / 2 }

func (n *nodeState) overloaded() bool { return n.limited() && n.ratio() > n.moveCap()+eps }

func (n *nodeState) add(in, out float64) {
	if n != nil {
		n.in += in
		n.out += out
	}
}

func (n *nodeState) remove(in, out float64) {
	if n != nil {
		n.in = max(0, n.in-in)
		n.out = max(0, n.out-out)
	}
}

// plannedBytes are the bytes per second a shard is planned for, in and out: measured, or its bytes
// per step over its period (UnknownBurst before the period is measured).
func plannedBytes(s *ShardObs, p Policy) (in, out float64) {
	per := s.Period
	if per <= 0 {
		per = p.UnknownBurst
	}
	est := float64(s.Bytes) / max(per.Seconds(), float64(time.Nanosecond)/float64(time.Second))
	in, out = s.BytesIn, s.BytesOut
	if in <= 0 {
		in = est
	}
	if out <= 0 {
		out = est
	}
	return in, out
}

// jobRates plans every shard of a job at the job's pace: its bytes per step times the median of
// what its shards measured per byte of a step, in and out alike. A job's shards step together
// (bsp; nearly so in ssp and asp), so their rates are in proportion to their bytes; what each
// runtime measures is not (a shard that just moved, a step whose period varied), and evening a job
// over nodes on such rates moved its shards back and forth. Jobs none of whose shards measured
// keep their estimates.
func (r *round) jobRates() {
	type perByte struct{ in, out []float64 }
	jobs := map[string]*perByte{}
	for k := range r.shards {
		s := r.shards[k].obs
		if s.Bytes <= 0 {
			continue
		}
		j := jobs[s.Job]
		if j == nil {
			j = &perByte{}
			jobs[s.Job] = j
		}
		if s.BytesIn > 0 {
			j.in = append(j.in, s.BytesIn/float64(s.Bytes))
		}
		if s.BytesOut > 0 {
			j.out = append(j.out, s.BytesOut/float64(s.Bytes))
		}
	}
	rate := make(map[string][2]float64, len(jobs)) // per job: in and out per byte of a step, 0 unmeasured
	for id, j := range jobs {
		rate[id] = [2]float64{median(j.in), median(j.out)}
	}
	for k := range r.shards {
		s := &r.shards[k]
		v := rate[s.obs.Job]
		if v[0] > 0 {
			s.in = float64(s.obs.Bytes) * v[0]
		}
		if v[1] > 0 {
			s.out = float64(s.obs.Bytes) * v[1]
		}
	}
}

// median of vs, which it sorts; 0 for none.
func median(vs []float64) float64 {
	slices.Sort(vs)
	n := len(vs)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}

// nodes groups the runtimes by node: a runtime without a node is one of its own. A node's NIC is
// the largest its runtimes report. Without any NIC known it leaves every runtime's node nil, and
// bytes are not counted.
func (r *round) nodes() {
	byName := map[string]*nodeState{}
	known := false
	for _, rt := range r.rts {
		name := rt.obs.Node
		if name == "" {
			name = "\x00" + rt.obs.ID
		}
		n := byName[name]
		if n == nil {
			n = &nodeState{name: name}
			byName[name] = n
			r.nodeList = append(r.nodeList, n)
		}
		n.cap = max(n.cap, rt.obs.NIC)
		known = known || rt.obs.NIC > 0
		rt.node = n
	}
	if !known {
		for _, rt := range r.rts {
			rt.node = nil
		}
		r.nodeList = nil
		return
	}
	for _, n := range r.nodeList {
		n.fit = n.cap * r.p.TargetUtilization
	}
	for _, rt := range r.rts {
		rt.unknown = rt.obs.Unreported
	}
}

// nicFloor is the number of nodes the shards' bytes need at target utilization: the shards, the
// most bytes first, each put on the first node with room, the largest NICs first (first-fit
// decreasing, the busier direction of each shard). It is bounded by the nodes the healthy runtimes
// span (it does not grow the pool: see the top of the file), and 0 when bytes need no more than
// one node, or when a healthy runtime's node has no known NIC (no limit: it can carry them all).
func (r *round) nicFloor() int {
	if r.nodeList == nil {
		return 0
	}
	seen := map[*nodeState]bool{}
	var bins []*nodeState
	for _, rt := range r.rts {
		if rt.draining || rt.straggler || seen[rt.node] {
			continue
		}
		if !rt.node.limited() {
			return 0
		}
		seen[rt.node] = true
		bins = append(bins, &nodeState{name: rt.node.name, cap: rt.node.cap, fit: rt.node.fit})
	}
	slices.SortStableFunc(bins, func(a, b *nodeState) int { return cmp.Compare(b.fit, a.fit) })
	ks := make([]int, len(r.shards))
	var in, out float64
	for k := range ks {
		ks[k] = k
		in += r.shards[k].in
		out += r.shards[k].out
	}
	size := func(k int) float64 { return max(r.shards[k].in, r.shards[k].out) }
	slices.SortStableFunc(ks, func(a, b int) int { return cmp.Compare(size(b), size(a)) })
	used, short := 0, false
	for _, k := range ks {
		s := &r.shards[k]
		i := slices.IndexFunc(bins, func(n *nodeState) bool { return n.fits(s.in, s.out) })
		if i < 0 {
			short = true
			continue
		}
		bins[i].add(s.in, s.out)
		used = max(used, i+1)
	}
	if short {
		used = len(bins)
		r.say("the shards' bytes (%.1f MB/s in, %.1f MB/s out) need more than the %d nodes' NICs the pool spans at %.0f%%: add runtimes on other nodes",
			in/1e6, out/1e6, len(bins), 100*r.p.TargetUtilization)
	}
	if used <= 1 {
		return 0
	}
	return used
}

// nicOverflow returns the shards to move off node n, whose NIC is past its move cap: the shards of
// its eligible runtimes re-added job by job, the jobs with the fewest bytes on the node first
// (they stay), until the next no longer fits; the rest move, so that a large job spreads. A shard
// at home on its gradient stream's server (atHome) stays and is not counted.
func (r *round) nicOverflow(n *nodeState, moving map[int]bool) []int {
	type held struct {
		k     int
		bytes float64
	}
	var ks []held
	per := map[string]float64{}
	for i, rt := range r.rts {
		if rt.node != n || !rt.eligible() {
			continue
		}
		for _, k := range r.byRuntime[i] {
			s := &r.shards[k]
			if moving[k] || atHome(r.rts, s) {
				continue
			}
			ks = append(ks, held{k, max(s.in, s.out)})
			per[s.obs.Job] += max(s.in, s.out)
		}
	}
	slices.SortStableFunc(ks, func(a, b held) int {
		ja, jb := r.shards[a.k].obs.Job, r.shards[b.k].obs.Job
		return cmp.Or(cmp.Compare(per[ja], per[jb]), cmp.Compare(ja, jb), cmp.Compare(a.k, b.k))
	})
	scratch := &nodeState{cap: n.cap, fit: n.fit}
	var out []int
	for _, h := range ks {
		s := &r.shards[h.k]
		if len(out) == 0 && scratch.fits(s.in, s.out) {
			scratch.add(s.in, s.out)
			continue
		}
		s.cause = fmt.Sprintf("node %s NIC at %.0f%% > %.0f%% of its %.1f MB/s", nodeName(n), 100*n.ratio()*r.p.TargetUtilization,
			100*n.moveCap()*r.p.TargetUtilization, n.cap/1e6)
		out = append(out, h.k)
	}
	return out
}

// nodeName is a node's name for reasons.
func nodeName(n *nodeState) string {
	if len(n.name) > 0 && n.name[0] == 0 {
		return "of runtime " + n.name[1:]
	}
	return n.name
}

// balanceFrom is the fill of a node's NIC, as a fraction of its target, from which placement evens
// the bytes over the nodes: below it the NIC does not set a step's pace, and a move would cost the
// shard a pause for nothing.
const balanceFrom = 0.5

// balanceBytes moves shards off the node whose NIC is fullest, one at a time and at most budget,
// while it is past balanceFrom and a move to another node leaves both below its fill by at least
// half the shard's bytes: the fullest node's bytes come down, and a shard never moves between two
// nodes that differ by less than it (no back and forth over noise in the measured rates). Of the
// moves that qualify it takes the one that leaves the pair emptiest, onto the runtime of the
// receiving node whose cores are least full and have room for it at target. It returns the moves
// made.
func (r *round) balanceBytes(pl *placer, budget int) int {
	if r.nodeList == nil {
		return 0
	}
	rtsOf := map[*nodeState][]int{} // the eligible runtimes of each limited node
	for _, i := range pl.elig {
		if n := r.rts[i].node; n.limited() {
			rtsOf[n] = append(rtsOf[n], i)
		}
	}
	moves := 0
	for moves < budget {
		var hi *nodeState
		for _, n := range r.nodeList {
			if len(rtsOf[n]) > 0 && (hi == nil || n.ratio() > hi.ratio()+eps) {
				hi = n
			}
		}
		if hi == nil || hi.ratio() < balanceFrom {
			return moves
		}
		best, bestTo, bestAfter := -1, -1, 0.0
		for k := range r.shards {
			s := &r.shards[k]
			if s.to < 0 || r.rts[s.to].node != hi || !r.rts[s.to].eligible() || s.size() <= 0 || atHome(r.rts, s) {
				continue
			}
			limit := hi.ratio() - s.size()/hi.fit/2
			for _, n := range r.nodeList {
				if n == hi || len(rtsOf[n]) == 0 {
					continue
				}
				after := max(hi.ratioAfter(-s.in, -s.out), n.ratioAfter(s.in, s.out))
				if after > limit+eps || best >= 0 && after >= bestAfter-eps {
					continue
				}
				to := -1
				for _, i := range rtsOf[n] {
					rt := r.rts[i]
					if rt.loadFor(s.cls).demandAfter(s.g, s.w) > rt.capFor(s.cls)+eps {
						continue
					}
					if to < 0 || rt.fillFor(s.cls).cores < r.rts[to].fillFor(s.cls).cores-eps {
						to = i
					}
				}
				if to >= 0 {
					best, bestTo, bestAfter = k, to, after
				}
			}
		}
		if best < 0 {
			return moves
		}
		s := &r.shards[best]
		to := r.rts[bestTo].node
		if s.from >= 0 && s.to == s.from { // not moved yet in this decision: this is why it moves
			s.cause = fmt.Sprintf("evening the bytes over the nodes: node %s NIC at %.0f%%, node %s at %.0f%%", nodeName(hi),
				100*hi.ratio()*r.p.TargetUtilization, nodeName(to), 100*to.ratio()*r.p.TargetUtilization)
		}
		pl.relocate(s, bestTo)
		moves++
	}
	return moves
}
