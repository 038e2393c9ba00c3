package sim

import (
	"cmp"
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

// The model (docs/lab/autoscaling.md, "The simulator"):
//
// A job trains in synchronous (BSP) steps, a fixed number of them: as many as its Philly run time
// holds at its ideal step time. Step k starts at T_k, when the parameters of step k-1 are out;
// rank i computes for c_i(k) (its PAI batch time) and then publishes one gradient per shard, all at
// T_k + c_i(k). Summing one rank's gradient of a shard costs shard bytes / Throughput core-seconds
// (at speed 1): Throughput is a runtime process's measured rate, everything it does included. Step k ends, and k+1 starts, when every shard has summed every rank and its new
// parameters have left the runtime.
//
// A runtime is a server: its NIC (NIC bytes per second into the runtime, first come first served,
// 0 = unlimited) takes in the gradients, and its cores sum them as they come in (pipelined: a
// batch's sum starts once its first shard is in and ends no sooner than its last shard is in and
// summed). The work one rank brings to the shards of a job that the runtime hosts is a batch; the
// cores serve batches as a fluid preemptive-priority server at cores x speed core-seconds per
// second: higher classes first, arrival order within a class (work of a class waits only for the
// work of its class and above); a batch takes at least one shard's unit on one core. The new
// parameters of a shard leave once per step through the NIC (the NATS server fans them out to the
// ranks: its bandwidth, and the ranks' downloads, which a static reservation pays too, are not
// modelled). A runtime is paid for from the moment it is asked for (it is ready StartupDelay later)
// until it is drained and has finished its queue.
//
// The ideal step is the same step on the job's static reservation: ceil(work per step / typical
// burst) cores of its own, speed 1, no migrations, and no network time (the reservation's network
// keeps up). A step's slowdown is how much longer it took than its ideal, as a fraction of the
// ideal step time.
//
// The broker (the NATS servers) is charged for the bytes it moves, at the measured CPU per byte in
// and out (Config.Cost): a rank's gradient goes in when published and out to the runtimes; a
// step's parameters go in once and out to every rank when the step ends. Per decision interval
// its demand is that CPU, or with a NIC modelled the cores of the nodes whose NICs carry its
// bytes, whichever is more; a fixed broker pays for the peak of that demand, in whole cores, over
// the whole run. Every cost is also given per GB of gradient summed in the steps completed within
// the run, so that a pool that stalls its jobs does not look cheap.

// epoch is the simulated clock's origin.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// history is how many recent steps a job's measured period, burst and queue wait average over.
const history = 8

// Result is what one simulation measured.
type Result struct {
	Policy autoscaler.Policy
	// Cost of the runtimes: core-seconds reserved by the elastic pool, and by static peak
	// provisioning (every job reserving its hindsight-tightest static cores for its ideal life:
	// baseline b). The broker is apart (Broker, IdealBroker).
	ElasticCoreSeconds, StaticCoreSeconds float64
	// ReservedCoreSeconds is baseline a: every job reserving StaticCoresPerWorker cores per worker
	// (rank) for its ideal life, as parameter-server jobs request (no broker).
	ReservedCoreSeconds float64
	// PSCoreSeconds is baseline d: every job a parameter server of its own, sized to the peak of
	// its gradient arrivals at Config.PSRate, for its ideal life (no broker).
	PSCoreSeconds float64
	// OracleCoreSeconds is baseline c, the clairvoyant oracle's runtimes: every job runs its ideal
	// schedule (zero slowdown), and the pool is resized every oracle period to the peak of the
	// cores busy in that period, asking for them the oracle start-up ahead (docs/lab/autoscaling.md,
	// "The simulator").
	OracleCoreSeconds float64
	Oracle            []float64 // the oracle's mean cores in each decision interval from the start
	// Broker is the elastic run's broker; IdealBroker the broker of the jobs' ideal schedules, as
	// baselines b and c run them.
	Broker, IdealBroker BrokerCost
	// GradientBytes is the gradient summed in the steps the elastic pool completed within the run;
	// IdealGradientBytes and IdealSteps those of the ideal schedules (the baselines').
	GradientBytes, IdealGradientBytes float64
	IdealSteps                        int
	// WorkCoreSeconds is the aggregation work that arrived (at speed 1): what a pool that always had
	// exactly the cores busy would cost, the floor no real pool reaches.
	WorkCoreSeconds float64
	Slowdown        Dist    // per step, as a fraction of the ideal step time, floored at 0
	RawSlowdown     float64 // the mean per-step slowdown, not floored (a step faster than ideal counts negative)
	// Stretch is per job: its duration (to the end of its last step) over the ideal duration of the
	// steps it ran.
	Stretch                       Dist
	Classes                       []ClassRow // slowdown and stretch per priority class and size class
	Jobs, Steps                   int
	Migrations                    int // moves of placed shards
	Placements                    int // first placements of new shards
	Decisions, PanicDecisions     int
	RuntimesStarted, SlowRuntimes int
	PeakCores                     float64 // most cores reserved at once
	Pool                          []PoolSample
	JobRows                       []JobRow
}

// BrokerCost is what the broker cost over a run.
type BrokerCost struct {
	CoreSeconds float64
	// CPUPeak and NICPeak are the peaks over the decision intervals of the cores its CPU needs and
	// of the cores of the nodes whose NICs carry its bytes (0 without a NIC); Peak is the peak of
	// the larger of the two, which a fixed broker pays for (rounded up to a whole core).
	Peak, CPUPeak, NICPeak float64
}

// CostRatio is the elastic pool's runtimes over static provisioning's (baseline b), both totals:
// the runtimes alone, as a live pool's reserved cores compare with them.
func (r *Result) CostRatio() float64 { return ratio(r.ElasticCoreSeconds, r.StaticCoreSeconds) }

// The whole service's cost: runtimes and broker, in core-seconds.
func (r *Result) Total() float64       { return r.ElasticCoreSeconds + r.Broker.CoreSeconds }
func (r *Result) OracleTotal() float64 { return r.OracleCoreSeconds + r.IdealBroker.CoreSeconds }
func (r *Result) StaticTotal() float64 { return r.StaticCoreSeconds + r.IdealBroker.CoreSeconds }

// PerGB is core-seconds per GB (1e9 bytes) of gradient summed in completed steps: +Inf when none
// was completed at a cost.
func PerGB(coreSeconds, bytes float64) float64 {
	if bytes <= 0 {
		if coreSeconds > 0 {
			return math.Inf(1)
		}
		return 0
	}
	return coreSeconds / (bytes / 1e9)
}

// The costs per GB of gradient summed in completed steps: the elastic pool's (runtimes and
// broker) and each baseline's.
func (r *Result) ElasticPerGB() float64  { return PerGB(r.Total(), r.GradientBytes) }
func (r *Result) ReservedPerGB() float64 { return PerGB(r.ReservedCoreSeconds, r.IdealGradientBytes) }
func (r *Result) PSPerGB() float64       { return PerGB(r.PSCoreSeconds, r.IdealGradientBytes) }
func (r *Result) StaticPerGB() float64   { return PerGB(r.StaticTotal(), r.IdealGradientBytes) }
func (r *Result) OraclePerGB() float64   { return PerGB(r.OracleTotal(), r.IdealGradientBytes) }

// OracleRatio is the elastic pool's cost per GB summed over the oracle's (baseline c).
func (r *Result) OracleRatio() float64 { return ratio(r.ElasticPerGB(), r.OraclePerGB()) }

// StaticRatio is the elastic pool's cost per GB summed over static provisioning's (baseline b).
func (r *Result) StaticRatio() float64 { return ratio(r.ElasticPerGB(), r.StaticPerGB()) }

// SavedVsPS is the fraction of the per-job parameter servers' cost per GB (baseline d) that the
// elastic pool saves (negative: it costs more).
func (r *Result) SavedVsPS() float64 { return 1 - ratio(r.ElasticPerGB(), r.PSPerGB()) }

// Saved is the fraction of the per-job reservation's cost per GB (baseline a) that the elastic
// pool saves.
func (r *Result) Saved() float64 { return 1 - ratio(r.ElasticPerGB(), r.ReservedPerGB()) }

// ratio is a/b: 0 when both are 0 (nothing to compare), +Inf when only b is.
func ratio(a, b float64) float64 {
	if b == 0 {
		if a == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return a / b
}

// ClassRow is the slowdown of one class of jobs.
type ClassRow struct {
	Class       string // "high", "normal", "low", "small models", "large models"
	Jobs        int
	Slowdown    Dist // per step, floored
	RawSlowdown float64
	Stretch     Dist // per job
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
	ID, Model, Trace, Priority string
	Shards, Ranks              int
	Arrival, Lifetime          float64 // seconds; the lifetime on the elastic pool, cut at the end of the run
	IdealDuration              float64 // seconds: its steps at their ideal times
	WorkPerStep                float64 // core-seconds at speed 1
	StaticCores                int
	MeanPeriod                 float64 // seconds
	Steps, TotalSteps          int     // steps done (within the run), and the job's fixed number of steps
	MeanSlowdown, P99Slowdown  float64
	Stretch                    float64 // elapsed over ideal time of the steps done
	// The closed loop's input (Config.Signal), averaged over the decision ticks with a measured
	// period (SignalTicks of them): the longest queue wait the decider was told of the job's
	// shards, in seconds, and the largest queue wait over period, the slowdown it compares with
	// slowdown_budget.
	SignalTicks               int
	MeanQueueWait, MeanSignal float64
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

// server is a runtime's (or a static reservation's) NIC and cores.
type server struct {
	cores      int
	speed      float64 // true speed
	nic        float64 // ingress bytes per second; 0 = unlimited
	throughput float64 // bytes one core sums per second at speed 1
	nicBusy    float64 // when the NIC has taken in what it was given
	// busy[c] is when the cores will have done the work of class index c and above (0 high,
	// 1 normal, 2 low): work of a higher class pushes the horizons of the lower ones.
	busy [3]float64
}

// classIndex maps autoscaler.PriorityHigh/Normal/Low to 0/1/2.
func classIndex(priority int) int { return min(2, max(0, 1-priority)) }

// serve takes in bytes (one rank's gradients of shards of one job, the largest unit bytes) at t, of
// the given class index, and returns when their sum is done. ready is when the first shard is in,
// through the NIC (when the live runtime has it queued for a core); start is when the cores start
// on it, so start - ready is the time it waited for a core.
//
// work weighs the cores' time against the bytes: 1 for a gradient's sum and an even share of the
// update, more for the gradients that complete a step when the update is done then
// (Config.ApplyShare), less for the others.
func (v *server) serve(t float64, bytes, unit int64, work float64, class int) (ready, start, done float64) {
	in := t // all of it is in
	ready = t
	if v.nic > 0 {
		s := max(t, v.nicBusy)
		v.nicBusy = s + float64(bytes)/v.nic
		in, ready = v.nicBusy, s+float64(unit)/v.nic
	}
	d := float64(bytes) * work / v.throughput / (float64(v.cores) * v.speed)
	start = max(ready, v.busy[class])
	for k := class; k < len(v.busy); k++ {
		v.busy[k] = max(ready, v.busy[k]) + d
	}
	u := float64(unit) * work / v.throughput / v.speed
	return ready, start, max(v.busy[class], start+u, in+u)
}

// idle is when the server has done all its work.
func (v *server) idle() float64 { return max(v.busy[2], v.nicBusy) }

// egress is the time a server's NIC takes to send bytes out.
func (v *server) egress(bytes int64) float64 {
	if v.nic <= 0 {
		return 0
	}
	return float64(bytes) / v.nic
}

type runtimeSim struct {
	server
	id       string
	created  float64
	ready    float64
	end      float64 // when it stops costing: +Inf while in the pool
	isReady  bool
	draining bool // drained or cancelled: no longer part of the pool
	worked   bool
	nShards  int
}

type jobSim struct {
	applyShare  float64 // Config.ApplyShare
	spec        JobSpec
	model       string
	class       int // classIndex of its priority
	priority    int
	steps       [][]float64 // seconds per rank, per iteration (cycled)
	ideal       []float64   // ideal step time of each iteration
	busyIdeal   [][]span    // per iteration: when its static cores are busy, from the step's start
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
	psCores     int     // baseline d's parameter server
	modelBytes  int64   // one rank's gradient (and the parameters)
	work        float64 // core-seconds per step at speed 1
	nSteps      int     // the job's fixed number of steps
	idealDur    float64 // their ideal duration
	ended       bool

	step      int
	stepStart float64
	cur       []float64
	arrived   int
	stepEnd   float64

	starts, bursts, waits []float64 // recent history
	// The live queue wait, per shard, as its runtime measures it (runtime/shard.go): foldDone is
	// when the shard's latest gradient was summed; stepWait the open step's time its gradients
	// waited for a core, each from when the runtime took it (in through the NIC, and the shard's
	// previous gradient summed), summed over the ranks; queueWait that, averaged over steps (ewma).
	foldDone, stepWait, queueWait []float64
	// The decider's closed-loop input at each decision tick with a measured period: the longest
	// queue wait of the job's shards, and that over the period (what feedback reads), summed.
	sigTicks           int
	sigWait, sigRatio  float64
	slow, raw          []float64
	periodSum          float64
	idealDone, lastEnd float64 // ideal time of the steps done within the run, and the end of the last
}

type span struct{ from, to float64 }

type jobGroup struct {
	rt              int
	shards          []int // in shard order
	bytes, maxBytes int64
	avail           float64
}

type shardRef struct{ job, shard int }

type state struct {
	c       Config
	thr     float64 // c.throughput()
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
	broker  *brokerLoad
	lastT   float64
	slows   []float64
	raws    []float64
}

// runtimeCores is the cores of a runtime the pool starts: cores_per_runtime, or the machine's
// (Config.RuntimeCores) when the policy says 0.
func (s *state) runtimeCores() int {
	if s.pol.CoresPerRuntime > 0 {
		return s.pol.CoresPerRuntime
	}
	return s.c.RuntimeCores
}

// Run simulates the workload under the policy. tr may be nil when every job of the workload carries
// its own step times. The result depends only on its inputs.
func Run(c Config, pol autoscaler.Policy, wl *Workload, tr *Traces) (*Result, error) {
	s, err := newState(c, pol, wl, tr)
	if err != nil {
		return nil, err
	}
	s.run()
	return &s.res, nil
}

// newState sets a simulation up: the pool's first runtimes and the jobs' events.
func newState(c Config, pol autoscaler.Policy, wl *Workload, tr *Traces) (*state, error) {
	if err := errors.Join(c.Validate(), pol.Validate()); err != nil {
		return nil, err
	}
	if err := wl.check(tr); err != nil {
		return nil, err
	}
	s := &state{
		c: c, thr: c.throughput(), pol: pol, dec: autoscaler.NewDecider(),
		broker:  newBrokerLoad(c.Interval.Seconds(), c.Duration.Seconds()),
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
	return s, nil
}

// run runs the events up to the end of the simulated time and closes the results.
func (s *state) run() {
	c := s.c
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
	r := &runtimeSim{id: fmt.Sprintf("rt-%d", len(s.rts)+1),
		server:  server{cores: s.runtimeCores(), speed: 1, nic: s.c.NIC, throughput: s.thr},
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
	j := &jobSim{spec: js, model: js.Model, applyShare: s.c.ApplyShare}
	j.priority, _ = priorityOf(js.Priority)
	j.class = classIndex(j.priority)
	if len(js.StepTimes) > 0 {
		j.steps = js.StepTimes
		j.pos = js.Offset % len(js.StepTimes)
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
	j.modelBytes = total
	j.work = float64(total) * float64(j.ranks) / s.thr
	// Static peak provisioning: the cores that aggregate the job's work within its typical burst
	// (median spread of rank times over the trace, at least 5% of the median step), so that the
	// work of a step is done as fast as it arrives. The reservation's network is assumed to keep up
	// (a lower bound on what static costs: it counts cores only).
	var spreads, periods []float64
	for _, row := range j.steps {
		spreads = append(spreads, slices.Max(row)-slices.Min(row))
		periods = append(periods, slices.Max(row))
	}
	slices.Sort(spreads)
	slices.Sort(periods)
	burst := max(spreads[len(spreads)/2], 0.05*periods[len(periods)/2])
	j.staticCores = max(1, int(math.Ceil(j.work/burst-1e-9)))
	// Baseline d: a parameter server of its own, sized alike at the parameter server's rate.
	j.psCores = max(1, int(math.Ceil(float64(total)*float64(j.ranks)/s.c.PSRate/burst-1e-9)))
	// The ideal step of each iteration, and the job's fixed number of steps: as many as its run
	// time holds at their ideal times (at least one).
	j.ideal = make([]float64, len(j.steps))
	j.busyIdeal = make([][]span, len(j.steps))
	for i, row := range j.steps {
		delay, busy := j.idealRun(row, s.thr)
		j.ideal[i] = slices.Max(row) + delay
		j.busyIdeal[i] = busy
	}
	for p := j.pos; j.nSteps == 0 || j.idealDur < js.Duration; p = (p + 1) % len(j.steps) {
		j.idealDur += j.ideal[p]
		j.nSteps++
	}
	return j, nil
}

// idealRun runs one iteration (rank compute times) on the job's static cores alone: it returns the
// time from the last gradient to the end of the step and when the cores are busy. Its network is
// not modelled: the ideal is the job's aggregation on its own cores, with no transfer time.
func (j *jobSim) idealRun(row []float64, throughput float64) (float64, []span) {
	arr := slices.Clone(row)
	slices.Sort(arr)
	v := server{cores: j.staticCores, speed: 1, throughput: throughput}
	per := int64(len(j.shardBytes)-1)*j.shardBytes[0] + j.shardBytes[len(j.shardBytes)-1]
	done := 0.0
	var busy []span
	for k, a := range arr {
		_, start, d := v.serve(a, per, j.maxShard, j.workWeight(k == len(arr)-1), 0)
		done = max(done, d)
		if n := len(busy); n > 0 && start <= busy[n-1].to {
			busy[n-1].to = max(busy[n-1].to, d)
		} else {
			busy = append(busy, span{start, d})
		}
	}
	return done - arr[len(arr)-1], busy
}

func (s *state) arrive(ji int, t float64) {
	j := s.jobs[ji]
	s.active = append(s.active, ji)
	for i, k := range j.keys {
		s.byKey[k] = shardRef{ji, i}
	}
	s.res.Jobs++
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

// workWeight is the cores' time of a rank's gradients against an even share of the step's work:
// with Config.ApplyShare a, the updates are done with the step's last rank's gradients (1 - a +
// a x ranks), and the others are sums only (1 - a).
func (j *jobSim) workWeight(last bool) float64 {
	if j.applyShare == 0 {
		return 1
	}
	if last {
		return 1 - j.applyShare + j.applyShare*float64(j.ranks)
	}
	return 1 - j.applyShare
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
		gr.shards = append(gr.shards, i)
		gr.bytes += j.shardBytes[i]
		gr.maxBytes = max(gr.maxBytes, j.shardBytes[i])
		gr.avail = max(gr.avail, j.avail[i])
	}
	j.dirty = false
	return j.groups
}

// serve queues bytes of a job on a runtime at time t and returns when they are summed and the
// new parameters are out (bytes/NIC after the sum: the parameters of those shards leave once).
// units are the job's shards the bytes are gradients of, one per gradient, in the order they
// come in (a shard repeated for the ranks that waited for its placement); unit is the largest.
// weight is the cores' time of these bytes against an even share of the step's work
// (jobSim.workWeight).
func (s *state) serve(j *jobSim, r *runtimeSim, t float64, units []int, bytes, unit int64, weight float64) float64 {
	ready, start, done := r.serve(t, bytes, unit, weight, j.class)
	s.queueWaits(j, r, units, ready, start, unit, weight)
	r.worked = true
	work := float64(bytes) * weight / s.thr
	s.workIn += work
	s.res.WorkCoreSeconds += work
	return done + r.egress(bytes)
}

// queueWaits adds to each shard's open step what the live runtime measures of these gradients
// (runtime/shard.go): the time from when the runtime takes one (its bytes are in, and the shard's
// previous gradient is summed: a shard handles its messages one at a time) until a core starts
// on it. The cores (server.serve) start on the group at start, all of them on it; one by one, its
// gradients take a core each, in the order they came in, so the k-th starts at start + floor(k /
// cores) sums of the largest unit, not before it is in nor before its shard's previous one is
// summed. A gradient that waits for its own shard waits for no core, and the runtime does not
// count it; one that waits behind the other shards of its own rank does.
func (s *state) queueWaits(j *jobSim, r *runtimeSim, units []int, ready, start float64, unit int64, weight float64) {
	if j.foldDone == nil {
		n := len(j.shardBytes)
		j.foldDone, j.stepWait, j.queueWait = make([]float64, n), make([]float64, n), make([]float64, n)
	}
	rate := s.thr * r.speed / weight
	u := float64(unit) / rate
	in, cum := ready, int64(0) // when the NIC began to take the group in, and the bytes it has taken
	if r.nic > 0 {
		in = ready - float64(unit)/r.nic
	}
	for k, i := range units {
		got := ready
		if r.nic > 0 {
			cum += j.shardBytes[i]
			got = in + float64(cum)/r.nic
		}
		took := max(got, j.foldDone[i])
		st := max(start+float64(k/r.cores)*u, took)
		j.stepWait[i] += st - took
		j.foldDone[i] = st + float64(j.shardBytes[i])/rate
	}
}

func (s *state) rank(ji, step, rank int, t float64) {
	j := s.jobs[ji]
	if j.ended || step != j.step {
		return
	}
	s.broker.add(t, float64(j.modelBytes), float64(j.modelBytes)) // the rank's gradient in, and out to the runtimes
	for _, g := range s.groupsOf(j) {
		j.stepEnd = max(j.stepEnd, s.serve(j, s.rts[g.rt], max(t, g.avail), g.shards, g.bytes, g.maxBytes, j.workWeight(j.arrived == j.ranks-1)))
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
		b := int64(n) * j.shardBytes[i]
		// Several ranks' gradients of one shard at once: an even share of the work each.
		j.stepEnd = max(j.stepEnd, s.serve(j, s.rts[j.place[i]], max(t, j.avail[i]), slices.Repeat([]int{i}, n), b, j.shardBytes[i], 1))
		j.nDeferred -= n
		j.deferred[i] = 0
	}
	if j.arrived == j.ranks && j.nDeferred == 0 {
		s.finishStep(ji, t)
	}
}

func (s *state) finishStep(ji int, t float64) {
	j := s.jobs[ji]
	cmin, cmax := slices.Min(j.cur), slices.Max(j.cur)
	ideal := j.ideal[j.pos]
	took := j.stepEnd - j.stepStart
	s.broker.add(j.stepEnd, float64(j.modelBytes), float64(j.ranks)*float64(j.modelBytes)) // the parameters in, and out to every rank
	if j.stepEnd <= s.c.Duration.Seconds() {
		raw := (took - ideal) / ideal
		j.slow = append(j.slow, max(0, raw))
		j.raw = append(j.raw, raw)
		j.periodSum += took
		j.idealDone += ideal
		j.lastEnd = j.stepEnd
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
	j.waits = keep(j.waits, max(0, took-ideal))
	for i, w := range j.stepWait {
		j.queueWait[i] = ewma(j.queueWait[i], w)
	}
	clear(j.stepWait)
	j.step++
	j.pos = (j.pos + 1) % len(j.steps)
	if j.step < j.nSteps {
		s.startStep(ji, j.stepEnd)
	} else {
		s.push(event{t: j.stepEnd, kind: evJobEnd, job: ji})
	}
}

// ewmaWeight is the weight of the newest step in the live queue wait, as in the runtime.
const ewmaWeight = 0.3

// ewma is the runtime's step average: the first step's value, then weighted by ewmaWeight.
func ewma(avg, v float64) float64 {
	if avg == 0 {
		return v
	}
	return avg + ewmaWeight*(v-avg)
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
		for i, k := range j.keys {
			var wait time.Duration
			if j.queueWait != nil {
				wait = time.Duration(j.queueWait[i] * 1e9)
			}
			if s.c.Signal == SignalHindsight { // the step's excess over its ideal: not measurable live
				wait = time.Duration(mean(j.waits) * 1e9)
			}
			id := ""
			if j.place[i] >= 0 {
				id = s.rts[j.place[i]].id
			}
			b := j.shardBytes[i] * int64(j.ranks)
			work := float64(b) / s.thr
			if s.c.KernelWork { // what-if: the aggregation function's time only (a runtime without its process's overhead)
				work = float64(b) * s.c.Cost.KernelCPUPerByte
			}
			if s.c.NICWork && s.c.NIC > 0 { // what-if: the shard's share of a runtime's NIC, in cores
				work = max(work, float64(b)/s.c.NIC*float64(s.runtimeCores()))
			}
			obs.Shards = append(obs.Shards, autoscaler.ShardObs{
				Key: k, Job: j.spec.ID, Runtime: id, Bytes: b, Work: work,
				Period: period, Phase: phase, Burst: burst, QueueWait: wait, Pending: j.deferred[i],
				Priority: j.priority,
			})
		}
	}
	return *obs
}

func (s *state) decide(t float64, tick bool) {
	obs := s.observe(t)
	if tick {
		s.sampleSignal(obs)
	}
	d := s.dec.Decide(s.pol, obs, s.clock(t))
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
			if j.queueWait != nil { // the new runtime measures the shard afresh
				j.queueWait[ref.shard], j.stepWait[ref.shard] = 0, 0
			}
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
			r.end = max(t, r.idle())
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

// sampleSignal adds to each job's tallies the closed loop's input at a decision tick, as the
// decider's feedback reads it: the longest queue wait of the job's shards with a measured period,
// and the largest queue wait over period. A job with no measured period yet is not sampled.
func (s *state) sampleSignal(obs autoscaler.Observations) {
	byJob := map[string]*jobSim{}
	for _, ji := range s.active {
		byJob[s.jobs[ji].spec.ID] = s.jobs[ji]
	}
	type sample struct{ wait, ratio float64 }
	got := map[*jobSim]*sample{}
	for i := range obs.Shards {
		sh := &obs.Shards[i]
		j := byJob[sh.Job]
		if j == nil || sh.Period <= 0 {
			continue
		}
		x := got[j]
		if x == nil {
			x = &sample{}
			got[j] = x
		}
		x.wait = max(x.wait, sh.QueueWait.Seconds())
		x.ratio = max(x.ratio, sh.QueueWait.Seconds()/sh.Period.Seconds())
	}
	for j, x := range got {
		j.sigTicks++
		j.sigWait += x.wait
		j.sigRatio += x.ratio
	}
}

// oracle computes baseline c and what the ideal schedules need of the broker: every job runs its
// ideal schedule (its steps back to back at their ideal times, from its arrival), busy on its
// static cores exactly when its ideal run is. The oracle's pool is resized every oracle period to
// the most cores busy at once within that period, and, knowing the future, asks for them the
// oracle start-up ahead: the cores a period needs are paid for from its start minus the start-up.
func (s *state) oracle(end float64) {
	type edge struct {
		t     float64
		cores int
	}
	var edges []edge
	ideal := newBrokerLoad(s.c.Interval.Seconds(), end)
	for _, j := range s.jobs {
		if j.spec.Arrival >= end {
			continue
		}
		mb, ranks := float64(j.modelBytes), float64(j.ranks)
		t, p := j.spec.Arrival, j.spec.Offset%len(j.steps)
		for k := 0; k < j.nSteps && t < end; k++ {
			for _, b := range j.busyIdeal[p] {
				if b.to > b.from {
					edges = append(edges, edge{t + b.from, j.staticCores}, edge{t + b.to, -j.staticCores})
				}
			}
			for _, c := range j.steps[p] {
				ideal.add(t+c, mb, mb)
			}
			t += j.ideal[p]
			ideal.add(t, mb, ranks*mb)
			if t <= end {
				s.res.IdealSteps++
				s.res.IdealGradientBytes += ranks * mb
			}
			p = (p + 1) % len(j.steps)
		}
	}
	s.res.IdealBroker = ideal.cost(s.c)
	slices.SortFunc(edges, func(a, b edge) int {
		return cmp.Or(cmp.Compare(a.t, b.t), a.cores-b.cores) // ends before starts at the same instant
	})
	per := s.c.oraclePeriod()
	n := int(math.Ceil(end/per - 1e-9))
	peaks := make([]float64, n)
	busy, i := 0, 0
	for k := range n {
		from, to := float64(k)*per, min(float64(k+1)*per, end)
		for i < len(edges) && edges[i].t <= from {
			busy += edges[i].cores
			i++
		}
		peak := busy
		for i < len(edges) && edges[i].t < to {
			busy += edges[i].cores
			peak = max(peak, busy)
			i++
		}
		peaks[k] = float64(peak)
	}
	// Period k's cores are held over [k per - startup, (k+1) per): between two consecutive bounds
	// the oracle holds the most any of the periods it is then in, or starting for, needs.
	startup := s.c.oracleStartup()
	cuts := []float64{0, end}
	for k := range n + 1 {
		for _, x := range []float64{float64(k) * per, float64(k)*per - startup} {
			if x > 0 && x < end {
				cuts = append(cuts, x)
			}
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	iv := s.c.Interval.Seconds()
	s.res.Oracle = make([]float64, int(math.Ceil(end/iv-1e-9)))
	for c := 1; c < len(cuts); c++ {
		a, b := cuts[c-1], cuts[c]
		m := (a + b) / 2
		held := 0.0
		for k := int(m / per); k < n && float64(k)*per-startup <= m; k++ {
			held = max(held, peaks[k])
		}
		s.res.OracleCoreSeconds += held * (b - a)
		for x := a; x < b; { // spread over the decision intervals, for the plot
			k := int(x / iv)
			if float64(k+1)*iv <= x { // x/iv rounded down past an interval's end
				k++
			}
			k = min(k, len(s.res.Oracle)-1)
			y := min(b, float64(k+1)*iv)
			if k == len(s.res.Oracle)-1 || y <= x {
				y = b
			}
			s.res.Oracle[k] += held * (y - x) / iv
			x = y
		}
	}
}

func (s *state) finish(end float64) {
	for _, r := range s.rts {
		s.res.ElasticCoreSeconds += float64(r.cores) * max(0, min(r.end, end)-r.created)
	}
	type acc struct {
		jobs            int
		slow, raw, strt []float64
	}
	classes := map[string]*acc{}
	add := func(name string, j *jobSim, stretch float64) {
		a := classes[name]
		if a == nil {
			a = &acc{}
			classes[name] = a
		}
		a.jobs++
		a.slow = append(a.slow, j.slow...)
		a.raw = append(a.raw, j.raw...)
		if len(j.slow) > 0 {
			a.strt = append(a.strt, stretch)
		}
	}
	var stretches []float64
	for _, j := range s.jobs {
		if j.spec.Arrival >= end {
			continue
		}
		life := min(j.spec.Arrival+j.idealDur, end) - j.spec.Arrival
		s.res.StaticCoreSeconds += float64(j.staticCores) * life
		s.res.PSCoreSeconds += float64(j.psCores) * life
		s.res.GradientBytes += float64(len(j.slow)) * float64(j.ranks) * float64(j.modelBytes)
		s.res.ReservedCoreSeconds += math.Ceil(s.c.StaticCoresPerWorker*float64(j.ranks)-1e-9) * life
		d := summarize(j.slow)
		elastic := end - j.spec.Arrival
		if j.ended {
			elastic = min(elastic, j.lastEnd-j.spec.Arrival)
		}
		row := JobRow{ID: j.spec.ID, Model: j.model, Trace: j.spec.Trace, Priority: priorityName(j.priority),
			Shards: len(j.keys), Ranks: j.ranks, Arrival: j.spec.Arrival, Lifetime: elastic, IdealDuration: j.idealDur,
			WorkPerStep: j.work, StaticCores: j.staticCores, Steps: len(j.slow), TotalSteps: j.nSteps,
			MeanSlowdown: d.Mean, P99Slowdown: d.P99}
		if j.sigTicks > 0 {
			row.SignalTicks = j.sigTicks
			row.MeanQueueWait = j.sigWait / float64(j.sigTicks)
			row.MeanSignal = j.sigRatio / float64(j.sigTicks)
		}
		if len(j.slow) > 0 {
			row.MeanPeriod = j.periodSum / float64(len(j.slow))
			row.Stretch = (j.lastEnd - j.spec.Arrival) / j.idealDone
			stretches = append(stretches, row.Stretch)
		}
		if row.Trace == "" {
			row.Trace = "(file)"
		}
		s.res.JobRows = append(s.res.JobRows, row)
		add(row.Priority, j, row.Stretch)
		size := "small models"
		if j.spec.Params >= LargeModel {
			size = "large models"
		}
		add(size, j, row.Stretch)
	}
	for _, name := range []string{"high", "normal", "low", "small models", "large models"} {
		if a := classes[name]; a != nil {
			s.res.Classes = append(s.res.Classes, ClassRow{Class: name, Jobs: a.jobs, Slowdown: summarize(a.slow),
				RawSlowdown: mean(a.raw), Stretch: summarize(a.strt)})
		}
	}
	for _, j := range s.jobs {
		s.slows = append(s.slows, j.slow...)
		s.raws = append(s.raws, j.raw...)
	}
	s.res.Slowdown = summarize(s.slows)
	s.res.RawSlowdown = mean(s.raws)
	s.res.Stretch = summarize(stretches)
	s.res.Steps = len(s.slows)
	s.res.Broker = s.broker.cost(s.c)
	s.oracle(end)
}

// brokerLoad is the broker's traffic in each decision interval of a run.
type brokerLoad struct {
	period, end float64
	in, out     []float64 // bytes into the broker and out of it, per interval
}

func newBrokerLoad(period, end float64) *brokerLoad {
	n := int(math.Ceil(end/period - 1e-9))
	return &brokerLoad{period: period, end: end, in: make([]float64, n), out: make([]float64, n)}
}

// add counts bytes in and out at time t (nothing outside the run).
func (b *brokerLoad) add(t, in, out float64) {
	if t < 0 || t >= b.end {
		return
	}
	k := min(int(t/b.period), len(b.in)-1)
	b.in[k] += in
	b.out[k] += out
}

// cost sizes the broker for the traffic: in each interval it needs the cores its CPU spends on
// the bytes, or, with a NIC modelled, the cores of the nodes whose NICs carry them each way,
// whichever is more. A fixed broker pays for the peak of that, in whole cores, over the run; a
// broker that scales with the pool pays for each interval's need.
func (b *brokerLoad) cost(c Config) BrokerCost {
	var bc BrokerCost
	pooled := 0.0
	for k := range b.in {
		span := min(b.period, b.end-float64(k)*b.period)
		cpu := (b.in[k]*c.Cost.BrokerCPUPerByteIn + b.out[k]*c.Cost.BrokerCPUPerByteOut) / span
		nic := 0.0
		if c.NIC > 0 {
			nic = max(b.in[k], b.out[k]) / span / c.NIC * float64(c.BrokerNodeCores)
		}
		need := max(cpu, nic)
		bc.CPUPeak, bc.NICPeak, bc.Peak = max(bc.CPUPeak, cpu), max(bc.NICPeak, nic), max(bc.Peak, need)
		pooled += need * span
	}
	switch c.Broker {
	case BrokerNone, BrokerInRuntimes:
		return BrokerCost{}
	case BrokerPool:
		bc.CoreSeconds = pooled
	default:
		bc.CoreSeconds = math.Ceil(bc.Peak-1e-9) * b.end
	}
	return bc
}
