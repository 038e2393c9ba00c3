package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/sim"
	"github.com/fanin-ml/fanin/wire"
)

// validatePolicy is the policy of the elastic run, and of the simulator replaying the same
// workload. cores_per_runtime matches what a 'fanin runtime' reports on this machine (GOMAXPROCS);
// the test rewrites it. A low target utilization makes a small workload move the pool.
const validatePolicy = `
min_runtimes: 1
max_runtimes: 4
cores_per_runtime: %d
target_utilization: 0.1
stable_window: 5s
scale_down_cooldown: 2s
panic_window: 2s
startup_grace: 1s
`

// Workload of the validation run: small models, 4 ranks, staggered arrivals, PAI step times.
const (
	valRanks     = 4
	valParams    = 1 << 20 // float32: 4 MiB, four 1 MiB shards
	valShard     = 1 << 20
	valStepScale = 0.4 // seconds per normalized PAI batch time of 1000
)

var valJobs = []struct {
	id                string
	trace             string
	offset            int
	arrival, duration float64
}{
	{"v1", "pai-1", 100, 0, 40},
	{"v2", "pai-2", 200, 8, 40},
	{"v3", "pai-3", 300, 16, 36},
}

// liveRun is what one live run measured.
type liveRun struct {
	end          float64                      // seconds from t0 to the last job's end
	coreSeconds  float64                      // reserved core-seconds, t0 to end
	peakCores    int                          //
	steps        map[string][]float64         // per job: step durations (rank 0), in order
	work         map[string][]float64         // per job: reported CPU seconds per step (sum over shards)
	procWork     map[string][]float64         // the same times each runtime's overhead: as the autoscaler plans it
	bytesPerStep map[string]float64           // per job: gradient bytes per step (all shards, all ranks)
	nsPerByte    []float64                    // runtimes' reported aggregation cost
	overheads    []float64                    // runtimes' reported process CPU per unit of work
	decisions    int                          // decisions that changed something
	panics       int                          // of them in panic
	moves        int                          // shard moves (placing a new shard included)
	voluntary    int                          // moves with a previous owner
	startups     []time.Duration              // desired went up -> pool reached it
	pool         []struct{ t, cores float64 } //
	demand       []demandSample               // the autoscaler's gauges, scraped (liveOpts.metrics)
	published    []demandSample               // the decisions it published (those that changed something)
	obs          map[string]*jobObs           // per job: what the runtimes reported of its shards
	runtimeCPU   float64                      // CPU seconds of the runtime processes (Linux; liveOpts.metrics)
	selfCPU      float64                      // CPU seconds of the test process (workers, embedded NATS) in the run
	signal       map[string][]signalSample    // per job: the closed loop's input, every 100 ms (liveOpts.signal)
	// applyWork and shardWork sum the shards' reported update time and work per step, over the
	// reports of a new step: the share of the work done once a step, in the update.
	applyWork, shardWork float64
}

// signalSample is a job's closed-loop input at a moment of a live run, as the autoscaler reads it
// from the runtimes' latest load reports (autoscaler/feedback.go): over the job's shards with a
// measured period, the longest queue wait (seconds) and the largest queue wait over period.
type signalSample struct {
	T     float64 `json:"t"`
	Wait  float64 `json:"wait"`
	Ratio float64 `json:"ratio"`
}

// jobObs sums what the runtimes' load reports said of a job's shards (one sample per shard per
// report with a measured period).
type jobObs struct {
	n                           int
	burst, period, queueWait    float64 // seconds
	maxBurstShard, maxQueueWait float64
}

// demandSample is the decider's demand at a moment of a live run, with the pool it saw.
type demandSample struct {
	t, demand, poolCores, desired float64
}

// liveOpts are the knobs of a live run beyond its workload and policy.
type liveOpts struct {
	shard int // shard size in bytes
	// runtimeCores > 0 starts the runtimes with GOMAXPROCS set to it, so that they report (and use)
	// that many cores; 0 leaves GOMAXPROCS alone.
	runtimeCores int
	// metrics scrapes the autoscaler's /metrics every 100 ms for its demand gauge, which it sets
	// at every decision (the decisions it publishes are only those that changed something).
	metrics bool
	// signal samples every 100 ms each running job's closed-loop input from the latest load
	// reports (liveRun.signal).
	signal bool
	// module, when set, is a user function (WebAssembly) that every job uses instead of the
	// built-in sgd, uploaded as fnName: a function slower than the runtime's connection makes
	// gradients wait for a core.
	module []byte
	fnName string
}

