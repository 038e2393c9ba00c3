package autoscaler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// mbit100 is a 100 Mbit/s NIC in bytes per second.
const mbit100 = 12.5e6

// onNodes puts runtimes on nodes (and their NATS servers, named as the nodes), each NIC nic.
func onNodes(rts []RuntimeObs, nic float64, nodes ...string) []RuntimeObs {
	for i := range rts {
		rts[i].Node, rts[i].Server, rts[i].NIC = nodes[i], nodes[i], nic
	}
	return rts
}

// bytesJob is n unplaced shards of job id that need few cores (0.01 core-seconds a step every
// second) and bytesPerSec each way through their node's NIC.
func bytesJob(id string, n int, bytesPerSec float64) []ShardObs {
	ss := jobShards(id, n, 0.01, time.Second, 0, 500*time.Millisecond)
	for i := range ss {
		ss[i].BytesIn, ss[i].BytesOut = bytesPerSec, bytesPerSec
	}
	return ss
}

// nodeLoad sums, per node, the bytes per second in of the shards a placement puts on it.
func nodeLoad(rts []RuntimeObs, shards []ShardObs, placement map[string]string) map[string]float64 {
	node := map[string]string{}
	for _, r := range rts {
		node[r.ID] = r.Node
	}
	out := map[string]float64{}
	for _, s := range shards {
		if rt, ok := placement[s.Key]; ok {
			out[node[rt]] += s.BytesIn
		}
	}
	return out
}

// settle runs decisions every 5 s for a minute, each observing the last one's placement, with
// the runtimes it drained gone (stopped), and returns the last decision and the runtimes left.
func settle(t *testing.T, p Policy, rts []RuntimeObs, shards []ShardObs) (Decision, []RuntimeObs) {
	t.Helper()
	d := NewDecider()
	var dec Decision
	for i := range 13 {
		dec = d.Decide(p, Observations{Runtimes: rts, Shards: shards}, at(time.Duration(i)*5*time.Second))
		for k := range shards {
			shards[k].Runtime = dec.Placement[shards[k].Key]
		}
		rts = slices.DeleteFunc(rts, func(r RuntimeObs) bool { return slices.Contains(dec.Drain, r.ID) })
	}
	return dec, rts
}

// The case the issue measured: a job of 10 shards whose bytes fill three 100 Mbit/s NICs and whose
// work fills a fraction of one core, on 4 runtimes on 4 nodes. By cores alone the pool shrinks to
// one runtime and every shard lands on it; with the NICs known the job is spread so that no node
// carries more than its NIC at target utilization, and the pool keeps the nodes it needs.
func TestNICBoundJobSpreadsOverNodes(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	nodes := []string{"n0", "n1", "n2", "n3"}

	blind, _ := settle(t, p, onNodes(runtimes(4), 0, nodes...), bytesJob("big", 10, 3e6))
	if n := runtimesUsed(blind.Placement); n != 1 {
		t.Fatalf("with no NIC known: %d runtimes used, want the 1 that cores alone ask for", n)
	}

	shards := bytesJob("big", 10, 3e6)
	rts := onNodes(runtimes(4), mbit100, nodes...)
	dec, left := settle(t, p, rts, shards)
	if len(dec.Placement) != 10 {
		t.Fatalf("%d of 10 shards placed", len(dec.Placement))
	}
	load := nodeLoad(rts, shards, dec.Placement)
	if len(load) < 3 {
		t.Errorf("the job is on %d nodes (%v), its 30 MB/s need 3 NICs of 10 MB/s at 80%%", len(load), load)
	}
	for n, b := range load {
		if b > mbit100*p.TargetUtilization+1 {
			t.Errorf("node %s carries %.1f MB/s, over its NIC's %.1f at target", n, b/1e6, mbit100*p.TargetUtilization/1e6)
		}
	}
	if dec.Desired < 3 || len(left) < 3 {
		t.Errorf("pool desired %d with %d runtimes left, want at least the 3 nodes the bytes need; reasons %q", dec.Desired, len(left), dec.Reasons)
	}
}

