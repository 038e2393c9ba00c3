package autoscaler

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The decider's files, by concern:
//
//	decider.go    Decider and Decide, as a sequence of phases over one round's state
//	loadmodel.go  the load model: groups, classes, rings and the demand formula
//	scale.go      the pool size: demand history, panic and stable windows, cooldowns
//	placement.go  the runtimes' state, scale-down victims, overflow and the placer
//	feedback.go   the closed loop: a per-job headroom against a slowdown budget

// Decider decides the pool size and the shard placement from observations. It keeps the short
// history its windows and cooldowns need; it is pure otherwise: no clock (time comes only from the
// now argument), no goroutines, no I/O, and the same inputs in any order give the same decisions.
// It is not safe for concurrent use; the control loop and the simulator call it from one goroutine.
type Decider struct {
	samples    []sample  // demand of recent decisions, oldest first, within max(stable, panic) window
	decided    bool      // a decision was made before
	target     int       // the last demand-based pool size (healthy runtimes, stragglers excluded)
	lastChange time.Time // when target last changed
	panicking  bool
	lastPanic  time.Time // the last decision that saw demand/capacity >= panic threshold
	// headroom is the closed loop's state (Policy.SlowdownBudget): per observed job, the factor on
	// its work that the model plans for, and when it last changed.
	headroom map[string]jobHeadroom
	// short: a decision within the stable window wanted more runtimes than max_runtimes allows
	// (shortAt is the last one), and the pool is still at max_runtimes. It is held for the window,
	// as the pool's size is, because packing
	// the low class tighter is what makes the shards fit: measured afresh each decision, the pool
	// would be short, then not (priorities off), then short again, and the low shards would move
	// back and forth with it.
	short   bool
	shortAt time.Time
}

// NewDecider returns a decider without history.
func NewDecider() *Decider { return &Decider{} }

// round is the working state of one decision: the observed runtimes and shards, sorted, the load
// model, and the reasons said so far. The phases of Decide fill it in order; it does not outlive
// the call.
type round struct {
	p      Policy
	now    time.Time
	m      *model
	rts    []*rtState   // by id
	shards []shardState // by key
	demand float64      // the pool's demand (poolDemand)
	// Set by health:
	median   float64 // median speed of the runtimes that can be judged; 0 when fewer than two
	healthy  int     // runtimes neither draining nor stragglers
	capacity float64 // their cores at target utilization
	// Set by current:
	byRuntime [][]int // the shards each runtime holds and keeps for now, by runtime index
	mustPlace []int   // shards without a usable runtime: unplaced, or on one gone or draining
	// mixed: the shards are of more than one priority class; prio: priorities are in force (mixed,
	// and the pool short), see placement.go.
	mixed, prio bool
	// nodeList are the runtimes' nodes (nic.go), nil when no runtime's NIC is known; forNIC are the
	// shards that should move for their node's NIC (not for cores: no new runtime helps them).
	nodeList []*nodeState
	forNIC   map[int]bool
	reasons  []string
}

func (r *round) say(format string, args ...any) {
	r.reasons = append(r.reasons, fmt.Sprintf(format, args...))
}

// Decide returns the pool size and placement for the observed state at time now and records what it
// needs for later decisions (demand history, last change, panic state, the jobs' headroom).
func (d *Decider) Decide(p Policy, obs Observations, now time.Time) Decision {
	r := &round{p: p, now: now}
	r.observe(obs, d.feedback(p, obs, now, r.say))
	demand := r.poolDemand()
	d.record(p, now, demand)
	r.health()
	r.nodes()
	if p.CoresPerRuntime == 0 { // runtimes sized to their machine: count in the cores they report
		p.CoresPerRuntime = r.reportedCores()
		r.p = p
	}
	held := r.current()
	target, capped := d.scale(p, now, demand, held, r.capacity, r.healthy, len(r.shards) > 0, r.say)
	if floor := min(r.nicFloor(), p.MaxRuntimes); target < floor {
		r.say("holding %d runtimes, not %d: the shards' bytes need the NICs of %d nodes", floor, target, floor)
		target = floor
	}
	if target < r.healthy {
		chooseVictims(r.rts, r.shards, r.healthy-target)
	}
	r.prioritize(capped || d.short)
	homeless := r.place(r.voluntary())
	target, grown := d.grow(p, now, homeless, target, r.healthy, r.say)
	if capped || grown {
		d.shortAt = now
	}
	d.short = capped || grown || (target >= p.MaxRuntimes && !d.shortAt.IsZero() && now.Sub(d.shortAt) < p.StableWindow)
	d.commit(now, target, r.healthy)
	return r.decision(target, d.sized(p, now), d.panicking)
}

