package autoscaler

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// The load model.
//
// A shard's load is periodic: every Period, starting at Phase (an offset from the Unix epoch), its
// Work (core-seconds at speed 1) arrives spread evenly over Burst. What a set of shards needs is not
// the sum of their peak rates: bursts that do not coincide share cores.
//
// Phase-locked jobs (a class: periods within lockTolerance of each other, e.g. replicas of one
// model on the same hardware) keep their relative phases, so their load is predicted exactly on a
// ring of profileSlots slots covering one period from now: slot i covers [now + i*H/S,
// now + (i+1)*H/S) for the class's period H, and each shard's next burst is laid onto it, its tail
// wrapping to the start. A slot holds the average cores the class needs in it. Two jobs of a class
// whose bursts fall in different slots share cores; overlapping ones add up.
//
// Jobs of different classes drift against each other: with periods of 1.0s and 1.6s every
// alignment of their bursts comes round every 2.7s, so a snapshot of their summed profile is only
// right for a moment, and its maximum over any window of seconds is the sum of their peaks: static
// provisioning. The decider treats classes as independent instead and sizes for
//
//	demand = steady + min(sum of class peaks, max(mean + z*sd, mean + max over classes of (peak - mean)))
//
// where mean and sd are those of the summed load of the classes (the means add, and so do the
// variances of independent classes; each class's mean, variance and peak are read off its ring), z
// is Policy.OverlapSigmas, and the second term says that the biggest class will reach its peak
// while the others run at their mean. The same formula sizes the pool (all shards) and decides
// whether a shard fits on a runtime (the shards on it).
//
// Policy.DelayBudget widens every burst by that fraction of its period: a step's aggregation may
// take that much longer than its burst, which lowers the peak rate planned for.
//
// Resolution is one slot: a burst shorter than a slot is spread over the slot, and a burst longer
// than its period is a steady Work/Period. A shard whose Period is not measured yet (0) is treated
// as steady: Work / max(Burst, Policy.UnknownBurst) cores at all times (with the default of 1s, its
// work once a second, spread evenly), until the first measurements one or two steps later. A
// smaller UnknownBurst is more conservative.
//
// With Policy.Packing off, every shard is assumed to burst at the same time: demand is the sum of
// the peak rates, as static provisioning reserves.
const (
	profileSlots  = 128
	lockTolerance = 0.001
	eps           = 1e-9
	// candidates is how many of the least loaded runtimes placement weighs a shard on.
	candidates = 4
)

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
}

// jobHeadroom is one job's factor on its work, and when the feedback last changed it.
type jobHeadroom struct {
	factor  float64
	changed time.Time
}

// The closed loop's steps and bounds: a job missing its slowdown budget gets 25% more headroom at
// each HeadroomPeriod; one well inside it (below half the budget) 10% less. The bounds keep a
// wrong measurement from reserving without limit, or from planning for much less than the work.
const (
	headroomGrow   = 1.25
	headroomShrink = 0.9
	minHeadroom    = 0.5
	maxHeadroom    = 4
)

type sample struct {
	at     time.Time
	demand float64
}

// NewDecider returns a decider without history.
func NewDecider() *Decider { return &Decider{} }

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