// Runtimes that share a node share its NIC: a job whose bytes exceed one NIC is not packed onto two
// runtimes of one node, and scaling down drains the runtimes that share a node, keeping one on each.
func TestNICSharedByRuntimesOfANode(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	shards := bytesJob("big", 6, 2.5e6) // 15 MB/s: more than one NIC's 10 at target
	rts := onNodes(runtimes(4), mbit100, "a", "a", "b", "b")
	dec, left := settle(t, p, rts, shards)
	load := nodeLoad(rts, shards, dec.Placement)
	if len(load) != 2 || load["a"] > 10e6+1 || load["b"] > 10e6+1 {
		t.Errorf("bytes per node %v, want both nodes within 10 MB/s", load)
	}
	nodesLeft := map[string]int{}
	for _, r := range left {
		nodesLeft[r.Node]++
	}
	if nodesLeft["a"] != 1 || nodesLeft["b"] != 1 {
		t.Errorf("runtimes left per node %v, want one on each: the drained ones were those sharing a node", nodesLeft)
	}
}

// A node whose NIC is past its move cap sheds shards to a node with room, saying why; the pool
// does not grow for bytes (a new runtime could start on the full node), and when no node has room
// the reasons say that the bytes need more nodes.
func TestNICOverloadedNodeShedsShards(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	rts := onNodes(runtimes(2), mbit100, "a", "b")
	shards := bytesJob("big", 6, 3e6) // 18 MB/s on node a: past its move cap of 11.25
	for i := range shards {
		shards[i].Runtime = "rt-1"
	}
	dec := NewDecider().Decide(p, Observations{Runtimes: rts, Shards: shards}, t0)
	moved := 0
	for _, m := range dec.Moves {
		if m.From == "rt-1" && m.To == "rt-2" && strings.Contains(m.Reason, "NIC") {
			moved++
		}
	}
	if moved != 3 {
		t.Errorf("%d shards moved to node b for the NIC, want 3 (node a keeps 9 of its 10 MB/s); moves %+v", moved, dec.Moves)
	}
	if dec.Desired != 2 {
		t.Errorf("desired %d, want 2: bytes do not grow the pool", dec.Desired)
	}

	full := bytesJob("huge", 8, 3e6) // 24 MB/s: more than both NICs at target
	dec = NewDecider().Decide(p, Observations{Runtimes: rts, Shards: full}, t0)
	if dec.Desired != 2 || !hasReason(dec, "need more than the 2 nodes' NICs") {
		t.Errorf("desired %d, want 2 and the reason that the bytes need more nodes; reasons %q", dec.Desired, dec.Reasons)
	}
	if len(dec.Placement) != 8 || !hasReason(dec, "2 shards placed past their node's NIC") {
		t.Errorf("%d of 8 shards placed, reasons %q; want all 8, the 2 that fit no NIC said so", len(dec.Placement), dec.Reasons)
	}
}

// A scale-down drains a runtime that shares its node with another before the emptiest runtime of a
// node of its own: the pool keeps the nodes, and their NICs, it spans.
func TestVictimsShareANodeFirst(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	rts := onNodes(runtimes(4), mbit100, "a", "b", "b", "c")
	shards := append(steady("x", 3, 0.3, "rt-3"), steady("y", 5, 0.5, "rt-4")...)
	r := &round{p: p, now: t0}
	r.observe(Observations{Runtimes: rts, Shards: shards}, nil)
	r.health()
	r.nodes()
	r.current()
	chooseVictims(r.rts, r.shards, 1)
	var victims []string
	for _, rt := range r.rts {
		if rt.victim {
			victims = append(victims, rt.obs.ID)
		}
	}
	if !slices.Equal(victims, []string{"rt-2"}) {
		t.Errorf("victims %v, want [rt-2]: empty and sharing node b (rt-1 is empty too, but alone on a)", victims)
	}
}

