package sim

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/autoscaler"
)

// onePool is a policy of exactly one runtime of cores cores.
func onePool(cores int) autoscaler.Policy {
	p := autoscaler.DefaultPolicy()
	p.MinRuntimes, p.MaxRuntimes, p.CoresPerRuntime = 1, 1, cores
	return p
}

// quiet is the default model without slow runtimes, and the round 2 GB/s per core the tests
// compute with (not the measured default).
func quiet(d time.Duration) Config {
	c := DefaultConfig()
	c.Duration, c.SlowFraction, c.Throughput = d, 0, 2e9
	return c
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// The NIC takes the gradients in before the cores sum them, and the parameters go back out
// through it: one job of 2 ranks and 10 MB of parameters on one 16-core runtime with a 100 MB/s
// NIC: both ranks' 10 MB come in within 0.2 s of their gradients (at 1 s), the last shard is then
// summed (2 ms) and the 10 MB of parameters leave in 0.1 s: a step of 1.3021 s against an ideal of
// 1.0105 s (the 20 MB summed by its static cores).
func TestSimNIC(t *testing.T) {
	wl := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 100, Params: 2_500_000,
		StepTimes: [][]float64{{1, 1}}}}}
	c := quiet(time.Minute)
	c.NIC = 100e6
	r, err := Run(c, onePool(16), wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	j := r.JobRows[0]
	unit := float64(4<<20) / c.Throughput
	want := 1 + 0.2 + unit + 0.1
	if !near(j.MeanPeriod, want, 1e-6) {
		t.Errorf("step %.6f s with a 100 MB/s NIC, want %.6f", j.MeanPeriod, want)
	}
	// Ideal: 2 ranks x 10 MB on the job's static cores (ceil(0.01 core-s / 0.05 s burst floor) = 1).
	ideal := 1 + 2*10e6/c.Throughput
	if j.StaticCores != 1 || !near(j.IdealDuration/float64(j.TotalSteps), ideal, 1e-9) {
		t.Errorf("static cores %d, ideal step %.6f, want 1 and %.6f", j.StaticCores, j.IdealDuration/float64(j.TotalSteps), ideal)
	}
	if !near(r.Slowdown.Mean, want/ideal-1, 1e-6) {
		t.Errorf("slowdown %.6f, want %.6f", r.Slowdown.Mean, want/ideal-1)
	}

	c.NIC = 0 // unlimited: the cores alone: the second rank's 10 MB starts after the first's (at 16
	// cores) and takes at least a shard's unit on one core
	r, err = Run(c, onePool(16), wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, want := r.JobRows[0].MeanPeriod, 1+10e6/c.Throughput/16+unit; !near(p, want, 1e-6) {
		t.Errorf("step %.6f s with no NIC limit, want %.6f", p, want)
	}
}

// A job runs a fixed number of steps (its run time at its ideal step time), so a slower pool
// stretches it instead of cutting its steps; the static baselines pay for its ideal life.
func TestSimJobsRunAFixedAmountOfWork(t *testing.T) {
	wl := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 30, Params: 2_500_000,
		StepTimes: [][]float64{{1, 1}}}}}
	run := func(nic float64) JobRow {
		t.Helper()
		c := quiet(2 * time.Minute)
		c.NIC = nic
		r, err := Run(c, onePool(16), wl, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Baseline a: 2 workers, 1 core each, for the ideal life; b: 1 core.
		if want := 2 * r.JobRows[0].IdealDuration; !near(r.ReservedCoreSeconds, want, 1e-6) || !near(r.StaticCoreSeconds, want/2, 1e-6) {
			t.Errorf("baselines a %.3f b %.3f core-s, want %.3f and %.3f", r.ReservedCoreSeconds, r.StaticCoreSeconds, want, want/2)
		}
		return r.JobRows[0]
	}
	fast, slow := run(0), run(100e6)
	if fast.TotalSteps != 30 || slow.TotalSteps != 30 || fast.Steps != 30 || slow.Steps != 30 {
		t.Fatalf("steps %d of %d and %d of %d, want 30 of 30 (30 s at 1.01 s)", fast.Steps, fast.TotalSteps, slow.Steps, slow.TotalSteps)
	}
	if !(slow.Lifetime > 1.25*fast.Lifetime) || !near(slow.Stretch, slow.Lifetime/slow.IdealDuration, 1e-9) || slow.Stretch < 1.25 {
		t.Errorf("slow NIC: life %.2f s (fast %.2f s), stretch %.4f", slow.Lifetime, fast.Lifetime, slow.Stretch)
	}
	if fast.Stretch > 1.001 {
		t.Errorf("stretch %.4f on an idle pool", fast.Stretch)
	}
}

