package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/fanin-ml/fanin/autoscaler"
)

// The model (docs/AUTOSCALING.md, "The simulator"):
//
// A job trains in synchronous (BSP) steps. Step k starts at T_k, when the parameters of step k-1 are
// out; rank i computes for c_i(k) (its PAI batch time) and then publishes one gradient per shard,
// all at T_k + c_i(k). The step's aggregation burst runs from the fastest rank's gradients to the
// slowest's. Summing one rank's gradient of a shard costs shard bytes / Throughput core-seconds (at
// speed 1). Step k ends, and k+1 starts, when every shard has summed every rank.
//
// A runtime is a FIFO fluid server: the work one rank brings to the shards of a job that the
// runtime hosts is a batch; batches are served in arrival order at cores x speed core-seconds per
// second, and a batch takes at least the time of one shard's unit on one core (a shard runs on one
// core). A runtime is paid for from the moment it is asked for (it is ready StartupDelay later)
// until it is drained and has finished its queue.
//
// The ideal step is the same step on the job's static reservation: ceil(work per step / typical
// burst) cores of its own, speed 1, no migrations. A step's slowdown is how much longer it took
// than its ideal, as a fraction of the ideal step time (never negative).

// epoch is the simulated clock's origin.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// history is how many recent steps a job's measured period, burst and queue wait average over.
const history = 8

// Result is what one simulation measured.
type Result struct {
	Policy autoscaler.Policy
	// Cost: core-seconds reserved by the elastic pool, and by static peak provisioning (every job
	// reserving its static cores for its whole life).
	ElasticCoreSeconds, StaticCoreSeconds float64
	// WorkCoreSeconds is the aggregation work that arrived (at speed 1): what a pool that always had
	// exactly the cores busy would cost, the floor no real pool reaches.
	WorkCoreSeconds               float64
	Slowdown                      Dist // per step, as a fraction of the ideal step time
	Jobs, Steps                   int
	Migrations                    int // moves of placed shards
	Placements                    int // first placements of new shards
	Decisions, PanicDecisions     int
	RuntimesStarted, SlowRuntimes int
	PeakCores                     float64 // most cores reserved at once
	Pool                          []PoolSample
	JobRows                       []JobRow
}

// CostRatio is elastic over static core-seconds.
func (r *Result) CostRatio() float64 {
	if r.StaticCoreSeconds == 0 {
		return 0
	}
	return r.ElasticCoreSeconds / r.StaticCoreSeconds
}

// Dist summarizes a distribution.
type Dist struct {
	N                        int
	Mean, P50, P90, P99, Max float64
}

func summarize(x []float64) Dist {
	if len(x) == 0 {
		return Dist{}
	}
	s := slices.Clone(x)
	slices.Sort(s)
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	q := func(p float64) float64 { return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1)] }
	return Dist{N: len(s), Mean: sum / float64(len(s)), P50: q(0.5), P90: q(0.9), P99: q(0.99), Max: s[len(s)-1]}
}

// PoolSample is the pool at one decision tick.
type PoolSample struct {
	T        float64 // seconds since the start
	Reserved float64 // cores paid for (starting, ready and draining runtimes)
	Ready    float64 // cores of ready runtimes
	Demand   float64 // the decider's sizing demand (Decision.Demand)
	Load     float64 // work that arrived since the last tick, per second: the mean cores needed
	Static   float64 // cores static provisioning would reserve now
	Runtimes int     // runtimes in the pool: ready or starting, not draining
}

// JobRow is one job's outcome.
type JobRow struct {
	ID, Model, Trace          string
	Shards, Ranks             int
	Arrival, Lifetime         float64 // seconds
	WorkPerStep               float64 // core-seconds at speed 1
	StaticCores               int
	MeanPeriod                float64 // seconds
	Steps                     int
	MeanSlowdown, P99Slowdown float64
}

type evKind uint8

const (
	evDecide evKind = iota
	evJobArrive
	evJobEnd
	evRank
	evReady
)

type event struct {
	t                    float64
	seq                  uint64
	kind                 evKind
	job, step, rank, rti int
}