// Among equal runtimes a shard goes to the one connected to the NATS server that leads its job's
// parameter stream; a busier one is not equal, and spreading comes first.
func TestPlacementPrefersTheParamsLeader(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	for _, nic := range []float64{0, mbit100} {
		t.Run(fmt.Sprintf("nic=%v", nic), func(t *testing.T) {
			t.Parallel()
			rts := onNodes(runtimes(3), nic, "n0", "n1", "n2")
			one := bytesJob("j", 1, 1e6)
			one[0].Leader = "n2"
			if dec := NewDecider().Decide(p, Observations{Runtimes: rts, Shards: one}, t0); dec.Placement["j.0"] != "rt-3" {
				t.Errorf("shard placed on %s, want rt-3 on the leader n2", dec.Placement["j.0"])
			}
			busy := append(steady("other", 4, 2, "rt-3"), one...) // rt-3 holds 2 cores of work
			if dec := NewDecider().Decide(p, Observations{Runtimes: rts, Shards: busy}, t0); dec.Placement["j.0"] == "rt-3" {
				t.Errorf("shard placed on the leader's busy runtime rt-3, want an idle one")
			}
			three := bytesJob("k", 3, 1e6)
			for i := range three {
				three[i].Leader = "n1"
			}
			// The first decision drains one runtime (rt-1, the first of the emptiest) and spreads
			// the job over the other two: its first shard on the leader's.
			dec := NewDecider().Decide(p, Observations{Runtimes: rts, Shards: three}, t0)
			if dec.Placement["k.0"] != "rt-2" || runtimesUsed(dec.Placement) != 2 {
				t.Errorf("placement %v, want k.0 on rt-2 (on the leader n1) and the job on 2 runtimes", dec.Placement)
			}
		})
	}
}

// Unmeasured shards are planned at their bytes per step over their period, or over UnknownBurst
// before the period is known; measured rates win.
func TestPlannedBytes(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.UnknownBurst = 2 * time.Second
	for _, c := range []struct {
		s       ShardObs
		in, out float64
	}{
		{ShardObs{Bytes: 8e6, Period: 500 * time.Millisecond}, 16e6, 16e6},
		{ShardObs{Bytes: 8e6}, 4e6, 4e6},
		{ShardObs{Bytes: 8e6, Period: time.Second, BytesIn: 3e6, BytesOut: 5e6}, 3e6, 5e6},
		{ShardObs{Bytes: 8e6, Period: time.Second, BytesIn: 3e6}, 3e6, 8e6},
	} {
		in, out := plannedBytes(&c.s, p)
		if math.Abs(in-c.in) > 1e-6 || math.Abs(out-c.out) > 1e-6 {
			t.Errorf("%+v: planned %v in, %v out; want %v, %v", c.s, in, out, c.in, c.out)
		}
	}
}

// Runtimes of one node share its NIC: while that NIC is full, their cores still balance the shards
// (a process pool on one machine whose link the bytes exceed).
func TestRuntimesOfAFullNodeBalanceByCores(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.MinRuntimes = 3
	rts := onNodes(runtimes(3), mbit100, "a", "a", "a")
	shards := steady("j", 6, 6) // a core each
	for i := range shards {
		shards[i].BytesIn, shards[i].BytesOut = 3e6, 3e6 // 18 MB/s: more than the NIC
	}
	dec := NewDecider().Decide(p, Observations{Runtimes: rts, Shards: shards}, t0)
	per := map[string]int{}
	for _, rt := range dec.Placement {
		per[rt]++
	}
	if per["rt-1"] != 2 || per["rt-2"] != 2 || per["rt-3"] != 2 {
		t.Errorf("shards per runtime %v, want 2 on each: the cores balance when the shared NIC cannot", per)
	}
}