// signalFresh is how old a shard's latest load report may be for its queue wait to count: the
// runtimes report every second, so an older one is from a runtime that stopped or moved the shard.
const signalFresh = 2500 * time.Millisecond

// TestSimValidate runs a small workload for real twice (a static pool of fixed size, then the
// elastic pool with validatePolicy) and writes the same workload and policy for 'fanin sim'.
// It is for docs/lab/autoscaling.md, "2026-11-22 Simulator vs reality, a small workload";
// FANIN_VALIDATE=1 runs it.
func TestSimValidate(t *testing.T) {
	if os.Getenv("FANIN_VALIDATE") != "1" {
		t.Skip("simulator validation: set FANIN_VALIDATE=1")
	}
	skipShort(t)
	out := os.Getenv("FANIN_VALIDATE_OUT")
	if out == "" {
		out = filepath.Join(os.TempDir(), "fanin-validate")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	root, _ := filepath.Abs("..")
	tr, err := sim.LoadTraces(filepath.Join(root, "..", "shared", "traces"))
	if err != nil {
		tr, err = sim.LoadTraces("/work/shared/traces")
		if err != nil {
			t.Fatal(err)
		}
	}
	// The workload, with its step times written out so that the live run and the sim use the same.
	wl := &sim.Workload{}
	for _, j := range valJobs {
		its := tr.PAI[j.trace]
		var rows [][]float64
		for i := range 300 {
			src := its[(j.offset+i)%len(its)]
			row := make([]float64, valRanks)
			for r := range row {
				row[r] = math.Round(src[r]*valStepScale) / 1000
			}
			rows = append(rows, row)
		}
		wl.Jobs = append(wl.Jobs, sim.JobSpec{ID: j.id, Arrival: j.arrival, Duration: j.duration,
			Params: valParams, StepTimes: rows})
	}
	if err := os.WriteFile(filepath.Join(out, "workload.json"), wl.MarshalIndent(), 0o644); err != nil {
		t.Fatal(err)
	}
	cores := valCores()
	elastic := fmt.Sprintf(validatePolicy, cores)
	if err := os.WriteFile(filepath.Join(out, "policy.yaml"), []byte(elastic), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := autoscaler.ParsePolicy([]byte(elastic)); err != nil {
		t.Fatal(err)
	}
	// Static: a fixed pool of 3 runtimes, the same knobs otherwise.
	static := strings.Replace(strings.Replace(elastic, "min_runtimes: 1", "min_runtimes: 3", 1),
		"max_runtimes: 4", "max_runtimes: 3", 1)

	st := runLive(t, wl, static, liveOpts{shard: valShard})
	el := runLive(t, wl, elastic, liveOpts{shard: valShard})

	// Throughput: bytes one core aggregates per second, from the runtimes' reports.
	var bytes, work float64
	for id, ws := range el.work {
		for _, w := range ws {
			work += w
			bytes += el.bytesPerStep[id]
		}
	}
	thr := bytes / work
	// Static peak provisioning with the sim's definition, at the measured throughput.
	var staticCS float64
	for _, j := range wl.Jobs {
		var spreads, periods []float64
		for _, row := range j.StepTimes {
			spreads = append(spreads, slices.Max(row)-slices.Min(row))
			periods = append(periods, slices.Max(row))
		}
		slices.Sort(spreads)
		slices.Sort(periods)
		burst := max(spreads[len(spreads)/2], 0.05*periods[len(periods)/2])
		w := float64(valParams*4*valRanks) / thr
		c := max(1, int(math.Ceil(w/burst-1e-9)))
		life := math.Min(j.Arrival+j.Duration, el.end) - j.Arrival
		staticCS += float64(c) * life
		t.Logf("job %s: work %.4f core-s/step at measured throughput, burst %.3fs, static %d cores", j.ID, w, burst, c)
	}
	// Slowdown: the same step, elastic against static.
	slow, raw := valSlowdown(el, st)
	q := valQuantile
	var nsb float64
	for _, x := range el.nsPerByte {
		nsb += x
	}
	if len(el.nsPerByte) > 0 {
		nsb /= float64(len(el.nsPerByte))
	}
	su := slices.Clone(el.startups)
	slices.Sort(su)
	var sb strings.Builder
	fmt.Fprintf(&sb, "live run, %d jobs, end %.1fs\n", len(wl.Jobs), el.end)
	fmt.Fprintf(&sb, "elastic reserved core-seconds %.1f (peak %d cores); static run reserved %.1f (peak %d cores)\n",
		el.coreSeconds, el.peakCores, st.coreSeconds, st.peakCores)
	fmt.Fprintf(&sb, "static peak provisioning (sim definition, measured throughput) %.1f core-seconds; cost %.1f%%\n",
		staticCS, 100*el.coreSeconds/staticCS)
	fmt.Fprintf(&sb, "measured throughput %.3g B/s per core (from shard work); runtimes' nanos_per_byte mean %.3f (%.3g B/s)\n",
		thr, nsb, 1e9/nsb)
	fmt.Fprintf(&sb, "steps compared %d: slowdown (floored at 0) mean %.2f%% p50 %.2f%% p90 %.2f%% p99 %.2f%% max %.2f%%; unfloored mean %.2f%%\n",
		len(slow), 100*valMean(slow), 100*q(slow, .5), 100*q(slow, .9), 100*q(slow, .99), 100*q(slow, 1), 100*valMean(raw))
	for id := range el.steps {
		fmt.Fprintf(&sb, "  job %s: steps elastic %d static %d, mean step elastic %.3fs static %.3fs\n",
			id, len(el.steps[id]), len(st.steps[id]), valMean(el.steps[id]), valMean(st.steps[id]))
	}
	fmt.Fprintf(&sb, "decisions %d (panic %d), moves %d (voluntary %d); static run: decisions %d moves %d (voluntary %d)\n",
		el.decisions, el.panics, el.moves, el.voluntary, st.decisions, st.moves, st.voluntary)
	fmt.Fprintf(&sb, "startup (desired up -> pool reached it): %v\n", su)
	fmt.Fprintf(&sb, "sim flags for measured parameters: --throughput %.3g --startup %v\n", thr, valMedian(su))
	fmt.Fprintf(&sb, "pool (t, cores):")
	last := -1.0
	for _, p := range el.pool {
		if p.cores != last {
			fmt.Fprintf(&sb, " %.1f:%g", p.t, p.cores)
			last = p.cores
		}
	}
	sb.WriteString("\n")
	if os.Getenv("FANIN_VALIDATE_NOISE") == "1" {
		// The noise floor: a second static run against the first, paired step by step.
		st2 := runLive(t, wl, static, liveOpts{shard: valShard})
		ns, nr := valSlowdown(st2, st)
		fmt.Fprintf(&sb, "noise floor (static run 2 vs static run 1): floored mean %.2f%% p50 %.2f%% p90 %.2f%% p99 %.2f%%; unfloored mean %.2f%%\n",
			100*valMean(ns), 100*q(ns, .5), 100*q(ns, .9), 100*q(ns, .99), 100*valMean(nr))
	}
	t.Log("\n" + sb.String())
	_ = os.WriteFile(filepath.Join(out, "live.txt"), []byte(sb.String()), 0o644)
}

func valCores() int {
	return max(1, goruntime.GOMAXPROCS(0))
}

// valSlowdown pairs the steps of two runs of the same workload: a/b - 1, floored at 0 and raw,
// both sorted.
func valSlowdown(a, b *liveRun) (slow, raw []float64) {
	for id, as := range a.steps {
		bs := b.steps[id]
		for k := range min(len(as), len(bs)) {
			r := as[k]/bs[k] - 1
			raw = append(raw, r)
			slow = append(slow, max(0, r))
		}
	}
	sort.Float64s(slow)
	sort.Float64s(raw)
	return slow, raw
}

func valQuantile(x []float64, p float64) float64 {
	if len(x) == 0 {
		return math.NaN()
	}
	return x[min(len(x)-1, int(p*float64(len(x))))]
}

func valMean(x []float64) float64 {
	if len(x) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, v := range x {
		s += v
	}
	return s / float64(len(x))
}

func valMedian(x []time.Duration) time.Duration {
	if len(x) == 0 {
		return 0
	}
	return x[len(x)/2]
}

// runLive runs the workload against a fresh NATS, gateway and autoscaler with the process driver.
func runLive(t *testing.T, wl *sim.Workload, policy string, o liveOpts) *liveRun {
	ns, err := embed.Start(embed.Config{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	url := ns.ClientURL()
	pf := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pf, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	gw := start(t, "gateway", "gateway", "--nats", url, "--http", "127.0.0.1:0")
	defer gw.stop(syscall.SIGTERM)
	api := gw.waitFor(t, httpURL, 20*time.Second)
	fn := "sgd"
	if o.module != nil {
		fn = uploadFunction(t, api, o.fnName, o.module)
	}
	asArgs := []string{"autoscaler", "--nats", url, "--driver", "process", "--policy", pf,
		"--runtime-binary", faninBin, "--interval", "250ms"}
	if o.metrics {
		asArgs = append(asArgs, "--metrics", "127.0.0.1:0")
	}
	if o.runtimeCores > 0 {
		// The autoscaler's environment is its runtimes': they report GOMAXPROCS cores.
		t.Setenv("GOMAXPROCS", fmt.Sprint(o.runtimeCores))
	}
	as := start(t, "autoscaler", asArgs...)
	defer as.stop(syscall.SIGTERM)
	metricsURL := ""
	if o.metrics {
		metricsURL = as.waitFor(t, regexp.MustCompile(`metrics listening" url=(http://[0-9.:]+/metrics)`), 20*time.Second)
	}

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	b, err := store.OpenBuckets(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	poolCores := func() (n, c int) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		keys, err := b.Runtimes.Keys(ctx)
		if err != nil {
			return 0, 0
		}
		for _, k := range keys {
			e, err := b.Runtimes.Get(ctx, k)
			if err != nil {
				continue
			}
			var info wire.RuntimeInfo
			if json.Unmarshal(e.Value(), &info) == nil {
				c += info.Cores
				n++
			}
		}
		return n, c
	}
	pol, _ := autoscaler.ParsePolicy([]byte(policy))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if n, _ := poolCores(); n == pol.MinRuntimes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool not at %d runtimes\n%s", pol.MinRuntimes, as.output())
		}
		time.Sleep(100 * time.Millisecond)
	}

	run := &liveRun{steps: map[string][]float64{}, work: map[string][]float64{}, procWork: map[string][]float64{}, bytesPerStep: map[string]float64{},
		obs: map[string]*jobObs{}, signal: map[string][]signalSample{}}
	var mu sync.Mutex
	// The latest load of each shard, and when it came: what the autoscaler reads its signal from.
	type shardSeen struct {
		l  wire.ShardLoad
		at time.Time
	}
	latest := map[string]shardSeen{}
	running := map[string]bool{} // jobs created and not yet deleted
	// A job's gradient bytes per step: all its shards, all its ranks.
	jobBytes := map[string]float64{}
	for _, j := range wl.Jobs {
		jobBytes[j.ID] = float64(j.Params * 4 * int64(len(j.StepTimes[0])))
	}
	t0 := time.Now()
	// Load reports: per-shard work per step; a shard's work is folded into its job's per report.
	lastStep := map[string]int64{}
	loadSub, err := nc.Subscribe(wire.LoadSubject("*"), func(m *nats.Msg) {
		var rep wire.LoadReport
		if json.Unmarshal(m.Data, &rep) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if rep.NanosPerByte > 0 {
			run.nsPerByte = append(run.nsPerByte, rep.NanosPerByte)
		}
		if rep.Overhead > 0 {
			run.overheads = append(run.overheads, rep.Overhead)
		}
		per, proc := map[string]float64{}, map[string]float64{}
		bytes := map[string]float64{}
		now := time.Now()
		for _, s := range rep.Shards {
			latest[s.Key] = shardSeen{s, now}
			if s.Period > 0 {
				o := run.obs[s.Job]
				if o == nil {
					o = &jobObs{}
					run.obs[s.Job] = o
				}
				o.n++
				o.burst += s.Burst.Seconds()
				o.period += s.Period.Seconds()
				o.queueWait += s.QueueWait.Seconds()
				o.maxBurstShard = max(o.maxBurstShard, s.Burst.Seconds())
				o.maxQueueWait = max(o.maxQueueWait, s.QueueWait.Seconds())
			}
			if s.Work <= 0 || s.Step == lastStep[s.Key] {
				continue
			}
			lastStep[s.Key] = s.Step
			run.applyWork += s.Apply
			run.shardWork += s.Work
			per[s.Job] += s.Work
			proc[s.Job] += s.Work * max(rep.Overhead, 1)
			bytes[s.Job] += float64(s.Bytes)
		}
		for j, w := range per {
			// a report may cover a subset of a job's shards: scale to the job's bytes per step
			all := jobBytes[j]
			if all == 0 || bytes[j] == 0 {
				continue
			}
			run.work[j] = append(run.work[j], w*all/bytes[j])
			run.procWork[j] = append(run.procWork[j], proc[j]*all/bytes[j])
			run.bytesPerStep[j] = all
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer loadSub.Unsubscribe()
	// Decisions: counts, and when the desired size went up.
	type up struct {
		at      time.Time
		desired int
	}
	var ups []up
	prevDesired := pol.MinRuntimes
	decSub, err := nc.Subscribe(wire.DecisionsSubject, func(m *nats.Msg) {
		var d autoscaler.Decision
		if json.Unmarshal(m.Data, &d) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		run.decisions++
		if d.Mode == "panic" {
			run.panics++
		}
		run.moves += len(d.Moves)
		for _, mv := range d.Moves {
			if mv.From != "" {
				run.voluntary++
			}
		}
		run.published = append(run.published, demandSample{t: time.Since(t0).Seconds(), demand: d.Demand, desired: float64(d.Desired)})
		if d.Desired > prevDesired {
			ups = append(ups, up{time.Now(), d.Desired})
		}
		prevDesired = d.Desired
	})
	if err != nil {
		t.Fatal(err)
	}
	defer decSub.Unsubscribe()

	ctx := context.Background()
	admin := sdk.NewAdmin(api)
	t0 = time.Now()
	cpu0 := selfCPU()
	mu.Lock()
	run.published = run.published[:0] // decisions before the first arrival: the idle pool
	mu.Unlock()
	end := 0.0
	for _, j := range wl.Jobs {
		end = max(end, j.Arrival+j.Duration)
	}
	run.end = end
	// Pool sampler.
	samplerDone := make(chan struct{})
	var samplerWG sync.WaitGroup
	samplerWG.Add(1)
	asPid := as.cmd.Process.Pid
	cpu := map[int]float64{} // runtime pid: CPU seconds, last read
	go func() {
		defer samplerWG.Done()
		prev := time.Now()
		var pending []up
		tick := 0
		for {
			select {
			case <-samplerDone:
				return
			case <-time.After(100 * time.Millisecond):
			}
			n, c := poolCores()
			var ds demandSample
			scraped := metricsURL != "" && scrapeDemand(metricsURL, &ds)
			now := time.Now()
			el := now.Sub(t0).Seconds()
			dt := now.Sub(prev).Seconds()
			prev = now
			mu.Lock()
			if el <= end {
				run.coreSeconds += float64(c) * dt
				run.peakCores = max(run.peakCores, c)
			}
			run.pool = append(run.pool, struct{ t, cores float64 }{el, float64(c)})
			if scraped {
				ds.t = el
				run.demand = append(run.demand, ds)
			}
			if o.signal {
				got := map[string]*signalSample{}
				for k, s := range latest {
					if now.Sub(s.at) > signalFresh {
						delete(latest, k)
						continue
					}
					if !running[s.l.Job] || s.l.Period <= 0 {
						continue
					}
					x := got[s.l.Job]
					if x == nil {
						x = &signalSample{T: el}
						got[s.l.Job] = x
					}
					x.Wait = max(x.Wait, s.l.QueueWait.Seconds())
					x.Ratio = max(x.Ratio, s.l.QueueWait.Seconds()/s.l.Period.Seconds())
				}
				for id, x := range got {
					run.signal[id] = append(run.signal[id], *x)
				}
			}
			if tick++; o.metrics && tick%10 == 0 {
				childCPU(asPid, cpu)
			}
			pending = append(pending, ups...)
			ups = ups[:0]
			keep := pending[:0]
			for _, u := range pending {
				if n >= u.desired {
					run.startups = append(run.startups, now.Sub(u.at).Round(10*time.Millisecond))
				} else {
					keep = append(keep, u)
				}
			}
			pending = keep
			mu.Unlock()
		}
	}()

	var wg sync.WaitGroup
	for _, j := range wl.Jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(t0.Add(time.Duration(j.Arrival * float64(time.Second)))))
			stopAt := t0.Add(time.Duration((j.Arrival + j.Duration) * float64(time.Second)))
			ranks := len(j.StepTimes[0])
			spec := job.Spec{
				ID: j.ID, Ranks: ranks, ShardSize: job.ByteSize(o.shard),
				Tensors:  []job.Tensor{{Name: "w", Shape: []int{int(j.Params)}}},
				Function: job.Function{Name: fn, Hyper: map[string]float64{"lr": 0.01}},
			}
			if _, err := admin.CreateJob(ctx, spec); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			running[j.ID] = true
			mu.Unlock()
			var rwg sync.WaitGroup
			var steps []float64
			var stopK atomic.Int64
			stopK.Store(math.MaxInt64)
			for r := range ranks {
				rwg.Add(1)
				go func() {
					defer rwg.Done()
					c, err := sdk.Connect(ctx, url)
					if err != nil {
						t.Error(err)
						return
					}
					defer c.Close()
					w, err := c.Worker(ctx, j.ID, r)
					if err != nil {
						t.Error(err)
						return
					}
					grads := make([]float32, j.Params)
					for i := range grads {
						grads[i] = float32(i%7) * 1e-3
					}
					last := time.Now()
					for k := int64(0); ; k++ {
						// Every rank does the same steps: the first to see the end finishes this step.
						if time.Now().After(stopAt) {
							stopK.CompareAndSwap(math.MaxInt64, k+1)
						}
						if k >= stopK.Load() {
							break
						}
						time.Sleep(time.Duration(j.StepTimes[int(k)%len(j.StepTimes)][r] * float64(time.Second)))
						sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
						_, err := w.Step(sctx, grads)
						cancel()
						if err != nil {
							t.Errorf("%s rank %d: %v", j.ID, r, err)
							return
						}
						if r == 0 {
							now := time.Now()
							steps = append(steps, now.Sub(last).Seconds())
							last = now
						}
					}
				}()
			}
			rwg.Wait()
			mu.Lock()
			run.steps[j.ID] = steps
			delete(running, j.ID)
			mu.Unlock()
			if err := admin.DeleteJob(ctx, j.ID); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	// Keep sampling until the end of the workload's time, as the sim does.
	time.Sleep(time.Until(t0.Add(time.Duration(end * float64(time.Second)))))
	close(samplerDone)
	samplerWG.Wait()
	if o.metrics {
		childCPU(asPid, cpu)
	}
	run.selfCPU = selfCPU() - cpu0
	for _, c := range cpu {
		run.runtimeCPU += c
	}
	as.stop(syscall.SIGTERM)
	gw.stop(syscall.SIGTERM)
	return run
}

// selfCPU is the CPU seconds (user and system) of this process so far.
func selfCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// childCPU reads the CPU seconds (user and system) of the children of ppid from /proc into cpu,
// keyed by pid: a child that exited keeps its last reading.
func childCPU(ppid int, cpu map[int]float64) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(data), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(data[i+1:])) // state ppid ... utime(12) stime(13)
		if len(f) < 14 || f[1] != strconv.Itoa(ppid) {
			continue
		}
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		cpu[pid] = (ut + st) / 100 // USER_HZ
	}
}

// scrapeDemand reads the autoscaler's gauges of its last decision: demand, pool cores, desired.
func scrapeDemand(url string, ds *demandSample) bool {
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return false
	}
	found := 0
	for _, line := range strings.Split(string(body), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch name {
		case metrics.AutoscalerDemandCores:
			ds.demand = v
			found++
		case metrics.AutoscalerPoolCores:
			ds.poolCores = v
		case metrics.AutoscalerDesiredSize:
			ds.desired = v
		}
	}
	return found > 0
}
