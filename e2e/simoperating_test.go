package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/lab/wasmbuild"
	"github.com/fanin-ml/fanin/sim"
)

// operatingPolicy is the policy of the operating-point validation: the documented defaults
// (docs/AUTOSCALING.md, "The policy knobs"), with a pool of 1 to 3 one-core runtimes so that it
// can move within this machine's 2 cores. FANIN_VALIDATE_POLICY names a file to use instead.
const operatingPolicy = `min_runtimes: 1
max_runtimes: 3
cores_per_runtime: 1
`

// Operating-point workload: many small jobs. Its size is set by the environment so that it can be
// fitted to the machine; the defaults are those of configuration B in docs/lab/autoscaling.md.
const (
	opShard = 512 << 10 // shard size, bytes
	opSeed  = 1
)

// TestSimValidateOperating runs many small jobs for real, at the default policy, against a
// static pool of the machine's size and against the elastic pool, recording the decider's demand
// at every decision; then replays the same workload and policy in the simulator (default model and
// measured parameters) and writes both side by side. For docs/lab/autoscaling.md, "2026-11-25
// Simulator vs reality at the operating point"; FANIN_VALIDATE=operating runs it.
//
//	FANIN_VALIDATE_JOBS      jobs (default 12)
//	FANIN_VALIDATE_SECONDS   length of the workload (default 80)
//	FANIN_VALIDATE_STEP      seconds of a normalized PAI batch time of 1000 (default 0.5)
//	FANIN_VALIDATE_POLICY    policy file (default operatingPolicy)
//	FANIN_VALIDATE_FUNCTION  a user function's source directory (lab/wasmbuild), every job's
//	                         function instead of the built-in sgd: e.g.
//	                         ../functions/wasmfn/testdata/sgdloop, slower than a runtime's
//	                         connection, so that gradients queue for the cores
//	FANIN_VALIDATE_OUT       output directory (default $TMPDIR/fanin-validate-operating)
//	FANIN_VALIDATE_DRY=1     only write workload.json and policy.yaml
//	FANIN_VALIDATE_REPLAY    a directory of an earlier run: replay its workload.json,
//	                         workload-live-shaped.json and policy.yaml in the sim alone, at the
//	                         throughput FANIN_VALIDATE_THROUGHPUT (B/s per core, as live.md says),
//	                         and write sim-replay.md (costs, demand over time); with the run's
//	                         live-signal.json, compare the closed loop's input with it again
//
// It also records, every 100 ms, each job's closed-loop input as the autoscaler reads it from the
// runtimes' load reports (the longest shard queue wait over period), runs the simulator on the same
// workload at the measured throughput and start-up, and fails unless the simulated input, over all
// samples, is within 20% of the live one (signalGoal) on the workload shaped to the live periods
// and bursts (compareBoth says why); live.md has the comparison per job, on both workloads.
func TestSimValidateOperating(t *testing.T) {
	if os.Getenv("FANIN_VALIDATE") != "operating" {
		t.Skip("simulator validation at the operating point: set FANIN_VALIDATE=operating")
	}
	skipShort(t)
	if dir := os.Getenv("FANIN_VALIDATE_REPLAY"); dir != "" {
		simReplay(t, dir, envFloat(t, "FANIN_VALIDATE_THROUGHPUT", 2e9), envFloat(t, "FANIN_VALIDATE_SECONDS", 80))
		return
	}
	out := os.Getenv("FANIN_VALIDATE_OUT")
	if out == "" {
		out = filepath.Join(os.TempDir(), "fanin-validate-operating")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	nJobs := envInt(t, "FANIN_VALIDATE_JOBS", 12)
	length := envFloat(t, "FANIN_VALIDATE_SECONDS", 80)
	stepScale := envFloat(t, "FANIN_VALIDATE_STEP", 0.5)
	policyText := operatingPolicy
	if f := os.Getenv("FANIN_VALIDATE_POLICY"); f != "" {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		policyText = string(data)
	}
	pol, err := autoscaler.ParsePolicy([]byte(policyText))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := sim.LoadTraces("/work/shared/traces")
	if err != nil {
		root, _ := filepath.Abs("..")
		if tr, err = sim.LoadTraces(filepath.Join(root, "..", "shared", "traces")); err != nil {
			t.Fatal(err)
		}
	}
	wl, err := operatingWorkload(tr, nJobs, length, stepScale)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "workload.json"), wl.MarshalIndent(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "policy.yaml"), []byte(policyText), 0o644); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("FANIN_VALIDATE_DRY") == "1" {
		// The sim alone (default model): how much the decider's demand moves on this workload.
		c := sim.DefaultConfig()
		c.Duration = time.Duration(length * float64(time.Second))
		c.Interval = 250 * time.Millisecond
		c.ShardBytes = opShard
		def, err := sim.Run(c, pol, wl, nil)
		if err != nil {
			t.Fatal(err)
		}
		var d []float64
		for _, p := range def.Pool {
			d = append(d, p.Demand)
		}
		t.Logf("wrote %s/workload.json and policy.yaml; FANIN_VALIDATE_DRY=1: no live run. Sim (default model): "+
			"demand mean %.2f max %.2f cores, reserved %.0f core-s, %.1f%% of hindsight static, peak %.0f cores",
			out, valMean(d), maxOf(d), def.ElasticCoreSeconds, 100*def.CostRatio(), def.PeakCores)
		return
	}
	// Static: the machine, 2 one-core runtimes, for the whole run.
	static := pol
	static.MinRuntimes, static.MaxRuntimes = 2, 2
	opts := liveOpts{shard: opShard, runtimeCores: 1, metrics: true, signal: true}
	if dir := os.Getenv("FANIN_VALIDATE_FUNCTION"); dir != "" {
		opts.module, opts.fnName = wasmbuild.ForTest(t, dir), filepath.Base(dir)
	}

	load0 := loadavg()
	st := runLive(t, wl, static.YAML(), opts)
	load1 := loadavg()
	el := runLive(t, wl, policyText, opts)
	load2 := loadavg()

	// Measured throughput: bytes one core aggregates per second, from the runtimes' reports: in the
	// kernels (what a gradient waits for, for the closed loop's input), and in the whole runtime
	// process (what the autoscaler plans and a core costs, for the pool and the baselines).
	var bytes, work, procWork float64
	for id, ws := range el.work {
		for i, w := range ws {
			work += w
			procWork += el.procWork[id][i]
			bytes += el.bytesPerStep[id]
		}
	}
	thr, procThr := bytes/work, bytes/procWork
	su := slices.Clone(el.startups)
	slices.Sort(su)
	startup := valMedian(su)
	if startup == 0 {
		startup = 50 * time.Millisecond // no start measured: what a local process took before
	}

	// The simulator on the same workload and policy, in-process, for its per-tick demand.
	c := sim.DefaultConfig()
	c.Duration = time.Duration(length * float64(time.Second))
	c.Interval = 250 * time.Millisecond
	c.ShardBytes = opShard
	def, err := sim.Run(c, pol, wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	cm := c
	cm.Throughput, cm.StartupDelay, cm.SlowFraction = procThr, startup, 0
	meas, err := sim.Run(cm, pol, wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The same, with each job's step times stretched to the period and burst the runtimes measured
	// live: does the decider, fed what it saw live, ask for what it asked live?
	lwl := liveShaped(wl, el)
	lin, err := sim.Run(cm, pol, lwl, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "workload-live-shaped.json"), lwl.MarshalIndent(), 0o644); err != nil {
		t.Fatal(err)
	}
	// The closed loop's input, live against the simulator's on the same workload and policy.
	ls := liveSignal{Throughput: thr, Startup: startup.Seconds(), Length: length, Jobs: el.signal, ConnRate: connRate(t, opShard)}
	if el.shardWork > 0 {
		ls.ApplyShare = min(el.applyWork/el.shardWork, 0.99)
	}
	t.Logf("the shards' updates took %.1f%% of their work (the rest: sums)", 100*ls.ApplyShare)
	t.Logf("a NATS connection takes in %.2f GB/s of %d-byte messages on this machine", ls.ConnRate/1e9, opShard)
	if data, err := json.MarshalIndent(ls, "", " "); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(filepath.Join(out, "live-signal.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	given, shaped, err := ls.compareBoth(pol, wl, lwl)
	if err != nil {
		t.Fatal(err)
	}

	// Baselines, live: the sim's hindsight-tightest static (ceil(work/burst) cores per job, at the
	// measured throughput) and one core per worker, each for the job's life.
	var tightCS, perWorkerCS float64
	for _, j := range wl.Jobs {
		life := math.Min(j.Arrival+j.Duration, length) - j.Arrival
		ranks := len(j.StepTimes[0])
		perWorkerCS += float64(ranks) * life
		tightCS += float64(staticCores(j, procThr)) * life
	}

	q := valQuantile
	var sb strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&sb, f, a...) }
	w("workload: %d jobs, %.0f s, step scale %.2f s, shard %d KiB; policy:\n%s\n", len(wl.Jobs), length, stepScale, opShard>>10, pol.YAML())
	w("machine load average (1 min) before the static run %s, before the elastic run %s, after it %s\n", load0, load1, load2)
	w("measured throughput %.3g B/s per core in the kernels (the closed loop's input is compared at it), %.3g in the whole runtime process (the kernels' time times the process's overhead, median %.2f of %d reports: what the autoscaler plans; the sim's measured runs and the baselines use it); startup median %v of %d\n",
		thr, procThr, valQuantile(slices.Sorted(slices.Values(el.overheads)), 0.5), len(el.overheads), startup, len(su))
	w("the shards' updates took %.1f%% of their work, the rest their sums (the simulator's apply share in the closed loop's comparison)\n", 100*ls.ApplyShare)
	w("\n| | live elastic | live static (2 x 1 core) | sim default | sim measured |\n|---|---:|---:|---:|---:|\n")
	w("| reserved core-seconds | %.1f | %.1f | %.1f | %.1f |\n", el.coreSeconds, st.coreSeconds, def.ElasticCoreSeconds, meas.ElasticCoreSeconds)
	w("| hindsight static (sim def.), core-s | %.1f (measured thr.) | | %.1f | %.1f |\n", tightCS, def.StaticCoreSeconds, meas.StaticCoreSeconds)
	w("| cost vs hindsight static | %.1f%% | %.1f%% | %.1f%% | %.1f%% |\n", 100*el.coreSeconds/tightCS, 100*st.coreSeconds/tightCS, 100*def.CostRatio(), 100*meas.CostRatio())
	w("| one core per worker, core-s | %.1f | | | |\n", perWorkerCS)
	w("| cost vs one core per worker | %.1f%% | %.1f%% | %.1f%% | %.1f%% |\n", 100*el.coreSeconds/perWorkerCS, 100*st.coreSeconds/perWorkerCS,
		100*def.ElasticCoreSeconds/perWorkerCS, 100*meas.ElasticCoreSeconds/perWorkerCS)
	w("| work floor, core-s | %.1f (live shard work; %.1f with the overhead) | | %.1f | %.1f |\n", work, procWork, def.WorkCoreSeconds, meas.WorkCoreSeconds)
	slow, raw := valSlowdown(el, st)
	w("| step slowdown mean / p99 (live: elastic vs static, paired) | %.2f%% / %.1f%% (unfloored mean %.2f%%, %d steps) | | %.2f%% / %.1f%% | %.2f%% / %.1f%% |\n",
		100*valMean(slow), 100*q(slow, .99), 100*valMean(raw), len(slow), 100*def.Slowdown.Mean, 100*def.Slowdown.P99, 100*meas.Slowdown.Mean, 100*meas.Slowdown.P99)
	eo, so := stepOverhead(el, wl), stepOverhead(st, wl)
	w("| step time over compute (max rank), mean / p99 | %.1f%% / %.1f%% | %.1f%% / %.1f%% | | |\n", 100*valMean(eo), 100*q(eo, .99), 100*valMean(so), 100*q(so, .99))
	w("| CPU of the runtime processes / of the test process (workers, NATS), s | %.1f / %.1f | %.1f / %.1f | | |\n", el.runtimeCPU, el.selfCPU, st.runtimeCPU, st.selfCPU)
	w("| peak cores | %d | %d | %.0f | %.0f |\n", el.peakCores, st.peakCores, def.PeakCores, meas.PeakCores)
	w("| decisions published (changed) / panic | %d / %d | %d / %d | %d / %d (all ticks) | %d / %d (all ticks) |\n",
		el.decisions, el.panics, st.decisions, st.panics, def.Decisions, def.PanicDecisions, meas.Decisions, meas.PanicDecisions)
	w("| moves incl. first placements (voluntary) | %d (%d) | %d (%d) | %d + %d | %d + %d |\n", el.moves, el.voluntary, st.moves, st.voluntary,
		def.Migrations, def.Placements, meas.Migrations, meas.Placements)
	w("| runtimes started | | | %d (%d slow) | %d |\n", def.RuntimesStarted, def.SlowRuntimes, meas.RuntimesStarted)

	w("\nsim, measured parameters, step times shaped to the live periods and bursts: %.1f core-s (%.1f%% of its hindsight static %.1f), slowdown mean %.2f%% p99 %.1f%%, peak %.0f cores\n",
		lin.ElasticCoreSeconds, 100*lin.CostRatio(), lin.StaticCoreSeconds, 100*lin.Slowdown.Mean, 100*lin.Slowdown.P99, lin.PeakCores)

	// Demand and pool over time, in 5 s buckets: live (scraped gauges) against the sims.
	w("\ndemand and pool over time (5 s buckets: mean demand, max demand, mean reserved cores)\n")
	w("| t (s) | live demand mean/max | live pool | sim default demand mean/max | sim default pool | sim measured demand mean/max | sim measured pool | sim live-shaped demand mean/max | pool |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var tsv strings.Builder
	tsv.WriteString("source\tt\tdemand\tpool_cores\tdesired\n")
	for _, d := range el.demand {
		fmt.Fprintf(&tsv, "live\t%.2f\t%.4f\t%g\t%g\n", d.t, d.demand, d.poolCores, d.desired)
	}
	for _, p := range def.Pool {
		fmt.Fprintf(&tsv, "sim-default\t%.2f\t%.4f\t%g\t%d\n", p.T, p.Demand, p.Reserved, p.Runtimes)
	}
	for _, p := range meas.Pool {
		fmt.Fprintf(&tsv, "sim-measured\t%.2f\t%.4f\t%g\t%d\n", p.T, p.Demand, p.Reserved, p.Runtimes)
	}
	for _, p := range lin.Pool {
		fmt.Fprintf(&tsv, "sim-live-shaped\t%.2f\t%.4f\t%g\t%d\n", p.T, p.Demand, p.Reserved, p.Runtimes)
	}
	for b := 0.0; b < length; b += 5 {
		in := func(x float64) bool { return x >= b && x < b+5 }
		var ld, lp, dd, dp, md, mp, sd, sp []float64
		for _, p := range lin.Pool {
			if in(p.T) {
				sd, sp = append(sd, p.Demand), append(sp, p.Reserved)
			}
		}
		for _, d := range el.demand {
			if in(d.t) {
				ld = append(ld, d.demand)
			}
		}
		for _, p := range el.pool {
			if in(p.t) {
				lp = append(lp, p.cores)
			}
		}
		for _, p := range def.Pool {
			if in(p.T) {
				dd, dp = append(dd, p.Demand), append(dp, p.Reserved)
			}
		}
		for _, p := range meas.Pool {
			if in(p.T) {
				md, mp = append(md, p.Demand), append(mp, p.Reserved)
			}
		}
		w("| %.0f | %.2f / %.2f | %.1f | %.2f / %.2f | %.1f | %.2f / %.2f | %.1f | %.2f / %.2f | %.1f |\n", b, valMean(ld), maxOf(ld), valMean(lp),
			valMean(dd), maxOf(dd), valMean(dp), valMean(md), maxOf(md), valMean(mp), valMean(sd), maxOf(sd), valMean(sp))
	}
	// What the decider saw of each job, live, against the workload's own figures (the sim's
	// decider sees the spread of the step times as the burst, and work = bytes / throughput).
	w("\nper job: live load reports (mean over shards and reports) against the workload\n")
	w("| job | ranks | params | live burst | workload spread (median) | live period | workload period (median max rank) | live queue wait mean/max | live work/step with the overhead (ms) | sim work/step at measured process thr. (ms) | sim static cores |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, j := range wl.Jobs {
		o := el.obs[j.ID]
		if o == nil {
			o = &jobObs{n: 0}
		}
		n := float64(max(o.n, 1))
		spread, period := spreadPeriod(j)
		lw := valMean(el.procWork[j.ID]) // as planned: with the overhead
		ranks := len(j.StepTimes[0])
		w("| %s | %d | %d | %.0f ms | %.0f ms | %.3f s | %.3f s | %.1f / %.0f ms | %.2f | %.2f | %d |\n", j.ID, ranks, j.Params,
			1000*o.burst/n, 1000*spread, o.period/n, period, 1000*o.queueWait/n, 1000*o.maxQueueWait, 1000*lw,
			1000*float64(j.Params*4*int64(ranks))/procThr, staticCores(j, procThr))
	}
	w("\npublished live decisions (t, demand, desired):")
	for _, d := range el.published {
		w(" %.1f:%.2f/%g", d.t, d.demand, d.desired)
	}
	w("\nsim flags for measured parameters: --throughput %.3g --startup %v --slow-fraction 0\n", procThr, startup)
	sb.WriteString("\n" + signalMarkdown(given, shaped))
	t.Log("\n" + sb.String())
	if err := os.WriteFile(filepath.Join(out, "live.md"), []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "demand.tsv"), []byte(tsv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if len(el.demand) == 0 {
		t.Error("no demand scraped from the autoscaler's metrics")
	}
	if err := shaped.check(); err != nil {
		t.Error(err)
	}
}

// signalGoal is how far apart the live and simulated closed-loop inputs may be, in aggregate:
// within 20% of the live one.
const signalGoal = 0.2

// signalFloor is the queue wait over period below which the signal is taken as no queue at all: a
// twentieth of the smallest slowdown_budget the closed loop is given in the docs (2%).
const signalFloor = 0.001

// liveSignal is what a live run measured of the closed loop's input (live-signal.json), with what
// the simulator needs to run the same workload at the measured parameters.
type liveSignal struct {
	Throughput float64                   `json:"throughput"` // B/s per core, from the runtimes' reported work
	Startup    float64                   `json:"startup"`    // seconds, the pool's measured start-up
	Length     float64                   `json:"length"`     // seconds of the workload
	Jobs       map[string][]signalSample `json:"jobs"`
	// ConnRate is how fast one NATS connection on this machine takes messages in (bytes/s; 0
	// unknown, in runs saved before it was measured): what a live runtime's gradients queue behind
	// before its cores, which the simulator models as the runtime's NIC.
	ConnRate float64 `json:"conn_rate,omitempty"`
	// ApplyShare is the share of a shard's step work in its update, done when the step's last
	// gradient is in (sim.Config.ApplyShare; 0 in runs saved before it was measured).
	ApplyShare float64 `json:"apply_share,omitempty"`
}

// compare runs the simulator on the workload and policy at the live run's measured throughput and
// start-up, with no stragglers, its decisions every 250 ms as the live autoscaler's, and compares
// its closed-loop input with the live one. The live run is on one machine's loopback: a runtime's
// NIC is its NATS connection, which delivers one message after another at the rate measured
// (ConnRate; none when it was not measured). Without it the simulator's gradients of a burst all
// arrived at once and queued for the cores, where live ones came in one by one, each summed before
// the next was in: on a quiet machine it told the loop 300 times the live queue wait.
func (ls liveSignal) compare(pol autoscaler.Policy, wl *sim.Workload) (*signalComparison, error) {
	c := sim.DefaultConfig()
	c.Duration = time.Duration(ls.Length * float64(time.Second))
	c.Interval = 250 * time.Millisecond
	c.ShardBytes = opShard
	c.Throughput, c.StartupDelay, c.SlowFraction, c.NIC = ls.Throughput, time.Duration(ls.Startup*float64(time.Second)), 0, ls.ConnRate
	c.ApplyShare = ls.ApplyShare
	r, err := sim.Run(c, pol, wl, nil)
	if err != nil {
		return nil, err
	}
	return compareSignals(ls.Jobs, r.JobRows), nil
}

// compareBoth compares the closed loop's input on the workload as given and on the workload shaped
// to the periods and bursts the runtimes measured live (liveShaped), and checks the second. The
// simulator models neither the messaging's share of a live step nor a loaded machine's: on the
// workload as given its periods are shorter than the live ones, which alone changes the input
// (queue wait over period), however well it derives the queue wait. The shaped workload gives it the
// live periods, so that what is compared is how the queue wait is derived. The test checks the
// second (signalComparison.check).
func (ls liveSignal) compareBoth(pol autoscaler.Policy, given, shaped *sim.Workload) (g, sh *signalComparison, err error) {
	if g, err = ls.compare(pol, given); err != nil {
		return nil, nil, err
	}
	if sh, err = ls.compare(pol, shaped); err != nil {
		return nil, nil, err
	}
	return g, sh, nil
}

// signalMarkdown writes both comparisons of compareBoth.
func signalMarkdown(given, shaped *signalComparison) string {
	return "on the workload as given:\n\n" + given.markdown() +
		"\non the workload shaped to the live periods and bursts (what the test checks):\n\n" + shaped.markdown()
}

// signalComparison is the closed loop's input, live and simulated, per job and over all the
// samples of all jobs (each source's samples pooled: a time average over the jobs' lives).
type signalComparison struct {
	rows                            []signalRow
	live, sim, liveWait, simWait    float64 // pooled means: queue wait over period, and queue wait (s)
	liveSamples, simSamples, missed int     // missed: jobs with samples in one source only
}

type signalRow struct {
	job                          string
	liveN, simN                  int
	live, sim, liveWait, simWait float64
}

// compareSignals pairs the live samples of each job with the simulator's tallies of it.
func compareSignals(live map[string][]signalSample, rows []sim.JobRow) *signalComparison {
	c := &signalComparison{}
	simRow := map[string]sim.JobRow{}
	for _, r := range rows {
		simRow[r.ID] = r
	}
	ids := slices.Sorted(maps.Keys(live))
	for _, r := range rows {
		if _, ok := live[r.ID]; !ok {
			ids = append(ids, r.ID)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		x := signalRow{job: id, liveN: len(live[id])}
		for _, s := range live[id] {
			x.live += s.Ratio
			x.liveWait += s.Wait
		}
		c.live += x.live
		c.liveWait += x.liveWait
		c.liveSamples += x.liveN
		if x.liveN > 0 {
			x.live /= float64(x.liveN)
			x.liveWait /= float64(x.liveN)
		}
		r := simRow[id]
		x.simN, x.sim, x.simWait = r.SignalTicks, r.MeanSignal, r.MeanQueueWait
		c.sim += x.sim * float64(x.simN)
		c.simWait += x.simWait * float64(x.simN)
		c.simSamples += x.simN
		if (x.liveN == 0) != (x.simN == 0) {
			c.missed++
		}
		c.rows = append(c.rows, x)
	}
	if c.liveSamples > 0 {
		c.live /= float64(c.liveSamples)
		c.liveWait /= float64(c.liveSamples)
	}
	if c.simSamples > 0 {
		c.sim /= float64(c.simSamples)
		c.simWait /= float64(c.simSamples)
	}
	return c
}

// check says whether the simulated closed-loop input is within signalGoal of the live one, in
// aggregate; it is an error too when the live run measured none (nothing was compared).
func (c *signalComparison) check() error {
	switch {
	case c.liveSamples == 0:
		return errors.New("signal: no live samples of the closed loop's input (no load reports with a measured period)")
	case c.live == 0:
		return errors.New("signal: the live queue wait is 0 throughout: the workload never made a gradient wait for a core, so nothing is compared")
	case c.live < signalFloor && c.sim < signalFloor:
		// A runtime fed by one connection slower than its cores sum never queues a gradient: what
		// the runtime then measures is scheduling noise, and a ratio of it says nothing.
		return fmt.Errorf("signal: inconclusive: the queue wait over period is below %.1f%% both live (%.5f) and simulated (%.5f): no gradient queued for a core, so there is nothing to compare",
			100*signalFloor, c.live, c.sim)
	case math.Abs(c.sim-c.live) > signalGoal*c.live:
		return fmt.Errorf("signal: simulated queue wait over period %.4f is %.2fx the live %.4f, not within %.0f%%",
			c.sim, c.sim/c.live, c.live, 100*signalGoal)
	}
	return nil
}

func (c *signalComparison) markdown() string {
	var sb strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&sb, f, a...) }
	w("closed-loop input (the longest shard queue wait over period, and the queue wait), live against simulated, per job and over all samples\n")
	w("| job | live samples | sim ticks | live wait/period | sim wait/period | sim / live | live wait (ms) | sim wait (ms) |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range c.rows {
		w("| %s | %d | %d | %.4f | %.4f | %.2f | %.2f | %.2f |\n", r.job, r.liveN, r.simN, r.live, r.sim, r.sim/r.live, 1000*r.liveWait, 1000*r.simWait)
	}
	w("| **all** | %d | %d | %.4f | %.4f | **%.2f** | %.2f | %.2f |\n", c.liveSamples, c.simSamples, c.live, c.sim, c.sim/c.live, 1000*c.liveWait, 1000*c.simWait)
	verdict := "within"
	if c.check() != nil {
		verdict = "not within"
	}
	near := 0
	for _, r := range c.rows {
		if r.liveN > 0 && r.simN > 0 && math.Abs(r.sim-r.live) <= signalGoal*r.live {
			near++
		}
	}
	w("\nsimulated over live, all samples: %.2f (%s %.0f%%), queue wait alone %.2f; jobs within %.0f%%: %d of %d; jobs sampled by one source only: %d\n",
		c.sim/c.live, verdict, 100*signalGoal, c.simWait/c.liveWait, 100*signalGoal, near, len(c.rows), c.missed)
	return sb.String()
}

// operatingWorkload draws nJobs small jobs (0.25-1 M float32 parameters, 2-4 ranks), arriving
// over the first half of the run and training until a time in its second half, with step times
// from the PAI traces (one row per iteration, the first `ranks` workers of a trace from a random
// iteration on), scaled so that a normalized 1000 is stepScale seconds.
func operatingWorkload(tr *sim.Traces, nJobs int, length, stepScale float64) (*sim.Workload, error) {
	rng := rand.New(rand.NewPCG(opSeed, 0))
	names := []string{"pai-1", "pai-2", "pai-3"}
	wl := &sim.Workload{}
	for i := range nJobs {
		its := tr.PAI[names[i%len(names)]]
		if len(its) == 0 {
			return nil, fmt.Errorf("trace %s: not in the trace directory", names[i%len(names)])
		}
		ranks := 2 + rng.IntN(3)
		params := int64(1+rng.IntN(4)) * (1 << 18)
		arrival := math.Round(10*float64(i)*length/2/float64(nJobs)) / 10
		end := length/2 + rng.Float64()*length/2
		off := rng.IntN(len(its))
		var rows [][]float64
		for k := range 300 {
			src := its[(off+k)%len(its)]
			row := make([]float64, ranks)
			for r := range row {
				row[r] = math.Round(src[r%len(src)]*stepScale) / 1000
			}
			rows = append(rows, row)
		}
		wl.Jobs = append(wl.Jobs, sim.JobSpec{ID: fmt.Sprintf("o%02d", i+1), Arrival: arrival,
			Duration: math.Round(10*(end-arrival)) / 10, Params: params, StepTimes: rows})
	}
	return wl, nil
}

// simReplay runs the sim alone on the inputs an earlier live run wrote to dir (the default model,
// measured parameters at thr, and the live-shaped workload at thr), and writes dir/sim-replay.md.
func simReplay(t *testing.T, dir string, thr, length float64) {
	data, err := os.ReadFile(filepath.Join(dir, "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := autoscaler.ParsePolicy(data)
	if err != nil {
		t.Fatal(err)
	}
	c := sim.DefaultConfig()
	c.Duration = time.Duration(length * float64(time.Second))
	c.Interval = 250 * time.Millisecond
	c.ShardBytes = opShard
	cm := c
	cm.Throughput, cm.StartupDelay, cm.SlowFraction = thr, 50*time.Millisecond, 0
	runs := []struct {
		name, file string
		c          sim.Config
	}{{"default model", "workload.json", c}, {"measured", "workload.json", cm}, {"live-shaped", "workload-live-shaped.json", cm}}
	var sb strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&sb, f, a...) }
	var res []*sim.Result
	w("| sim | core-s | vs hindsight static | mean / p99 slowdown | peak cores | demand plateau (max) |\n|---|---:|---:|---:|---:|---:|\n")
	for _, r := range runs {
		wl, err := sim.ReadWorkload(filepath.Join(dir, r.file))
		if errors.Is(err, fs.ErrNotExist) && r.file != "workload.json" {
			res = append(res, nil) // a run from before the live-shaped replay
			w("| %s | - | - | - | - | - |\n", r.name)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		x, err := sim.Run(r.c, pol, wl, nil)
		if err != nil {
			t.Fatal(err)
		}
		res = append(res, x)
		var d []float64
		for _, p := range x.Pool {
			d = append(d, p.Demand)
		}
		w("| %s | %.1f | %.1f%% | %.2f%% / %.1f%% | %.0f | %.2f |\n", r.name, x.ElasticCoreSeconds, 100*x.CostRatio(),
			100*x.Slowdown.Mean, 100*x.Slowdown.P99, x.PeakCores, maxOf(d))
	}
	w("\n| t (s) | default demand / pool | measured demand / pool | live-shaped demand / pool |\n|---:|---:|---:|---:|\n")
	for b := 0.0; b < length; b += 5 {
		w("| %.0f |", b)
		for _, x := range res {
			if x == nil {
				w(" - |")
				continue
			}
			var d, p []float64
			for _, s := range x.Pool {
				if s.T >= b && s.T < b+5 {
					d, p = append(d, s.Demand), append(p, s.Reserved)
				}
			}
			w(" %.2f / %.1f |", valMean(d), valMean(p))
		}
		w("\n")
	}
	// The closed loop's input against the one the live run recorded, at its measured parameters.
	var sigErr error
	if data, err := os.ReadFile(filepath.Join(dir, "live-signal.json")); err == nil {
		var ls liveSignal
		if err := json.Unmarshal(data, &ls); err != nil {
			t.Fatalf("%s/live-signal.json: %v", dir, err)
		}
		wl, err := sim.ReadWorkload(filepath.Join(dir, "workload.json"))
		if err != nil {
			t.Fatal(err)
		}
		lwl, err := sim.ReadWorkload(filepath.Join(dir, "workload-live-shaped.json"))
		if err != nil {
			t.Fatal(err)
		}
		given, shaped, err := ls.compareBoth(pol, wl, lwl)
		if err != nil {
			t.Fatal(err)
		}
		sb.WriteString("\n" + signalMarkdown(given, shaped))
		sigErr = shaped.check()
	} else if !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	t.Log("\n" + sb.String())
	if err := os.WriteFile(filepath.Join(dir, "sim-replay.md"), []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if sigErr != nil {
		t.Error(sigErr)
	}
}

// liveShaped is the workload with each job's step times stretched to what the runtimes measured
// live: every row is scaled so that its slowest rank matches the live period (the workload's
// median slowest rank times live period / that median), and its ranks' distances from the slowest
// scaled so that the median spread matches the live burst. A job without live reports is unchanged.
func liveShaped(wl *sim.Workload, r *liveRun) *sim.Workload {
	out := &sim.Workload{}
	for _, j := range wl.Jobs {
		o := r.obs[j.ID]
		spread, period := spreadPeriod(j)
		if o == nil || o.n == 0 || spread <= 0 || period <= 0 {
			out.Jobs = append(out.Jobs, j)
			continue
		}
		ps := o.period / float64(o.n) / period
		bs := o.burst / float64(o.n) / spread
		nj := j
		nj.StepTimes = nil
		for _, row := range j.StepTimes {
			top := slices.Max(row)
			nr := make([]float64, len(row))
			for i, x := range row {
				nr[i] = max(0.001, math.Round(1000*(top*ps-(top-x)*bs))/1000)
			}
			nj.StepTimes = append(nj.StepTimes, nr)
		}
		out.Jobs = append(out.Jobs, nj)
	}
	return out
}

// spreadPeriod is a job's median spread of its ranks' step times and median slowest rank.
func spreadPeriod(j sim.JobSpec) (spread, period float64) {
	var spreads, periods []float64
	for _, row := range j.StepTimes {
		spreads = append(spreads, slices.Max(row)-slices.Min(row))
		periods = append(periods, slices.Max(row))
	}
	slices.Sort(spreads)
	slices.Sort(periods)
	return spreads[len(spreads)/2], periods[len(periods)/2]
}

// staticCores is the sim's static reservation of a job: ceil(work per step / typical burst), the
// burst at least 5% of the median step.
func staticCores(j sim.JobSpec, thr float64) int {
	spread, period := spreadPeriod(j)
	burst := max(spread, 0.05*period)
	w := float64(j.Params*4*int64(len(j.StepTimes[0]))) / thr
	return max(1, int(math.Ceil(w/burst-1e-9)))
}

// stepOverhead is, per step of rank 0, the step time over the slowest rank's compute time, - 1:
// what the messaging and aggregation add to a step, sorted.
func stepOverhead(r *liveRun, wl *sim.Workload) []float64 {
	var x []float64
	for _, j := range wl.Jobs {
		for k, s := range r.steps[j.ID] {
			if k == 0 {
				continue // includes the first connection
			}
			x = append(x, s/slices.Max(j.StepTimes[k%len(j.StepTimes)])-1)
		}
	}
	slices.Sort(x)
	return x
}

// loadavg is the machine's 1-minute load average, as /proc/loadavg says.
// connRate is how fast one connection takes in core NATS messages of size bytes that another
// publishes through a NATS server of this machine: the best of three rounds of 64 MiB, from the
// first publish to the last message in.
func connRate(t *testing.T, size int) float64 {
	t.Helper()
	url := testutil.NATS(t)
	sub, _ := testutil.Connect(t, url)
	pub, _ := testutil.Connect(t, url)
	n := max(1, (64<<20)/size)
	data := make([]byte, size)
	var best float64
	for round := range 3 {
		var got atomic.Int64
		done := make(chan struct{})
		subj := "rate." + strconv.Itoa(round)
		s, err := sub.Subscribe(subj, func(*nats.Msg) {
			if got.Add(1) == int64(n) {
				close(done)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		_ = s.SetPendingLimits(-1, -1)
		if err := sub.Flush(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for range n {
			if err := pub.Publish(subj, data); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatalf("connection rate: %d of %d messages in a minute", got.Load(), n)
		}
		best = max(best, float64(n*size)/time.Since(start).Seconds())
		_ = s.Unsubscribe()
	}
	return best
}

func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(data))[0]
}

func maxOf(x []float64) float64 {
	if len(x) == 0 {
		return math.NaN()
	}
	return slices.Max(x)
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s: want a positive integer, got %q", name, s)
	}
	return n
}

func envFloat(t *testing.T, name string, def float64) float64 {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0) {
		t.Fatalf("%s: want a positive number, got %q", name, s)
	}
	return f
}

// TestLiveShaped checks the stretch of a workload to live measurements: the slowest rank of each
// row scales with period, the distances from it with burst; a job without reports is unchanged.
func TestLiveShaped(t *testing.T) {
	t.Parallel()
	wl := &sim.Workload{Jobs: []sim.JobSpec{
		{ID: "a", Params: 1, StepTimes: [][]float64{{0.100, 0.090}, {0.100, 0.080}, {0.100, 0.090}}},
		{ID: "b", Params: 1, StepTimes: [][]float64{{0.200, 0.100}}},
	}}
	// Job a: median slowest 0.1 s and spread 0.01 s; live period 0.2 s and burst 0.03 s (two
	// reports that average to those).
	r := &liveRun{obs: map[string]*jobObs{"a": {n: 2, period: 0.4, burst: 0.06}}}
	got := liveShaped(wl, r)
	want := [][]float64{{0.200, 0.170}, {0.200, 0.140}, {0.200, 0.170}}
	if !slices.EqualFunc(got.Jobs[0].StepTimes, want, func(a, b []float64) bool { return slices.Equal(a, b) }) {
		t.Errorf("job a: got %v, want %v", got.Jobs[0].StepTimes, want)
	}
	if !slices.Equal(got.Jobs[1].StepTimes[0], wl.Jobs[1].StepTimes[0]) {
		t.Errorf("job b (no reports) changed: %v", got.Jobs[1].StepTimes)
	}
	if wl.Jobs[0].StepTimes[0][1] != 0.090 {
		t.Errorf("the input workload was modified: %v", wl.Jobs[0].StepTimes)
	}
}

// TestCompareSignals checks the pairing of live samples with the simulator's tallies: per job
// means, the pooled means (each source's samples weighted alike), the jobs one source missed, and
// the 20% bound both ways.
func TestCompareSignals(t *testing.T) {
	t.Parallel()
	live := map[string][]signalSample{
		"a": {{Wait: 0.010, Ratio: 0.02}, {Wait: 0.030, Ratio: 0.06}}, // mean 0.04
		"b": {{Wait: 0.005, Ratio: 0.01}, {Wait: 0.005, Ratio: 0.01}},
		"c": {{Wait: 0.001, Ratio: 0}},
	}
	rows := []sim.JobRow{
		{ID: "a", SignalTicks: 1, MeanSignal: 0.05, MeanQueueWait: 0.025},
		{ID: "b", SignalTicks: 3, MeanSignal: 0.01, MeanQueueWait: 0.005},
		{ID: "d", SignalTicks: 2, MeanSignal: 0.02, MeanQueueWait: 0.001},
	}
	c := compareSignals(live, rows)
	if c.liveSamples != 5 || c.simSamples != 6 || c.missed != 2 || len(c.rows) != 4 {
		t.Fatalf("samples %d / %d, missed %d, rows %d: want 5 / 6, 2, 4", c.liveSamples, c.simSamples, c.missed, len(c.rows))
	}
	if r := c.rows[0]; r.job != "a" || !near(r.live, 0.04) || !near(r.liveWait, 0.02) || !near(r.sim, 0.05) {
		t.Errorf("job a: %+v", r)
	}
	if !near(c.live, 0.1/5) || !near(c.sim, (0.05+0.03+0.04)/6) || !near(c.liveWait, 0.051/5) {
		t.Errorf("pooled live %.4f sim %.4f live wait %.4f, want 0.0200, 0.0200, 0.0102", c.live, c.sim, c.liveWait)
	}
	if err := c.check(); err != nil {
		t.Errorf("equal pooled means: %v", err)
	}
	for _, x := range []struct {
		sim float64
		ok  bool
	}{{0.0239, true}, {0.0241, false}, {0.0161, true}, {0.0159, false}} {
		c.sim = x.sim
		if err := c.check(); (err == nil) != x.ok {
			t.Errorf("sim %.4f against live 0.02: %v, want within 20%%: %v", x.sim, err, x.ok)
		}
	}
	if err := compareSignals(map[string][]signalSample{"a": {{}}}, rows).check(); err == nil || !strings.Contains(err.Error(), "live queue wait is 0") {
		t.Errorf("live signal 0: %v", err)
	}
	if err := compareSignals(nil, rows).check(); err == nil || !strings.Contains(err.Error(), "no live samples") {
		t.Errorf("no live samples: %v", err)
	}
	c.live, c.sim = 0.00003, 0 // a quiet machine: neither queues
	if err := c.check(); err == nil || !strings.Contains(err.Error(), "inconclusive") {
		t.Errorf("live 0.00003, simulated 0: %v, want inconclusive", err)
	}
	c.live, c.sim = 0.00003, 0.005 // the simulator queues where live does not: a disagreement
	if err := c.check(); err == nil || strings.Contains(err.Error(), "inconclusive") {
		t.Errorf("live 0.00003, simulated 0.005: %v, want not within 20%%", err)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12 }