// Decide returns the pool size and placement for the observed state at time now and records what it
// needs for later decisions (demand history, last change, panic state).
func (d *Decider) Decide(p Policy, obs Observations, now time.Time) Decision {
	dec := Decision{At: now, Mode: "stable", Placement: make(map[string]string, len(obs.Shards))}
	var reasons []string
	say := func(format string, args ...any) { reasons = append(reasons, fmt.Sprintf(format, args...)) }

	// Runtimes, sorted by id.
	rts := make([]*rtState, len(obs.Runtimes))
	for i := range obs.Runtimes {
		rts[i] = &rtState{obs: obs.Runtimes[i]}
	}
	slices.SortFunc(rts, func(a, b *rtState) int { return strings.Compare(a.obs.ID, b.obs.ID) })
	rtIndex := make(map[string]int, len(rts))
	for i, r := range rts {
		rtIndex[r.obs.ID] = i
	}

	// Shards, sorted by key, grouped by job and timing; groups sorted into classes.
	order := make([]int, len(obs.Shards))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(obs.Shards[a].Key, obs.Shards[b].Key) })
	hr := d.feedback(p, obs, now, say)
	m := newModel(p, obs.Shards, order, now, hr)
	shards := make([]shardState, len(order))
	for k, oi := range order {
		s := &obs.Shards[oi]
		from := -1
		if i, ok := rtIndex[s.Runtime]; ok && s.Runtime != "" {
			from = i
		}
		shards[k] = shardState{obs: s, g: m.groupOf[oi], w: plannedWork(s, hr), from: from, to: from}
	}

	// Pool demand.
	pool := m.newLoad()
	for g := range m.groups {
		pool.add(g, m.groups[g].work)
	}
	demand := pool.demand
	d.record(p, now, demand)

	// Runtime health.
	for _, r := range rts {
		r.speed = r.obs.Speed
		if r.speed <= 0 {
			r.speed = 1
		}
		r.grace = now.Sub(r.obs.Since) < p.StartupGrace
		r.draining = r.obs.Draining
		r.hardCap = float64(r.obs.Cores) * r.speed
		r.fitCap = r.hardCap * p.TargetUtilization
		r.load = m.newLoad()
	}
	median := medianSpeed(rts)
	if p.StragglerSpeed > 0 && median > 0 {
		for _, r := range rts {
			if !r.draining && !r.grace && r.speed < p.StragglerSpeed*median {
				r.straggler = true
			}
		}
	}
	healthy := 0
	capacity := 0.0
	for _, r := range rts {
		if !r.draining && !r.straggler {
			healthy++
			capacity += float64(r.obs.Cores) * p.TargetUtilization
		}
	}

	// Current load of every runtime; shards that must move regardless of the budget.
	var mustPlace []int
	byRuntime := make([][]int, len(rts))
	for k := range shards {
		s := &shards[k]
		switch {
		case s.obs.Runtime == "":
			s.from, s.to, s.cause = -1, -1, "unplaced"
		case s.from < 0:
			s.to, s.cause = -1, "runtime "+s.obs.Runtime+" is gone"
		case rts[s.from].draining:
			s.to, s.cause = -1, "runtime "+s.obs.Runtime+" is draining"
		default:
			rts[s.from].place(s.g, s.w)
			byRuntime[s.from] = append(byRuntime[s.from], k)
			continue
		}
		mustPlace = append(mustPlace, k)
	}
	// What the placement needs as it stands: the runtimes' own demands (more than the pool's, as
	// each runtime holds a less diverse mix), plus the shards that have no runtime. The pool does
	// not shrink below it, or it would drain runtimes only to overload the others.
	held := 0.0
	for _, r := range rts {
		if !r.draining {
			held += r.load.demand
		}
	}
	unplaced := m.newLoad()
	for _, k := range mustPlace {
		unplaced.add(shards[k].g, shards[k].w)
	}
	held += unplaced.demand

	// Pool size from demand.
	target := d.scale(p, now, demand, held, capacity, healthy, len(shards) > 0, say)
	if target < healthy {
		chooseVictims(rts, shards, healthy-target)
	}

	// Voluntary moves, in order of urgency: off stragglers, off overloaded runtimes, off victims.
	var strag, over, vict []int
	for i, r := range rts {
		switch {
		case r.draining:
		case r.straggler:
			for _, k := range byRuntime[i] {
				shards[k].cause = fmt.Sprintf("straggler at %.2fx median", r.speed/median)
			}
			strag = append(strag, byRuntime[i]...)
		case r.victim:
		case r.load.demand > r.moveCap()+eps:
			// Over the band between its share at target utilization (which sized the pool) and its
			// full capacity: a runtime added for the load receives some of it instead of idling,
			// and loads that only brush the target do not churn.
			ks := overflow(m, r, byRuntime[i], shards)
			for _, k := range ks {
				shards[k].cause = fmt.Sprintf("demand %.2f cores > %.2f of its %.2f", r.load.demand, r.moveCap(), r.hardCap)
			}
			over = append(over, ks...)
		}
	}
	for _, i := range victimOrder(rts) {
		for _, k := range byRuntime[i] {
			shards[k].cause = "consolidating to drain it"
		}
		vict = append(vict, byRuntime[i]...)
	}

	// Place what must be placed, then spend the migration budget.
	pl := newPlacer(m, rts, shards)
	if n := pl.placeAll(mustPlace); n > 0 {
		say("%d shards have no runtime to run on", n)
	}
	budget := p.MigrationBudget
	noRoom := 0
	for li, list := range [][]int{strag, over, vict} {
		for _, k := range list {
			if budget == 0 {
				break
			}
			if pl.move(k) {
				budget--
				continue
			}
			noRoom++
			if li == 1 { // an overloaded runtime's shard that fits nowhere else needs a new runtime
				pl.homeless += pl.alone(k)
			}
		}
	}
	if left := len(strag) + len(over) + len(vict) - (p.MigrationBudget - budget) - noRoom; left > 0 {
		say("migration budget %d spent; %d voluntary moves wait for the next decisions", p.MigrationBudget, left)
	}

	// Shards that fit nowhere: ask for runtimes to hold them.
	if pl.homeless > eps {
		extra := int(math.Ceil(pl.homeless/(float64(p.CoresPerRuntime)*p.TargetUtilization) - eps))
		want := min(healthy+extra, p.MaxRuntimes)
		switch {
		case want <= target:
		case !d.panicking && d.decided && now.Sub(d.lastChange) < p.ScaleUpCooldown:
			say("shards needing %.2f cores fit on no runtime; scale-up cooldown holds %d", pl.homeless, target)
		default:
			say("shards needing %.2f cores fit on no runtime: %d -> %d runtimes", pl.homeless, target, want)
			target = want
		}
	}
	prev := d.target
	if !d.decided {
		prev = healthy // the first decision starts from the observed pool
	}
	if target != prev {
		d.lastChange = now
	}
	d.target, d.decided = target, true

	// Drain observed-draining runtimes, and emptied stragglers and victims (victims only as far as
	// the pool is still shrinking).
	shrink := healthy - target
	for _, r := range rts {
		if r.nShards > 0 {
			continue
		}
		switch {
		case r.draining, r.straggler:
		case r.victim && shrink > 0:
			shrink--
		default:
			continue
		}
		dec.Drain = append(dec.Drain, r.obs.ID)
	}
	// A straggler is replaced: it counts on top of the healthy runtimes wanted until it is drained.
	remaining := 0
	for _, r := range rts {
		if r.straggler && r.nShards > 0 {
			remaining++
		}
	}
	dec.Desired = min(target+remaining, p.MaxRuntimes)
	dec.Demand = d.sized(p, now)
	if d.panicking {
		dec.Mode = "panic"
	}

	// Placement and moves.
	moveCount := map[string]int{}
	for k := range shards {
		s := &shards[k]
		if s.to < 0 {
			continue
		}
		id := rts[s.to].obs.ID
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
			say("placed %d unplaced shards", moveCount[c])
		} else {
			say("moved %d shards off %s: %s", moveCount[c], from, why)
		}
	}
	if len(dec.Drain) > 0 {
		say("drain %s", strings.Join(dec.Drain, ", "))
	}
	dec.Reasons = reasons
	return dec
}