// observe sorts the runtimes by id and the shards by key, builds the load model (jobs' work times
// their headroom hr), and maps each shard to its observed runtime.
func (r *round) observe(obs Observations, hr map[string]float64) {
	r.rts = make([]*rtState, len(obs.Runtimes))
	for i := range obs.Runtimes {
		r.rts[i] = &rtState{obs: obs.Runtimes[i]}
	}
	slices.SortFunc(r.rts, func(a, b *rtState) int { return strings.Compare(a.obs.ID, b.obs.ID) })
	rtIndex := make(map[string]int, len(r.rts))
	for i, rt := range r.rts {
		rtIndex[rt.obs.ID] = i
	}
	order := make([]int, len(obs.Shards))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(obs.Shards[a].Key, obs.Shards[b].Key) })
	r.m = newModel(r.p, obs.Shards, order, r.now, hr)
	r.shards = make([]shardState, len(order))
	for k, oi := range order {
		s := &obs.Shards[oi]
		from := -1
		if i, ok := rtIndex[s.Runtime]; ok && s.Runtime != "" {
			from = i
		}
		cls := min(max(s.Priority, PriorityLow), PriorityHigh)
		r.shards[k] = shardState{obs: s, g: r.m.groupOf[oi], w: plannedWork(s, hr), cls: cls, from: from, to: from}
		r.shards[k].in, r.shards[k].out = plannedBytes(s, r.p)
		r.mixed = r.mixed || cls != r.shards[0].cls
	}
	r.jobRates()
}

// prioritize puts the priorities in force when the pool is short and the shards are of more than
// one class; otherwise it drops the per-class loads, and placement weighs every shard alike.
func (r *round) prioritize(short bool) {
	r.prio = short && r.mixed
	if r.prio {
		r.say("pool short at max_runtimes %d: priorities in force (high and normal shards keep their headroom, low ones are packed up to the cores)", r.p.MaxRuntimes)
		return
	}
	for _, rt := range r.rts {
		rt.up = nil
	}
}

// poolDemand is the demand of all shards together: what the pool is sized for.
func (r *round) poolDemand() float64 {
	pool := r.m.newLoad()
	for g := range r.m.groups {
		pool.add(g, r.m.groups[g].work)
	}
	r.demand = pool.demand
	return pool.demand
}

// health sets each runtime's speed, capacities and state (grace, draining, straggler), and counts
// the healthy runtimes and their capacity.
func (r *round) health() {
	p := r.p
	for _, rt := range r.rts {
		rt.speed = rt.obs.Speed
		if rt.speed <= 0 {
			rt.speed = 1
		}
		rt.grace = r.now.Sub(rt.obs.Since) < p.StartupGrace
		rt.draining = rt.obs.Draining
		rt.hardCap = float64(rt.obs.Cores) * rt.speed
		rt.fitCap = rt.hardCap * p.TargetUtilization
		rt.load = r.m.newLoad()
		if r.mixed {
			rt.up = []load{r.m.newLoad(), r.m.newLoad()}
		}
	}
	r.median = medianSpeed(r.rts)
	if p.StragglerSpeed > 0 && r.median > 0 {
		for _, rt := range r.rts {
			if !rt.draining && !rt.grace && rt.speed < p.StragglerSpeed*r.median {
				rt.straggler = true
			}
		}
	}
	for _, rt := range r.rts {
		if !rt.draining && !rt.straggler {
			r.healthy++
			r.capacity += float64(rt.obs.Cores) * p.TargetUtilization
		}
	}
}

// unknownCores is the unit of a pool of runtimes sized to their machine (cores_per_runtime 0) when
// no runtime reports its cores: so large that any demand needs one runtime, and the pool grows one
// at a time until the first reports.
const unknownCores = 1 << 20