type queue []event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].t != q[j].t {
		return q[i].t < q[j].t
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type runtimeSim struct {
	id       string
	cores    int
	speed    float64 // true speed
	created  float64
	ready    float64
	end      float64 // when it stops costing: +Inf while in the pool
	isReady  bool
	draining bool // drained or cancelled: no longer part of the pool
	busy     float64
	worked   bool
	nShards  int
}

type jobSim struct {
	spec        JobSpec
	model       string
	steps       [][]float64 // seconds per rank, per iteration (cycled)
	pos         int
	ranks       int
	shardBytes  []int64
	maxShard    int64
	keys        []string
	place       []int
	avail       []float64
	deferred    []int // rank units per shard that arrived while it was unplaced
	nDeferred   int
	groups      []jobGroup
	dirty       bool
	staticCores int
	work        float64 // core-seconds per step at speed 1
	end         float64
	ended       bool

	step      int
	stepStart float64
	cur       []float64
	arrived   int
	stepEnd   float64

	starts, bursts, waits []float64 // recent history
	slow                  []float64
	periodSum             float64
}

type jobGroup struct {
	rt              int
	bytes, maxBytes int64
	avail           float64
}

type shardRef struct{ job, shard int }

type state struct {
	c       Config
	pol     autoscaler.Policy
	dec     *autoscaler.Decider
	q       queue
	seq     uint64
	rtRNG   *rand.Rand
	rts     []*runtimeSim
	rtIndex map[string]int
	jobs    []*jobSim
	active  []int
	byKey   map[string]shardRef
	obs     autoscaler.Observations
	res     Result
	workIn  float64 // core-seconds arrived since the last tick
	lastT   float64
	slows   []float64
}

// Run simulates the workload under the policy. tr may be nil when every job of the workload carries
// its own step times. The result depends only on its inputs.
func Run(c Config, pol autoscaler.Policy, wl *Workload, tr *Traces) (*Result, error) {
	if err := errors.Join(c.Validate(), pol.Validate()); err != nil {
		return nil, err
	}
	if err := wl.check(tr); err != nil {
		return nil, err
	}
	s := &state{
		c: c, pol: pol, dec: autoscaler.NewDecider(),
		rtRNG:   rand.New(rand.NewPCG(c.Seed, 0x72756e74696d65)), // "runtime"
		rtIndex: map[string]int{}, byKey: map[string]shardRef{},
	}
	s.res.Policy = pol
	for range pol.MinRuntimes {
		s.startRuntime(0, 0)
	}
	for i, js := range wl.Jobs {
		j, err := s.newJob(js, tr)
		if err != nil {
			return nil, err
		}
		s.jobs = append(s.jobs, j)
		if js.Arrival < c.Duration.Seconds() {
			s.push(event{t: js.Arrival, kind: evJobArrive, job: i})
		}
	}
	s.push(event{t: 0, kind: evDecide})
	end := c.Duration.Seconds()
	for s.q.Len() > 0 {
		e := heap.Pop(&s.q).(event)
		if e.t > end {
			break
		}
		switch e.kind {
		case evDecide:
			s.decide(e.t, true)
			s.push(event{t: e.t + c.Interval.Seconds(), kind: evDecide})
		case evJobArrive:
			s.arrive(e.job, e.t)
		case evJobEnd:
			s.endJob(e.job)
		case evRank:
			s.rank(e.job, e.step, e.rank, e.t)
		case evReady:
			s.rts[e.rti].isReady = true
		}
	}
	s.finish(end)
	return &s.res, nil
}

func (s *state) push(e event) {
	e.seq = s.seq
	s.seq++
	heap.Push(&s.q, e)
}

func (s *state) clock(t float64) time.Time {
	return epoch.Add(time.Duration(math.Round(t * 1e9)))
}

func (s *state) startRuntime(t, delay float64) {
	r := &runtimeSim{id: fmt.Sprintf("rt-%d", len(s.rts)+1), cores: s.pol.CoresPerRuntime, speed: 1,
		created: t, ready: t + delay, end: math.Inf(1)}
	if s.rtRNG.Float64() < s.c.SlowFraction {
		r.speed = s.c.SlowSpeed
		s.res.SlowRuntimes++
	}
	s.rtIndex[r.id] = len(s.rts)
	s.rts = append(s.rts, r)
	s.res.RuntimesStarted++
	if delay == 0 {
		r.isReady = true
	} else {
		s.push(event{t: r.ready, kind: evReady, rti: len(s.rts) - 1})
	}
}

func (s *state) newJob(js JobSpec, tr *Traces) (*jobSim, error) {
	j := &jobSim{spec: js, model: js.Model, end: js.Arrival + js.Duration}
	if len(js.StepTimes) > 0 {
		j.steps = js.StepTimes
	} else {
		norm := tr.PAI[js.Trace]
		scale := s.c.StepScale.Seconds() / 1000
		j.steps = make([][]float64, len(norm))
		for i, row := range norm {
			j.steps[i] = make([]float64, len(row))
			for r, v := range row {
				j.steps[i][r] = max(v, 1) * scale
			}
		}
		j.pos = js.Offset % len(norm)
	}
	j.ranks = len(j.steps[0])
	total := js.Params * 4
	n := int((total + s.c.ShardBytes - 1) / s.c.ShardBytes)
	j.shardBytes = make([]int64, n)
	for i := range j.shardBytes {
		j.shardBytes[i] = min(s.c.ShardBytes, total-int64(i)*s.c.ShardBytes)
		j.maxShard = max(j.maxShard, j.shardBytes[i])
		j.keys = append(j.keys, fmt.Sprintf("%s.%d", js.ID, i))
	}
	j.place = slices.Repeat([]int{-1}, n)
	j.avail = make([]float64, n)
	j.deferred = make([]int, n)
	j.work = float64(total) * float64(j.ranks) / s.c.Throughput
	// Static peak provisioning: the cores that aggregate the job's work within its typical burst
	// (median spread of rank times over the trace, at least 5% of the median step), so that the
	// work of a step is done as fast as it arrives.
	var spreads, periods []float64
	for _, row := range j.steps {
		spreads = append(spreads, slices.Max(row)-slices.Min(row))
		periods = append(periods, slices.Max(row))
	}
	slices.Sort(spreads)
	slices.Sort(periods)
	burst := max(spreads[len(spreads)/2], 0.05*periods[len(periods)/2])
	j.staticCores = max(1, int(math.Ceil(j.work/burst-1e-9)))
	return j, nil
}

func (s *state) arrive(ji int, t float64) {
	j := s.jobs[ji]
	s.active = append(s.active, ji)
	for i, k := range j.keys {
		s.byKey[k] = shardRef{ji, i}
	}
	s.res.Jobs++
	s.push(event{t: j.end, kind: evJobEnd, job: ji})
	s.startStep(ji, t)
	s.decide(t, false) // the control loop reacts to a new job at once
}

func (s *state) startStep(ji int, t float64) {
	j := s.jobs[ji]
	j.stepStart, j.stepEnd, j.arrived = t, t, 0
	j.cur = j.steps[j.pos]
	for r, c := range j.cur {
		s.push(event{t: t + c, kind: evRank, job: ji, step: j.step, rank: r})
	}
}

func (s *state) endJob(ji int) {
	j := s.jobs[ji]
	j.ended = true
	for i, k := range j.keys {
		delete(s.byKey, k)
		if j.place[i] >= 0 {
			s.rts[j.place[i]].nShards--
			j.place[i] = -1
		}
	}
	s.active = slices.DeleteFunc(s.active, func(x int) bool { return x == ji })
}

// groupsOf returns the job's shards grouped by runtime, in shard order.
func (s *state) groupsOf(j *jobSim) []jobGroup {
	if !j.dirty && j.groups != nil {
		return j.groups
	}
	j.groups = j.groups[:0]
	at := map[int]int{}
	for i, r := range j.place {
		if r < 0 {
			continue
		}
		g, ok := at[r]
		if !ok {
			g = len(j.groups)
			at[r] = g
			j.groups = append(j.groups, jobGroup{rt: r})
		}
		gr := &j.groups[g]
		gr.bytes += j.shardBytes[i]
		gr.maxBytes = max(gr.maxBytes, j.shardBytes[i])
		gr.avail = max(gr.avail, j.avail[i])
	}
	j.dirty = false
	return j.groups
}

// serve queues work (core-seconds at speed 1) on a runtime at time t and returns when it is done.
func (s *state) serve(r *runtimeSim, t, work, unit float64) float64 {
	start := max(t, r.busy)
	r.busy = start + work/(float64(r.cores)*r.speed)
	r.worked = true
	return max(r.busy, start+unit/r.speed)
}

func (s *state) rank(ji, step, rank int, t float64) {
	j := s.jobs[ji]
	if j.ended || step != j.step {
		return
	}
	for _, g := range s.groupsOf(j) {
		work := float64(g.bytes) / s.c.Throughput
		done := s.serve(s.rts[g.rt], max(t, g.avail), work, float64(g.maxBytes)/s.c.Throughput)
		j.stepEnd = max(j.stepEnd, done)
		s.workIn += work
		s.res.WorkCoreSeconds += work
	}
	for i, r := range j.place {
		if r < 0 {
			j.deferred[i]++
			j.nDeferred++
		}
	}
	j.arrived++
	if j.arrived == j.ranks && j.nDeferred == 0 {
		s.finishStep(ji, t)
	}
}

// flush queues the work that waited for shards to be placed.
func (s *state) flush(ji int, t float64) {
	j := s.jobs[ji]
	for i, n := range j.deferred {
		if n == 0 || j.place[i] < 0 {
			continue
		}
		work := float64(n) * float64(j.shardBytes[i]) / s.c.Throughput
		done := s.serve(s.rts[j.place[i]], max(t, j.avail[i]), work, float64(j.shardBytes[i])/s.c.Throughput)
		j.stepEnd = max(j.stepEnd, done)
		s.workIn += work
		s.res.WorkCoreSeconds += work
		j.nDeferred -= n
		j.deferred[i] = 0
	}
	if j.arrived == j.ranks && j.nDeferred == 0 {
		s.finishStep(ji, t)
	}
}

// idealDelay is the time from the last gradient to the end of the step on the job's static cores.
func (j *jobSim) idealDelay(throughput float64) float64 {
	arr := slices.Clone(j.cur)
	slices.Sort(arr)
	per := j.work / float64(j.ranks)
	unit := float64(j.maxShard) / throughput
	busy, done := 0.0, 0.0
	for _, a := range arr {
		start := max(a, busy)
		busy = start + per/float64(j.staticCores)
		done = max(done, busy, start+unit)
	}
	return done - arr[len(arr)-1]
}

func (s *state) finishStep(ji int, t float64) {
	j := s.jobs[ji]
	cmin, cmax := slices.Min(j.cur), slices.Max(j.cur)
	ideal := j.idealDelay(s.c.Throughput)
	took := j.stepEnd - j.stepStart
	if j.stepEnd <= min(j.end, s.c.Duration.Seconds()) {
		slow := max(0, took-(cmax+ideal)) / (cmax + ideal)
		j.slow = append(j.slow, slow)
		s.slows = append(s.slows, slow)
		j.periodSum += took
	}
	keep := func(h []float64, v float64) []float64 {
		h = append(h, v)
		if len(h) > history {
			h = h[1:]
		}
		return h
	}
	j.starts = keep(j.starts, j.stepStart+cmin)
	j.bursts = keep(j.bursts, cmax-cmin)
	j.waits = keep(j.waits, max(0, took-cmax-ideal))
	j.step++
	j.pos = (j.pos + 1) % len(j.steps)
	if j.stepEnd < j.end {
		s.startStep(ji, j.stepEnd)
	}
}

func mean(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	sum := 0.0
	for _, v := range x {
		sum += v
	}
	return sum / float64(len(x))
}

// observe builds the decider's observations: what a control loop would measure.
func (s *state) observe(t float64) autoscaler.Observations {
	obs := &s.obs
	obs.Runtimes = obs.Runtimes[:0]
	obs.Shards = obs.Shards[:0]
	var speeds []float64
	for _, r := range s.rts {
		if r.isReady && !r.draining && r.worked {
			speeds = append(speeds, r.speed)
		}
	}
	med := 0.0
	if len(speeds) > 0 {
		slices.Sort(speeds)
		med = speeds[len(speeds)/2]
	}
	for _, r := range s.rts {
		if !r.isReady || r.draining {
			continue
		}
		speed := 0.0 // not measured yet
		if r.worked && med > 0 {
			speed = r.speed / med
		}
		obs.Runtimes = append(obs.Runtimes, autoscaler.RuntimeObs{
			ID: r.id, Cores: r.cores, Since: s.clock(r.ready), Speed: speed})
	}
	for _, ji := range s.active {
		j := s.jobs[ji]
		var period, phase, burst time.Duration
		if n := len(j.starts); n >= 2 {
			period = time.Duration((j.starts[n-1] - j.starts[0]) / float64(n-1) * 1e9)
			if period > 0 {
				phase = time.Duration(s.clock(j.starts[n-1]).UnixNano() % int64(period))
			}
		}
		if len(j.bursts) > 0 {
			burst = time.Duration(mean(j.bursts) * 1e9)
		}
		wait := time.Duration(mean(j.waits) * 1e9)
		for i, k := range j.keys {
			id := ""
			if j.place[i] >= 0 {
				id = s.rts[j.place[i]].id
			}
			b := j.shardBytes[i] * int64(j.ranks)
			obs.Shards = append(obs.Shards, autoscaler.ShardObs{
				Key: k, Job: j.spec.ID, Runtime: id, Bytes: b, Work: float64(b) / s.c.Throughput,
				Period: period, Phase: phase, Burst: burst, QueueWait: wait, Pending: j.deferred[i],
			})
		}
	}
	return *obs
}

func (s *state) decide(t float64, tick bool) {
	d := s.dec.Decide(s.pol, s.observe(t), s.clock(t))
	s.res.Decisions++
	if d.Mode == "panic" {
		s.res.PanicDecisions++
	}
	touched := map[int]bool{}
	for _, m := range d.Moves {
		ref, ok := s.byKey[m.Shard]
		ri, ok2 := s.rtIndex[m.To]
		if !ok || !ok2 {
			continue
		}
		j := s.jobs[ref.job]
		if old := j.place[ref.shard]; old >= 0 {
			s.rts[old].nShards--
			s.res.Migrations++
			j.avail[ref.shard] = t + s.c.MigrationPause.Seconds()
		} else {
			s.res.Placements++
			j.avail[ref.shard] = t
		}
		j.place[ref.shard] = ri
		s.rts[ri].nShards++
		j.dirty = true
		if j.nDeferred > 0 {
			touched[ref.job] = true
		}
	}
	for _, ji := range slices.Sorted(maps.Keys(touched)) {
		s.flush(ji, t)
	}
	for _, id := range d.Drain {
		r := s.rts[s.rtIndex[id]]
		if r.nShards == 0 && !r.draining {
			r.draining = true
			r.end = max(t, r.busy)
		}
	}
	active := 0
	for _, r := range s.rts {
		if !r.draining {
			active++
		}
	}
	for ; active < d.Desired; active++ {
		s.startRuntime(t, s.c.StartupDelay.Seconds())
	}
	for i := len(s.rts) - 1; i >= 0 && active > d.Desired; i-- {
		if r := s.rts[i]; !r.draining && !r.isReady { // cancel runtimes still starting, newest first
			r.draining = true
			r.end = t
			active--
		}
	}
	if tick {
		smp := PoolSample{T: t, Demand: d.Demand}
		for _, r := range s.rts {
			if r.created <= t && r.end > t {
				smp.Reserved += float64(r.cores)
			}
			if r.isReady && !r.draining {
				smp.Ready += float64(r.cores)
			}
			if !r.draining {
				smp.Runtimes++
			}
		}
		for _, ji := range s.active {
			smp.Static += float64(s.jobs[ji].staticCores)
		}
		if t > s.lastT {
			smp.Load = s.workIn / (t - s.lastT)
		}
		s.workIn, s.lastT = 0, t
		s.res.Pool = append(s.res.Pool, smp)
		s.res.PeakCores = max(s.res.PeakCores, smp.Reserved)
	}
}

func (s *state) finish(end float64) {
	for _, r := range s.rts {
		s.res.ElasticCoreSeconds += float64(r.cores) * max(0, min(r.end, end)-r.created)
	}
	for _, j := range s.jobs {
		if j.spec.Arrival >= end {
			continue
		}
		life := min(j.end, end) - j.spec.Arrival
		s.res.StaticCoreSeconds += float64(j.staticCores) * life
		d := summarize(j.slow)
		row := JobRow{ID: j.spec.ID, Model: j.model, Trace: j.spec.Trace, Shards: len(j.keys), Ranks: j.ranks,
			Arrival: j.spec.Arrival, Lifetime: life, WorkPerStep: j.work, StaticCores: j.staticCores,
			Steps: len(j.slow), MeanSlowdown: d.Mean, P99Slowdown: d.P99}
		if len(j.slow) > 0 {
			row.MeanPeriod = j.periodSum / float64(len(j.slow))
		}
		if row.Trace == "" {
			row.Trace = "(file)"
		}
		s.res.JobRows = append(s.res.JobRows, row)
	}
	s.res.Slowdown = summarize(s.slows)
	s.res.Steps = len(s.slows)
}