// plannedWork is the work the model plans for a shard: its measured work times its job's headroom.
func plannedWork(s *ShardObs, hr map[string]float64) float64 {
	w := max(s.Work, 0)
	if f, ok := hr[s.Job]; ok {
		w *= f
	}
	return w
}

// feedback is the closed loop (Policy.SlowdownBudget): it measures each job's step slowdown, the
// longest QueueWait of its shards over its Period, and grows the job's headroom while it misses the
// budget and shrinks it while it is below half the budget, at most once per HeadroomPeriod. A job
// whose period is not measured yet keeps its headroom. It returns the headroom of every observed
// job that has one other than 1 (nil with the feedback off) and forgets the jobs no longer observed.
// Pending is not read: how many messages make a backlog depends on the job's ranks, which the
// decider does not observe, and a backlog shows in QueueWait too.
func (d *Decider) feedback(p Policy, obs Observations, now time.Time, say func(string, ...any)) map[string]float64 {
	if p.SlowdownBudget <= 0 {
		d.headroom = nil
		return nil
	}
	slow := map[string]float64{} // job -> measured slowdown
	seen := map[string]bool{}
	for i := range obs.Shards {
		s := &obs.Shards[i]
		seen[s.Job] = true
		if s.Period > 0 {
			slow[s.Job] = max(slow[s.Job], max(s.QueueWait, 0).Seconds()/s.Period.Seconds())
		}
	}
	if d.headroom == nil {
		d.headroom = map[string]jobHeadroom{}
	}
	for job := range d.headroom {
		if !seen[job] {
			delete(d.headroom, job)
		}
	}
	var up, down []string
	for _, job := range sortedKeys(slow) {
		h, ok := d.headroom[job]
		if !ok {
			h.factor = 1
		}
		if ok && now.Sub(h.changed) < p.HeadroomPeriod {
			continue
		}
		x, was := slow[job], h.factor
		switch {
		case x > p.SlowdownBudget && h.factor < maxHeadroom:
			h = jobHeadroom{min(h.factor*headroomGrow, maxHeadroom), now}
			up = append(up, fmt.Sprintf("%s %.2f->%.2f at %.1f%%", job, was, h.factor, 100*x))
		case x < p.SlowdownBudget/2 && h.factor > minHeadroom:
			h = jobHeadroom{max(h.factor*headroomShrink, minHeadroom), now}
			down = append(down, fmt.Sprintf("%s %.2f->%.2f at %.1f%%", job, was, h.factor, 100*x))
		}
		d.headroom[job] = h
	}
	list := func(s []string) string {
		if len(s) > 5 {
			return strings.Join(s[:5], ", ") + fmt.Sprintf(" and %d more", len(s)-5)
		}
		return strings.Join(s, ", ")
	}
	if len(up) > 0 {
		say("headroom up for %d jobs over the %.1f%% slowdown budget: %s", len(up), 100*p.SlowdownBudget, list(up))
	}
	if len(down) > 0 {
		say("headroom down for %d jobs well inside the %.1f%% slowdown budget: %s", len(down), 100*p.SlowdownBudget, list(down))
	}
	hr := map[string]float64{}
	for job, h := range d.headroom {
		if h.factor != 1 {
			hr[job] = h.factor
		}
	}
	return hr
}