// reportedCores is the size of a runtime of this pool: the median cores of the healthy runtimes
// (the lower middle one of an even count); with none healthy (a rolling replacement drains them
// all), of every runtime; and unknownCores when there are none at all.
func (r *round) reportedCores() int {
	var cores []int
	for _, rt := range r.rts {
		if !rt.draining && !rt.straggler {
			cores = append(cores, rt.obs.Cores)
		}
	}
	if len(cores) == 0 {
		for _, rt := range r.rts {
			cores = append(cores, rt.obs.Cores)
		}
	}
	if len(cores) == 0 {
		return unknownCores
	}
	slices.Sort(cores)
	return max(1, cores[(len(cores)-1)/2])
}

// current loads every runtime with the shards it holds, lists the shards that must be placed
// regardless of the migration budget, and returns what the placement needs as it stands: the
// runtimes' own demands (more than the pool's, as each runtime holds a less diverse mix), plus the
// shards that have no runtime. The pool does not shrink below it, or it would drain runtimes only
// to overload the others.
func (r *round) current() (held float64) {
	r.byRuntime = make([][]int, len(r.rts))
	for k := range r.shards {
		s := &r.shards[k]
		switch {
		case s.obs.Runtime == "":
			s.from, s.to, s.cause = -1, -1, "unplaced"
		case s.from < 0:
			s.to, s.cause = -1, "runtime "+s.obs.Runtime+" is gone"
		case r.rts[s.from].draining:
			s.to, s.cause = -1, "runtime "+s.obs.Runtime+" is draining"
		default:
			r.rts[s.from].place(s)
			r.byRuntime[s.from] = append(r.byRuntime[s.from], k)
			continue
		}
		r.mustPlace = append(r.mustPlace, k)
	}
	for _, rt := range r.rts {
		if !rt.draining {
			held += rt.load.demand
		}
	}
	unplaced := r.m.newLoad()
	for _, k := range r.mustPlace {
		unplaced.add(r.shards[k].g, r.shards[k].w)
	}
	return held + unplaced.demand
}

// voluntary lists the shards that should move, by urgency: off stragglers, off overloaded
// runtimes, off scale-down victims; each shard's cause says why.
func (r *round) voluntary() (strag, over, vict []int) {
	for i, rt := range r.rts {
		switch {
		case rt.draining:
		case rt.straggler:
			for _, k := range r.byRuntime[i] {
				r.shards[k].cause = fmt.Sprintf("straggler at %.2fx median", rt.speed/r.median)
			}
			strag = append(strag, r.byRuntime[i]...)
		case rt.victim:
		default:
			// Over the band between its share at target utilization (which sized the pool) and its
			// full capacity: a runtime added for the load receives some of it instead of idling,
			// and loads that only brush the target do not churn.
			cls, demand, limit, ok := rt.overloaded()
			if !ok {
				continue
			}
			ks := overflow(r.m, rt, r.byRuntime[i], r.shards, cls)
			for _, k := range ks {
				if r.prio {
					r.shards[k].cause = fmt.Sprintf("%s demand %.2f cores > %.2f of its %.2f", classWord(cls), demand, limit, rt.hardCap)
				} else {
					r.shards[k].cause = fmt.Sprintf("demand %.2f cores > %.2f of its %.2f", demand, limit, rt.hardCap)
				}
			}
			over = append(over, ks...)
		}
	}
	// Nodes whose NIC is past its move cap: bytes move to other nodes, after the cores' moves.
	moving := map[int]bool{}
	for _, k := range slices.Concat(strag, over) {
		moving[k] = true
	}
	r.forNIC = map[int]bool{}
	for _, n := range r.nodeList {
		if n.overloaded() {
			for _, k := range r.nicOverflow(n, moving) {
				r.forNIC[k] = true
				over = append(over, k)
			}
		}
	}
	for _, i := range victimOrder(r.rts) {
		for _, k := range r.byRuntime[i] {
			r.shards[k].cause = "consolidating to drain it"
		}
		vict = append(vict, r.byRuntime[i]...)
	}
	return strag, over, vict
}