// The cores serve higher classes first: work of a class waits only for the work of its class and
// above, and pushes the lower classes back.
func TestServerServesHigherClassesFirst(t *testing.T) {
	v := server{cores: 1, speed: 1, throughput: 1e9}
	_, _, lowDone := v.serve(0, 1e9, 1e6, 1, classIndex(autoscaler.PriorityLow)) // 1 s of low work at 0
	_, _, highDone := v.serve(0.5, 1e9, 1e6, 1, classIndex(autoscaler.PriorityHigh))
	if !near(highDone, 1.5, 1e-9) {
		t.Errorf("high work arriving at 0.5 s behind 1 s of low work done at %.3f, want 1.5 (it preempts)", highDone)
	}
	_, _, normalDone := v.serve(0.5, 1e9, 1e6, 1, classIndex(autoscaler.PriorityNormal))
	if !near(normalDone, 2.5, 1e-9) {
		t.Errorf("normal work done at %.3f, want 2.5 (after the high)", normalDone)
	}
	_, _, low2 := v.serve(0.6, 1e8, 1e6, 1, classIndex(autoscaler.PriorityLow))
	if !near(low2, 3.1, 1e-9) || !near(v.idle(), 3.1, 1e-9) {
		t.Errorf("second low work done at %.3f (idle %.3f), want 3.1: after all of it", low2, v.idle())
	}
	// The first low work was pushed back by the high and normal work: it ends at 3, in the
	// fluid model (its horizon, 1 + 1 + 1).
	if !near(lowDone, 1, 1e-9) {
		t.Errorf("the low work's done at its arrival: %.3f", lowDone)
	}
}

// Two identical jobs on one runtime of one core, each needing most of that core for its bursts (0.34
// core-seconds of work over a 0.4 s burst): the high one is served first and is hardly slowed, the
// low one absorbs the queueing; the report gives both classes.
func TestSimPriorities(t *testing.T) {
	steps := [][]float64{{0.1, 0.2, 0.3, 0.5}}
	wl := &Workload{Jobs: []JobSpec{
		{ID: "hi", Arrival: 0, Duration: 60, Params: 43_000_000, StepTimes: steps, Priority: "high"},
		{ID: "lo", Arrival: 0, Duration: 60, Params: 43_000_000, StepTimes: steps, Priority: "low"},
	}}
	c := quiet(time.Minute)
	c.NIC = 0
	r, err := Run(c, onePool(1), wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]ClassRow{}
	for _, cl := range r.Classes {
		by[cl.Class] = cl
	}
	hi, lo := by["high"], by["low"]
	if hi.Jobs != 1 || lo.Jobs != 1 {
		t.Fatalf("classes %+v", r.Classes)
	}
	if !(hi.Slowdown.Mean < 0.05) || !(lo.Slowdown.Mean > 2*hi.Slowdown.Mean+0.05) {
		t.Errorf("high slowdown %.4f, low %.4f: want the high job served first", hi.Slowdown.Mean, lo.Slowdown.Mean)
	}
	// All normal: the two jobs share the queue alike.
	wl.Jobs[0].Priority, wl.Jobs[1].Priority = "", "normal"
	r, err = Run(c, onePool(1), wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := r.JobRows[0].MeanSlowdown, r.JobRows[1].MeanSlowdown; !(a > 0.05 && b > 0.05) {
		t.Errorf("all normal: slowdowns %.4f and %.4f, want both queued", a, b)
	}
	wl.Jobs[0].Priority = "urgent"
	if _, err := Run(c, onePool(1), wl, nil); err == nil {
		t.Errorf("priority urgent accepted")
	}
}

// The oracle runs every job on its ideal schedule: one job alone needs its static cores while its
// reservation is busy, and none between steps, so it costs less than the static reservation and
// more than the work.
func TestSimOracle(t *testing.T) {
	wl := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 100, Params: 25_600_000,
		StepTimes: [][]float64{{0.8, 0.9, 1.0, 1.0}}}}}
	c := quiet(2 * time.Minute)
	c.Interval = 100 * time.Millisecond
	c.OracleStartup = -1 // the instant oracle: cores paid for only in the periods they are busy
	r, err := Run(c, onePool(16), wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	// 2 static cores, busy from 0.8 s to 1.05 s of each 1.05 s step: with 100 ms intervals, 3 or
	// 4 intervals of 2 cores per step.
	steps := float64(r.JobRows[0].TotalSteps)
	if lo, hi := steps*3*0.2, steps*4*0.2; r.OracleCoreSeconds < lo || r.OracleCoreSeconds > hi {
		t.Errorf("oracle %.1f core-s, want %.1f..%.1f", r.OracleCoreSeconds, lo, hi)
	}
	sum := 0.0
	for _, x := range r.Oracle {
		sum += x * c.Interval.Seconds()
	}
	if len(r.Oracle) != 1200 || !near(sum, r.OracleCoreSeconds, 1e-6) {
		t.Errorf("oracle series of %d intervals summing to %.1f core-s, want 1200 and %.1f", len(r.Oracle), sum, r.OracleCoreSeconds)
	}
	if !(r.OracleCoreSeconds > r.WorkCoreSeconds && r.OracleCoreSeconds < r.StaticCoreSeconds) {
		t.Errorf("oracle %.1f, work %.1f, static %.1f", r.OracleCoreSeconds, r.WorkCoreSeconds, r.StaticCoreSeconds)
	}
}