// Headroom returns the closed loop's factor on each observed job's work (Policy.SlowdownBudget),
// for the jobs whose factor is not 1: a copy.
func (d *Decider) Headroom() map[string]float64 {
	hr := map[string]float64{}
	for job, h := range d.headroom {
		if h.factor != 1 {
			hr[job] = h.factor
		}
	}
	return hr
}

// record adds a demand sample and forgets those older than both windows.
func (d *Decider) record(p Policy, now time.Time, demand float64) {
	keep := max(p.StableWindow, p.PanicWindow)
	i := 0
	for i < len(d.samples) && now.Sub(d.samples[i].at) >= keep {
		i++
	}
	d.samples = append(d.samples[i:], sample{now, demand})
}

// windowMax is the highest demand sampled within w before now.
func (d *Decider) windowMax(now time.Time, w time.Duration) float64 {
	m := 0.0
	for _, s := range d.samples {
		if now.Sub(s.at) < w || s.at.Equal(now) {
			m = max(m, s.demand)
		}
	}
	return m
}

// sized is the demand the pool is sized for in the current mode.
func (d *Decider) sized(p Policy, now time.Time) float64 {
	if d.panicking {
		return d.windowMax(now, p.PanicWindow)
	}
	return d.windowMax(now, p.StableWindow)
}