// With nodes and NICs the decisions still depend only on the observations, not their order.
func TestDecideWithNICsDeterministic(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	obs := bigObservations(2000, 40, 9)
	for i := range obs.Runtimes {
		obs.Runtimes[i].Node = fmt.Sprintf("node-%d", i%13) // some nodes hold several runtimes
		obs.Runtimes[i].Server = obs.Runtimes[i].Node
		obs.Runtimes[i].NIC = mbit100 * float64(1+i%3)
	}
	for i := range obs.Shards {
		obs.Shards[i].BytesIn = float64(20e3 * (1 + i%7))
		obs.Shards[i].Leader = fmt.Sprintf("node-%d", i%5)
	}
	want := NewDecider().Decide(p, obs, at(0))
	if len(want.Moves) == 0 || !hasReason(want, "NIC") {
		t.Fatalf("the scenario should move shards for NICs: %q", want.Reasons)
	}
	rng := rand.New(rand.NewPCG(5, 6))
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

// perNode counts, per node, the shards a placement puts on it, in decreasing order.
func perNode(rts []RuntimeObs, placement map[string]string) []int {
	node := map[string]string{}
	for _, r := range rts {
		node[r.ID] = r.Node
	}
	count := map[string]int{}
	for _, rt := range placement {
		count[node[rt]]++
	}
	var out []int
	for _, n := range count {
		out = append(out, n)
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// The bench's job (10 shards of 1 MiB, 4 ranks) created as the last of its 4 runtimes starts: that
// runtime has not reported its node and NIC yet. It gets none of the shards (taken for a node
// without a limit, it drew all 10, and kept 4 once the others were full), and once it reports,
// the job ends 3, 3, 2, 2.
func TestUnreportedRuntimeGetsNoShardsWhileNICsAreKnown(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.MinRuntimes, p.MaxRuntimes = 4, 4
	rts := onNodes(runtimes(4), mbit100, "w0", "w1", "w2", "w3")
	late := rts[3]
	rts[3].Node, rts[3].Server, rts[3].NIC, rts[3].Unreported = "", "", 0, true
	shards := jobShards("bench", 10, float64(4<<20)/2e9, 0, 0, 0) // unmeasured, as the controller estimates
	d := NewDecider()
	for i := range 5 {
		if i == 1 {
			rts[3] = late
		}
		obs := Observations{Runtimes: rts, Shards: shards}
		dec := d.Decide(p, obs, at(time.Duration(i)*time.Second))
		checkPlacement(t, obs, dec)
		for k := range shards {
			shards[k].Runtime = dec.Placement[shards[k].Key]
			if i == 0 && shards[k].Runtime == late.ID {
				t.Fatalf("decision 0 placed %s on %s, which has not reported its NIC", shards[k].Key, late.ID)
			}
		}
	}
	placement := map[string]string{}
	for _, s := range shards {
		placement[s.Key] = s.Runtime
	}
	if got := perNode(rts, placement); !slices.Equal(got, []int{3, 3, 2, 2}) {
		t.Errorf("shards per node %v, want [3 3 2 2]", got)
	}
}

// With no NIC known anywhere, a runtime that has not reported yet is placed on as before: by cores.
func TestUnreportedRuntimeCountsWhenNoNICIsKnown(t *testing.T) {
	t.Parallel()
	rts := runtimes(2)
	rts[1].Unreported = true
	shards := steady("j", 4, 6) // 6 cores: more than one runtime's 3.2 at target
	dec := NewDecider().Decide(DefaultPolicy(), Observations{Runtimes: rts, Shards: shards}, at(0))
	if n := runtimesUsed(dec.Placement); n != 2 {
		t.Errorf("%d runtimes used, want 2: without NICs the unreported runtime is a runtime like any", n)
	}
}

// benchJobOn is the cluster bench's spread case: 4 runtimes on 4 nodes of 100 Mbit/s, pool held
// at 4, and its job of 10 shards at their measured 2.26 MB/s each way, shard k on runtime on[k].
func benchJobOn(on ...string) (Policy, []RuntimeObs, []ShardObs) {
	p := DefaultPolicy()
	p.MinRuntimes, p.MaxRuntimes = 4, 4
	shards := bytesJob("bench", len(on), 2.26e6)
	for k := range shards {
		shards[k].Runtime = on[k]
	}
	return p, onNodes(runtimes(4), mbit100, "w0", "w1", "w2", "w3"), shards
}

// A NIC-bound job left uneven (4, 2, 2, 2 of 10 equal shards on 4 nodes, every node within its
// NIC's move cap, so no node is overloaded) is evened to 3, 3, 2, 2 by one move, and stays so: a
// move between nodes that differ by one shard would not lower the fullest.
func TestNICBoundJobEvenedOverNodes(t *testing.T) {
	t.Parallel()
	// 9 MB/s on the node of 4: 90% of its NIC's 10 MB/s target, below the move cap.
	p, rts, shards := benchJobOn("rt-4", "rt-4", "rt-4", "rt-4", "rt-1", "rt-1", "rt-2", "rt-2", "rt-3", "rt-3")
	d := NewDecider()
	var moves int
	for i := range 4 {
		dec := d.Decide(p, Observations{Runtimes: rts, Shards: shards}, at(time.Duration(i)*5*time.Second))
		moves += len(dec.Moves)
		for k := range shards {
			shards[k].Runtime = dec.Placement[shards[k].Key]
		}
		if i == 0 {
			if got := perNode(rts, dec.Placement); !slices.Equal(got, []int{3, 3, 2, 2}) {
				t.Fatalf("shards per node %v after one decision, want [3 3 2 2]; reasons %q", got, dec.Reasons)
			}
		}
	}
	if moves != 1 {
		t.Errorf("%d moves in 4 decisions, want the 1 that evens the job", moves)
	}
}

// A job's shards of unequal bytes (per step, and so per second) are placed the largest first, each on the emptiest node, so that
// the fullest node carries as little as it can: shards of 2, 1 and 1 (key order 1, 1, 2) on 2 nodes
// end 2 and 2, not 3 and 1. Their bytes are far below the NICs, so no later move evens them.
func TestJobShardsPlacedLargestFirst(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.MinRuntimes, p.MaxRuntimes = 2, 2
	rts := onNodes(runtimes(2), mbit100, "a", "b")
	shards := bytesJob("j", 3, 1e6)
	shards[2].Bytes, shards[2].BytesIn, shards[2].BytesOut = 2*shards[2].Bytes, 2e6, 2e6
	dec := NewDecider().Decide(p, Observations{Runtimes: rts, Shards: shards}, at(0))
	load := nodeLoad(rts, shards, dec.Placement)
	if load["a"] != 2e6 || load["b"] != 2e6 {
		t.Errorf("bytes in per node %v, want 2 MB/s on each", load)
	}
}

// A BSP job's shards all step at the job's pace, so their bytes per second are in proportion to
// their bytes per step; what each runtime measures is not: a shard that just moved, or whose
// steps' periods happen to vary, reports a rate a quarter off its siblings'. Evening a job's
// bytes on such rates moved a shard every second or two in the cluster bench, back and forth
// between nodes of 3 and 2 shards, each move a pause of the step. The decider reads a job's
// shards at the job's rate (the median of its shards' rates per byte): 3, 3, 2, 2 stays.
func TestNoisyRatesDoNotMoveAJobsShards(t *testing.T) {
	t.Parallel()
	p, rts, shards := benchJobOn("rt-1", "rt-1", "rt-1", "rt-2", "rt-2", "rt-2", "rt-3", "rt-3", "rt-4", "rt-4")
	rng := rand.New(rand.NewPCG(1, 2))
	d := NewDecider()
	var moved []string
	for i := range 40 {
		for k := range shards {
			f := 0.75 + 0.5*rng.Float64() // each shard's measurement within 25% of the job's rate
			shards[k].BytesIn, shards[k].BytesOut = 2.26e6*f, 2.26e6*f
		}
		dec := d.Decide(p, Observations{Runtimes: rts, Shards: shards}, at(time.Duration(i)*time.Second))
		for _, m := range dec.Moves {
			moved = append(moved, fmt.Sprintf("%s %s->%s", m.Shard, m.From, m.To))
		}
		for k := range shards {
			shards[k].Runtime = dec.Placement[shards[k].Key]
		}
	}
	if len(moved) > 0 {
		t.Errorf("%d moves in 40 decisions of a job evened already (3, 3, 2, 2), want none: %v", len(moved), moved)
	}
}

// A job with several gradient streams has each shard placed on a runtime connected to its stream's
// server, where one has room, even when another is emptier: otherwise every gradient of the shard
// crosses the network twice. When no runtime has room (the NICs past their target), the shard
// still goes to its stream's server. Where that runtime takes no shards, it goes elsewhere.
func TestPlacementFollowsGradientStreams(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.MinRuntimes = 4 // the pool keeps a runtime on every node: placement's choice alone is tested
	for _, c := range []struct {
		nic    float64
		shards int
		bytes  float64
	}{
		{0, 8, 1e6},
		// Two shards fill a node's NIC past its target: no room anywhere.
		{mbit100, 8, 6e6},
		// The cluster bench's job: its share fills each node's NIC to 82% of the target, so the
		// last shards placed find their stream's node full while another still has room.
		{mbit100, 24, 1.7e6},
	} {
		t.Run(fmt.Sprintf("nic=%v,shards=%d", c.nic, c.shards), func(t *testing.T) {
			t.Parallel()
			nodes := []string{"n0", "n1", "n2", "n3"}
			rts := onNodes(runtimes(4), c.nic, nodes...)
			job := bytesJob("j", c.shards, c.bytes)
			for i := range job {
				job[i].GradLeader = nodes[(i*3)%4] // not the order placement would choose
			}
			dec, left := settle(t, p, rts, slices.Clone(job))
			onServer := map[string]string{}
			for _, r := range left {
				onServer[r.ID] = r.Server
			}
			placed := 0
			for _, s := range job {
				rt := dec.Placement[s.Key]
				if onServer[rt] == s.GradLeader {
					placed++
					continue
				}
				if slices.ContainsFunc(left, func(r RuntimeObs) bool { return r.Server == s.GradLeader }) {
					t.Errorf("shard %s on %s (server %s), want a runtime of its stream's server %s", s.Key, rt, onServer[rt], s.GradLeader)
				}
			}
			if placed != len(job) || len(left) != 4 {
				t.Errorf("%d of %d shards on their stream's server, %d runtimes left: placement %v", placed, len(job), len(left), dec.Placement)
			}
			// The runtime of n1 being drained: the shards of n1's stream go elsewhere.
			rts[1].Draining = true
			d := NewDecider().Decide(p, Observations{Runtimes: rts, Shards: job}, t0)
			for _, s := range job {
				if rt := d.Placement[s.Key]; rt == "" || s.GradLeader == "n1" && rt == "rt-2" {
					t.Errorf("shard %s on %q with its stream's runtime rt-2 draining, want another", s.Key, rt)
				}
			}
		})
	}
}

// A shard whose stream's node has no NIC room left goes there all the same, though another node
// has room: its gradients cross into its stream's node wherever it runs. Served on the other node
// they would cross out again, and load both links.
func TestPlacementKeepsAShardOnItsStreamsFullNode(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.MinRuntimes = 2
	rts := onNodes(runtimes(2), mbit100, "n0", "n1")
	job := bytesJob("j", 4, 1e6)
	for _, k := range []int{0, 1} { // two of these pass n0's NIC at its 80% target
		job[k].Bytes *= 6 // the job's rates are planned in proportion to its shards' bytes (jobRates)
		job[k].BytesIn, job[k].BytesOut = 6e6, 6e6
	}
	for i, node := range []string{"n0", "n0", "n1", "n1"} {
		job[i].GradLeader = node
	}
	dec, _ := settle(t, p, rts, slices.Clone(job))
	for i, want := range []string{"rt-1", "rt-1", "rt-2", "rt-2"} {
		if got := dec.Placement[job[i].Key]; got != want {
			t.Errorf("shard %s on %s, want %s on its stream's node (placement %v)", job[i].Key, got, want, dec.Placement)
		}
	}
}

// A shard served away from its gradient stream's server (its runtime there had died, say) goes back
// to a runtime of that server once one has room, as a voluntary move with its reason, within the
// migration budget.
func TestShardGoesBackToItsStreamsServer(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.MinRuntimes = 2
	rts := onNodes(runtimes(2), 0, "n0", "n1")
	job := bytesJob("j", 2, 1e6)
	for i := range job {
		job[i].GradLeader, job[i].Runtime = "n0", "rt-1"
	}
	job[1].Runtime = "rt-2" // away from n0
	dec := NewDecider().Decide(p, Observations{Runtimes: rts, Shards: job}, t0)
	if got := dec.Placement["j.1"]; got != "rt-1" {
		t.Fatalf("j.1 on %s, want back on rt-1 of its stream's server n0", got)
	}
	found := false
	for _, m := range dec.Moves {
		found = found || m.Shard == "j.1" && strings.Contains(m.Reason, "back to the server of its gradient stream")
	}
	if !found {
		t.Errorf("moves %+v: want j.1's with its reason", dec.Moves)
	}
	p.MigrationBudget = 0
	if got := NewDecider().Decide(p, Observations{Runtimes: rts, Shards: job}, t0).Placement["j.1"]; got != "rt-2" {
		t.Errorf("with no migration budget j.1 moved to %s", got)
	}
}