// place places what must be placed, then spends the migration budget on the voluntary moves in
// order. It returns the demand of the shards that fit on no runtime, each counted alone.
func (r *round) place(strag, over, vict []int) (homeless float64) {
	pl := newPlacer(r.m, r.rts, r.shards, r.prio, r.demand <= r.capacity+eps)
	if n := pl.placeAll(r.mustPlace); n > 0 {
		r.say("%d shards have no runtime to run on", n)
	}
	if pl.overNIC > 0 {
		r.say("%d shards placed past their node's NIC: no node has room for their bytes", pl.overNIC)
	}
	budget := r.p.MigrationBudget
	noRoom := 0
	for li, list := range [][]int{strag, over, vict} {
		for _, k := range list {
			if budget == 0 {
				break
			}
			if pl.move(k) || li == 1 && pl.spill(k) {
				budget--
				continue
			}
			noRoom++
			if li == 1 && !r.forNIC[k] { // an overloaded runtime's shard that fits nowhere else needs a new runtime
				pl.homeless += pl.alone(k)
			}
		}
	}
	if left := len(strag) + len(over) + len(vict) - (r.p.MigrationBudget - budget) - noRoom; left > 0 {
		r.say("migration budget %d spent; %d voluntary moves wait for the next decisions", r.p.MigrationBudget, left)
	}
	budget -= pl.homecoming(budget)
	r.balanceBytes(pl, budget)
	return pl.homeless
}

// decision writes the Decision: the runtimes to drain, Desired, and the placement and moves
// against the observed placement, with their reasons. target is the healthy runtimes wanted,
// demand what the pool is sized for.
func (r *round) decision(target int, demand float64, panicking bool) Decision {
	dec := Decision{At: r.now, Mode: "stable", Placement: make(map[string]string, len(r.shards))}
	// Drain observed-draining runtimes, and emptied stragglers and victims (victims only as far as
	// the pool is still shrinking).
	shrink := r.healthy - target
	for _, rt := range r.rts {
		if rt.nShards > 0 {
			continue
		}
		switch {
		case rt.draining, rt.straggler:
		case rt.victim && shrink > 0:
			shrink--
		default:
			continue
		}
		dec.Drain = append(dec.Drain, rt.obs.ID)
	}
	// A straggler is replaced: it counts on top of the healthy runtimes wanted until it is drained.
	remaining := 0
	for _, rt := range r.rts {
		if rt.straggler && rt.nShards > 0 {
			remaining++
		}
	}
	dec.Desired = min(target+remaining, r.p.MaxRuntimes)
	dec.Demand = demand
	if panicking {
		dec.Mode = "panic"
	}

	moveCount := map[string]int{}
	for k := range r.shards {
		s := &r.shards[k]
		if s.to < 0 {
			continue
		}
		id := r.rts[s.to].obs.ID
		dec.Placement[s.obs.Key] = id
		if id == s.obs.Runtime {
			continue
		}
		mv := Move{Shard: s.obs.Key, From: s.obs.Runtime, To: id}
		if mv.From == "" {
			mv.Reason = fmt.Sprintf("placed %s on %s: unplaced", mv.Shard, id)
			moveCount["\x00"]++
		} else {
			mv.Reason = fmt.Sprintf("moved %s off %s: %s", mv.Shard, mv.From, s.cause)
			moveCount[mv.From+"\x00"+s.cause]++
		}
		dec.Moves = append(dec.Moves, mv)
	}
	for _, c := range sortedKeys(moveCount) {
		from, why, _ := strings.Cut(c, "\x00")
		if from == "" {
			r.say("placed %d unplaced shards", moveCount[c])
		} else {
			r.say("moved %d shards off %s: %s", moveCount[c], from, why)
		}
	}
	if len(dec.Drain) > 0 {
		r.say("drain %s", strings.Join(dec.Drain, ", "))
	}
	dec.Reasons = r.reasons
	return dec
}

// medianSpeed is the median speed of the runtimes that can be judged (past startup grace, not
// draining); 0 when fewer than two can be.
func medianSpeed(rts []*rtState) float64 {
	var v []float64
	for _, r := range rts {
		if !r.draining && !r.grace {
			v = append(v, r.speed)
		}
	}
	if len(v) < 2 {
		return 0
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// classWord names the load a class competes with, for reasons.
func classWord(cls int) string {
	switch {
	case cls >= PriorityHigh:
		return "high-class"
	case cls == PriorityNormal:
		return "normal-and-high"
	}
	return "total"
}