// Synthesized step times have the spread and CoV asked for, in the groups asked for, and are the
// same for the same seed and job.
func TestSynth(t *testing.T) {
	for _, spec := range []string{"spread=0.05,cov=0.1", "spread=0.8,cov=0.6,groups=2", "spread=0.4,cov=1,groups=3,ranks=9", "spread=0.2,cov=0"} {
		s, err := ParseSynth(spec + ",steps=4000")
		if err != nil {
			t.Fatal(err)
		}
		steps := s.Generate(1, 3)
		spread, cov := MeasureSteps(steps)
		if !near(spread, s.Spread, 0.005) || !near(cov, s.CoV, 0.1*s.CoV+0.005) {
			t.Errorf("%s: spread %.4f, cov %.4f", spec, spread, cov)
		}
		mean := 0.0
		for _, row := range steps {
			mean += row[len(row)-1] / float64(len(steps))
		}
		if !near(mean, 1.5, 0.1*1.5*max(s.CoV, 0.1)) {
			t.Errorf("%s: mean step %.3f s, want 1.5", spec, mean)
		}
		distinct := map[float64]bool{}
		for _, v := range steps[0] {
			distinct[v] = true
		}
		want := s.Ranks
		if s.Groups >= 2 {
			want = s.Groups
		}
		if len(distinct) != want {
			t.Errorf("%s: %d distinct arrival times in a step, want %d", spec, len(distinct), want)
		}
		again := s.Generate(1, 3)
		other := s.Generate(1, 4)
		if again[7][0] != steps[7][0] || other[7][0] == steps[7][0] && s.CoV > 0 {
			t.Errorf("%s: not deterministic in (seed, job)", spec)
		}
	}
	for _, bad := range []string{"spread=1", "cov=-1", "groups=1", "ranks=1", "speed=2", "spread", "steps=3", "step=0s"} {
		if _, err := ParseSynth(bad); err == nil {
			t.Errorf("ParseSynth(%q) accepted", bad)
		}
	}
}

// A synthesized workload is drawn like the others (arrivals, run times, models) with each job's
// step times synthesized.
func TestSimSynthWorkload(t *testing.T) {
	traces(t)
	c := short()
	c.Duration = 5 * time.Minute
	s, err := ParseSynth("spread=0.8,cov=0.6,groups=2")
	if err != nil {
		t.Fatal(err)
	}
	c.Synth = s
	rep := simulate(t, Options{Config: c, Policy: autoscaler.DefaultPolicy(), TracesDir: tracesDir})
	if len(rep.Workload.Jobs) < 5 {
		t.Fatalf("%d jobs", len(rep.Workload.Jobs))
	}
	for _, j := range rep.Workload.Jobs {
		if j.Trace != "" || len(j.StepTimes) != 200 || len(j.StepTimes[0]) != 10 {
			t.Fatalf("job %s: trace %q, %d steps", j.ID, j.Trace, len(j.StepTimes))
		}
	}
	if rep.Base.Steps < 100 {
		t.Errorf("%d steps", rep.Base.Steps)
	}
}

// The --nic-work what-if tells the decider each shard's share of the NIC in cores: on a NIC-bound
// workload the pool grows to carry the bytes, and the jobs are slowed less.
func TestSimNICWork(t *testing.T) {
	var wl Workload
	for i := range 3 {
		wl.Jobs = append(wl.Jobs, JobSpec{ID: fmt.Sprintf("v%d", i), Arrival: float64(i), Duration: 90, Params: 138_000_000,
			StepTimes: [][]float64{{1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.5, 1.5}}})
	}
	c := quiet(2 * time.Minute)
	p := autoscaler.DefaultPolicy()
	p.SlowdownBudget = 0 // the open loop: the closed loop would see the NIC's queueing itself
	blind, err := Run(c, p, &wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.NICWork = true
	aware, err := Run(c, p, &wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !(aware.ElasticCoreSeconds > 1.5*blind.ElasticCoreSeconds) || !(aware.Slowdown.Mean < blind.Slowdown.Mean/2) {
		t.Errorf("NIC-blind: %.0f core-s at %.2f%%; NIC-aware: %.0f core-s at %.2f%%", blind.ElasticCoreSeconds, 100*blind.Slowdown.Mean,
			aware.ElasticCoreSeconds, 100*aware.Slowdown.Mean)
	}
}

// MeasureSteps takes any input: no rows, empty rows and all-zero rows give zeros, not a panic or NaN.
func TestMeasureStepsOfNothing(t *testing.T) {
	for _, steps := range [][][]float64{nil, {{}}, {{0, 0}}, {{}, {0}}} {
		if s, c := MeasureSteps(steps); s != 0 || c != 0 {
			t.Errorf("MeasureSteps(%v) = %v, %v, want 0, 0", steps, s, c)
		}
	}
	if s, c := MeasureSteps([][]float64{{}, {1, 2}, {2, 2}}); s != 0.5 || c != 0 {
		t.Errorf("MeasureSteps with an empty row = %v, %v, want the median spread 0.5 of the others and CoV 0", s, c)
	}
}