// scale applies the panic and stable rules and returns the number of healthy runtimes wanted.
func (d *Decider) scale(p Policy, now time.Time, demand, held, capacity float64, healthy int, anyShards bool, say func(string, ...any)) int {
	perRuntime := float64(p.CoresPerRuntime) * p.TargetUtilization
	need := func(x float64) int { return int(math.Ceil(x/perRuntime - eps)) }
	cur := d.target
	if !d.decided {
		cur = healthy
	}
	ratio := math.Inf(1)
	if capacity > 0 {
		ratio = demand / capacity
	} else if demand == 0 {
		ratio = 0
	}
	if ratio >= p.PanicThreshold {
		if !d.panicking {
			say("panic: demand %.2f cores >= %.1f x capacity %.2f", demand, p.PanicThreshold, capacity)
		}
		d.panicking = true
		d.lastPanic = now
	} else if d.panicking && now.Sub(d.lastPanic) >= p.PanicWindow {
		d.panicking = false
		say("panic over: demand %.2f cores < %.1f x capacity %.2f for %v", demand, p.PanicThreshold, capacity, p.PanicWindow)
	}

	var target int
	if d.panicking {
		peak := d.windowMax(now, p.PanicWindow)
		target = max(cur, need(peak))
		say("panic: sized for %.2f cores, the peak of the last %v; never scaling down", peak, p.PanicWindow)
	} else {
		peak := d.windowMax(now, p.StableWindow)
		want := need(peak)
		target = want
		since := now.Sub(d.lastChange)
		switch {
		case want > cur && d.decided && since < p.ScaleUpCooldown:
			target = cur
			say("scale-up cooldown: holding %d (want %d; last change %v ago < %v)", cur, want, since.Round(time.Millisecond), p.ScaleUpCooldown)
		case want < cur && d.decided && since < p.ScaleDownCooldown:
			target = cur
			say("scale-down cooldown: holding %d (want %d; last change %v ago < %v)", cur, want, since.Round(time.Millisecond), p.ScaleDownCooldown)
		case want < cur && need(held) >= cur:
			target = cur
			say("holding %d: the runtimes' own demands add up to %.2f cores (fragmentation)", cur, held)
		case want < cur:
			floor := max(want, need(held))
			step := max(1, int(math.Floor(float64(cur)*p.MaxScaleDownFraction+eps)))
			target = max(floor, cur-step)
			say("scale down %d -> %d (want %d, placement needs %d; at most %.0f%% per decision)", cur, target, want, need(held), 100*p.MaxScaleDownFraction)
		}
		say("demand %.2f cores now, peak %.2f over the stable window %v: %d runtimes of %d cores at %.0f%%",
			demand, peak, p.StableWindow, want, p.CoresPerRuntime, 100*p.TargetUtilization)
	}
	lo := p.MinRuntimes
	if anyShards {
		lo = max(lo, 1)
	}
	if target < lo {
		target = lo
		say("held at min_runtimes %d", p.MinRuntimes)
	}
	if target > p.MaxRuntimes {
		say("capped at max_runtimes %d (wanted %d)", p.MaxRuntimes, target)
		target = p.MaxRuntimes
	}
	return target
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

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// model is one decision's load model: the shards' groups (a job's shards with one timing) and the
// classes of phase-locked groups.
type model struct {
	groups  []group
	groupOf []int // index in Observations.Shards -> group
	classes int
	slots   int // profileSlots, or 1 without packing
	z       float64
	packing bool
}

// group is the shards of one job with one timing; they share a load shape.
type group struct {
	job    string
	class  int       // -1: steady (period not measured)
	steady float64   // steady: cores per core-second of work per step
	dense  []float64 // cores per core-second of work per step, per slot of its class's ring
	shape  []slotLoad
	// sums over the shape, for updating a ring's mean and variance in O(len(shape))
	sumY, sumY2, peakY float64
	work               float64
}

type slotLoad struct {
	slot int32
	load float64
}

func newModel(p Policy, shards []ShardObs, order []int, now time.Time, hr map[string]float64) *model {
	m := &model{groupOf: make([]int, len(shards)), slots: profileSlots, z: p.OverlapSigmas, packing: p.Packing}
	if !p.Packing {
		m.slots = 1
	}
	type timing struct {
		job                  string
		period, phase, burst time.Duration
	}
	index := map[timing]int{}
	var timings []timing
	for _, oi := range order {
		s := &shards[oi]
		t := timing{s.Job, max(s.Period, 0), s.Phase, max(s.Burst, 0)}
		g, ok := index[t]
		if !ok {
			g = len(m.groups)
			index[t] = g
			timings = append(timings, t)
			m.groups = append(m.groups, group{job: s.Job, class: -1})
		}
		m.groupOf[oi] = g
		m.groups[g].work += plannedWork(s, hr)
	}
	// Classes: groups by period, a new class whenever the period exceeds the class's first by more
	// than lockTolerance. Without packing every group is a class of its own.
	var known []int
	for g, t := range timings {
		if t.period > 0 {
			known = append(known, g)
		}
	}
	slices.SortStableFunc(known, func(a, b int) int { return cmp.Compare(timings[a].period, timings[b].period) })
	var horizon []time.Duration
	var first time.Duration
	for _, g := range known {
		P := timings[g].period
		if !m.packing || len(horizon) == 0 || float64(P) > float64(first)*(1+lockTolerance) {
			horizon = append(horizon, P)
			first = P
		}
		c := len(horizon) - 1
		horizon[c] = max(horizon[c], P)
		m.groups[g].class = c
	}
	m.classes = len(horizon)
	for g := range m.groups {
		gr, t := &m.groups[g], timings[g]
		if gr.class < 0 {
			gr.steady = 1 / max(t.burst, p.UnknownBurst).Seconds()
			continue
		}
		gr.dense = ringShape(t.period, t.phase, t.burst+time.Duration(p.DelayBudget*float64(t.period)), horizon[gr.class], now)
		if !m.packing {
			gr.dense = []float64{slices.Max(gr.dense)}
		}
		for i, y := range gr.dense {
			if y > 0 {
				gr.shape = append(gr.shape, slotLoad{int32(i), y})
				gr.sumY += y
				gr.sumY2 += y * y
				gr.peakY = max(gr.peakY, y)
			}
		}
	}
	return m
}

// ringShape lays the next burst of a shard (one core-second of work per step) onto a ring of
// profileSlots slots covering [now, now+horizon), wrapping its tail: cores per slot.
func ringShape(period, phase, burst, horizon time.Duration, now time.Time) []float64 {
	dense := make([]float64, profileSlots)
	delta := horizon.Seconds() / profileSlots
	bw := min(max(burst.Seconds(), delta), period.Seconds())
	// Offset of now into the cycle in integer nanoseconds, so that float rounding of large Unix
	// times does not move it.
	o := (now.UnixNano() - int64(phase)) % int64(period)
	if o < 0 {
		o += int64(period)
	}
	start := 0.0
	if o > 0 {
		start = (period - time.Duration(o)).Seconds()
	}
	xa, xb := start/delta, (start+bw)/delta
	for i := math.Floor(xa); i < xb; i++ {
		ov := min(xb, i+1) - max(xa, i)
		dense[int(i)%profileSlots] += ov / bw
	}
	return dense
}

// classStats are a ring's sum, sum of squares and peak over its slots.
type classStats struct{ sum, sumsq, peak float64 }

// classLoad is the load of one class on a runtime (or the pool). While one group holds it, its
// ring is that group's shape times w and is not materialized.
type classLoad struct {
	g    int
	w    float64
	ring []float64
	st   classStats
}

// load is the load of a set of shards: per class rings and the aggregates the demand formula needs.
type load struct {
	m       *model
	cls     []*classLoad // by class
	present []int        // classes with load, in the order they came
	mu, vr  float64      // mean and variance of the summed classes
	sumPeak float64
	excess  float64 // max over classes of peak - mean (an upper bound after adds; exact after removes)
	steady  float64
	demand  float64
}

func (m *model) newLoad() load { return load{m: m, cls: make([]*classLoad, m.classes)} }

func (m *model) meanVar(st classStats) (mu, vr float64) {
	S := float64(m.slots)
	mu = st.sum / S
	return mu, max(0, st.sumsq/S-mu*mu)
}

// combine is the demand formula (see the model at the top of the file).
func (m *model) combine(mu, vr, sumPeak, excess, steady float64) float64 {
	if !m.packing {
		return steady + sumPeak
	}
	return steady + min(sumPeak, max(mu+m.z*math.Sqrt(vr), mu+excess))
}

func (l *load) ringAt(cl *classLoad, slot int32) float64 {
	if cl.ring != nil {
		return cl.ring[slot]
	}
	return cl.w * l.m.groups[cl.g].dense[slot]
}

// after returns the stats of group gi's class once w more work of it is added.
func (l *load) after(gi int, w float64) classStats {
	g := &l.m.groups[gi]
	cl := l.cls[g.class]
	if cl == nil {
		return classStats{w * g.sumY, w * w * g.sumY2, w * g.peakY}
	}
	if cl.ring == nil && cl.g == gi {
		W := cl.w + w
		return classStats{W * g.sumY, W * W * g.sumY2, W * g.peakY}
	}
	dot, peak := 0.0, cl.st.peak
	for _, sl := range g.shape {
		x := l.ringAt(cl, sl.slot)
		dot += x * sl.load
		peak = max(peak, x+w*sl.load)
	}
	return classStats{cl.st.sum + w*g.sumY, cl.st.sumsq + 2*w*dot + w*w*g.sumY2, peak}
}

// demandAfter is the demand once w more work of group gi is added.
func (l *load) demandAfter(gi int, w float64) float64 {
	g := &l.m.groups[gi]
	if g.class < 0 {
		return l.m.combine(l.mu, l.vr, l.sumPeak, l.excess, l.steady+w*g.steady)
	}
	var old classStats
	if cl := l.cls[g.class]; cl != nil {
		old = cl.st
	}
	st := l.after(gi, w)
	mu0, v0 := l.m.meanVar(old)
	mu1, v1 := l.m.meanVar(st)
	return l.m.combine(l.mu-mu0+mu1, l.vr-v0+v1, l.sumPeak-old.peak+st.peak, max(l.excess, st.peak-mu1), l.steady)
}

func (l *load) add(gi int, w float64) {
	g := &l.m.groups[gi]
	if g.class < 0 {
		l.steady += w * g.steady
		l.demand = l.m.combine(l.mu, l.vr, l.sumPeak, l.excess, l.steady)
		return
	}
	st := l.after(gi, w)
	cl := l.cls[g.class]
	var old classStats
	switch {
	case cl == nil:
		cl = &classLoad{g: gi, w: w}
		l.cls[g.class] = cl
		l.present = append(l.present, g.class)
	case cl.ring == nil && cl.g == gi:
		old = cl.st
		cl.w += w
	default:
		old = cl.st
		if cl.ring == nil {
			cl.ring = make([]float64, len(g.dense))
			for _, sl := range l.m.groups[cl.g].shape {
				cl.ring[sl.slot] = cl.w * sl.load
			}
		}
		for _, sl := range g.shape {
			cl.ring[sl.slot] += w * sl.load
		}
	}
	cl.st = st
	mu0, v0 := l.m.meanVar(old)
	mu1, v1 := l.m.meanVar(st)
	l.mu += mu1 - mu0
	l.vr += v1 - v0
	l.sumPeak += st.peak - old.peak
	l.excess = max(l.excess, st.peak-mu1)
	l.demand = l.m.combine(l.mu, l.vr, l.sumPeak, l.excess, l.steady)
}

func (l *load) remove(gi int, w float64) {
	g := &l.m.groups[gi]
	if g.class < 0 {
		l.steady = max(0, l.steady-w*g.steady)
		l.demand = l.m.combine(l.mu, l.vr, l.sumPeak, l.excess, l.steady)
		return
	}
	cl := l.cls[g.class]
	if cl == nil {
		return
	}
	if cl.ring == nil {
		if cl.g == gi {
			cl.w -= w
			cl.st = classStats{cl.w * g.sumY, cl.w * cl.w * g.sumY2, cl.w * g.peakY}
		}
	} else {
		for _, sl := range g.shape {
			cl.ring[sl.slot] = max(0, cl.ring[sl.slot]-w*sl.load)
		}
		cl.st = classStats{}
		for _, x := range cl.ring {
			cl.st.sum += x
			cl.st.sumsq += x * x
			cl.st.peak = max(cl.st.peak, x)
		}
	}
	if cl.st.peak <= eps {
		l.cls[g.class] = nil
		l.present = slices.DeleteFunc(l.present, func(c int) bool { return c == g.class })
	}
	l.mu, l.vr, l.sumPeak, l.excess = 0, 0, 0, 0
	for _, c := range l.present {
		st := l.cls[c].st
		mu, vr := l.m.meanVar(st)
		l.mu += mu
		l.vr += vr
		l.sumPeak += st.peak
		l.excess = max(l.excess, st.peak-mu)
	}
	l.demand = l.m.combine(l.mu, l.vr, l.sumPeak, l.excess, l.steady)
}
