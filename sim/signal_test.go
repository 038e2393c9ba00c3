package sim

import (
	"strings"
	"testing"
	"time"
)

// runState runs a simulation and returns its state at the end, for the signals the decider saw.
func runState(t *testing.T, c Config, wl *Workload, cores int) *state {
	t.Helper()
	s, err := newState(c, onePool(cores), wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.run()
	return s
}

// The live queue wait is what the runtime measures (runtime/shard.go): per shard, the time each
// gradient waited for a core from when the runtime took it, summed over the ranks, averaged over
// steps (weight 0.3 for the newest). A shard takes its next gradient only once the previous one is
// summed, so a gradient waits for a core only behind other shards' work. Three 1 MB shards, two
// ranks, one 1-core runtime at 2 GB/s, no NIC limit: a shard's sum takes 0.5 ms.
//
// Step 1, both ranks in at 1 s. Rank 0's shards take the core in turn: waits 0, 0.5 and 1 ms,
// summed by 1.0005, 1.001 and 1.0015 s. Rank 1's shard 0 is taken at 1.0005 s and queues behind
// rank 0's shards 1 and 2, to 1.0015 s: 1 ms; its shard 1, taken at 1.001 s, runs after it at
// 1.002 s, and its shard 2, taken at 1.0015 s, at 1.0025 s: 1 ms each. Per shard: 1, 1.5 and
// 2 ms. Step 2: rank 1 comes in 10 ms after rank 0, on an idle core: 0, 0.5 and 1 ms again, so
// per shard 0, 1 and 2 ms. The averages: 1 + 0.3 (0 - 1) = 0.7, 1.5 + 0.3 (1 - 1.5) = 1.35, 2 ms.
func TestSimLiveQueueWait(t *testing.T) {
	t.Parallel()
	wl := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 100, Params: 750_000,
		StepTimes: [][]float64{{1, 1}, {1, 1.01}}}}}
	c := quiet(2500 * time.Millisecond) // step 1 ends at 1.003 s, step 2 at 2.0145 s
	c.NIC, c.ShardBytes = 0, 1_000_000
	s := runState(t, c, wl, 1)
	j := s.jobs[0]
	if j.step != 2 {
		t.Fatalf("%d steps done, want 2", j.step)
	}
	want := []float64{0.0007, 0.00135, 0.002}
	for i, w := range want {
		if !near(j.queueWait[i], w, 1e-9) {
			t.Errorf("shard %d: live queue wait %.6f s, want %.6f", i, j.queueWait[i], w)
		}
	}
	obs := s.observe(c.Duration.Seconds())
	if len(obs.Shards) != 3 {
		t.Fatalf("the decider was told of %d shards, want 3", len(obs.Shards))
	}
	for i, sh := range obs.Shards {
		if !near(sh.QueueWait.Seconds(), want[i], 1e-8) {
			t.Errorf("the decider was told shard %s waited %v, want %.6f s", sh.Key, sh.QueueWait, want[i])
		}
	}
}

// A gradient that waits only for its own shard's previous one waits for no core: one shard, two
// ranks in at once on one core, is told 0 (the simulator used to tell the second rank's 2 ms).
// With two cores and one rank, the third of three shards waits for the first two (0.5 ms).
func TestSimQueueWaitOwnShard(t *testing.T) {
	t.Parallel()
	one := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 100, Params: 1_000_000,
		StepTimes: [][]float64{{1, 1}}}}}
	c := quiet(5 * time.Second)
	c.NIC = 0
	if s := runState(t, c, one, 1); s.jobs[0].step < 3 || s.jobs[0].queueWait[0] != 0 {
		t.Errorf("one shard, after %d steps: queue wait %v s, want 0", s.jobs[0].step, s.jobs[0].queueWait)
	}
	three := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 100, Params: 750_000,
		StepTimes: [][]float64{{1}}}}}
	c.ShardBytes = 1_000_000
	s := runState(t, c, three, 2)
	if got, want := s.jobs[0].queueWait, []float64{0, 0, 0.0005}; !near(got[0], want[0], 1e-9) ||
		!near(got[1], want[1], 1e-9) || !near(got[2], want[2], 1e-9) {
		t.Errorf("three shards on two cores: queue waits %v s, want %v", got, want)
	}
}

// The closed loop's input is tallied per job at every decision tick with a measured period: one
// rank, three 1 MB shards on one core, a step of 1 s of compute and 1.5 ms of sums. Its longest
// shard queue wait is 1 ms at every step, its period 1.0015 s.
func TestSimSignalTallied(t *testing.T) {
	t.Parallel()
	wl := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 100, Params: 750_000,
		StepTimes: [][]float64{{1}}}}}
	c := quiet(20 * time.Second)
	c.NIC, c.ShardBytes = 0, 1_000_000
	r, err := Run(c, onePool(1), wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	row := r.JobRows[0]
	if row.SignalTicks < 10 || row.SignalTicks > 20 {
		t.Errorf("%d ticks sampled in 20 s at 1 s, want those after the second step (10-20)", row.SignalTicks)
	}
	if !near(row.MeanQueueWait, 0.001, 1e-9) || !near(row.MeanSignal, 0.001/1.0015, 1e-6) {
		t.Errorf("mean queue wait %.6f s and signal %.6f, want 0.001 s and %.6f", row.MeanQueueWait, row.MeanSignal, 0.001/1.0015)
	}
	rep := &Report{Options: Options{Config: c, Policy: onePool(1)}, Source: "test", Workload: wl, Base: r}
	if md := string(rep.Markdown()); !strings.Contains(md, " | 1.00 | 0.10% |\n") {
		t.Errorf("the jobs table does not show the queue wait of 1.00 ms and 0.10%% of the period:\n%s", md[strings.Index(md, "## Jobs"):])
	}
}

// A step slowed by the NIC, not by the cores, is slow in hindsight but no gradient waited for a
// core, so the live signal is 0: the setup of TestSimNIC, whose steps take 1.3021 s against an
// ideal of 1.0105 s, on 16 cores that are idle whenever a rank's gradient is in.
func TestSimNICBoundQueueWait(t *testing.T) {
	wl := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 100, Params: 2_500_000,
		StepTimes: [][]float64{{1, 1}}}}}
	c := quiet(time.Minute)
	c.NIC = 100e6
	unit := float64(4<<20) / c.Throughput
	hindsight := (1 + 0.2 + unit + 0.1) - (1 + 2*10e6/c.Throughput)

	s := runState(t, c, wl, 16)
	if s.jobs[0].step < 10 {
		t.Fatalf("%d steps done, want at least 10", s.jobs[0].step)
	}
	for _, sh := range s.observe(c.Duration.Seconds()).Shards {
		if sh.QueueWait != 0 {
			t.Errorf("live: shard %s told a queue wait of %v, want 0 (the delay is in the NIC)", sh.Key, sh.QueueWait)
		}
	}

	c.Signal = SignalHindsight
	s = runState(t, c, wl, 16)
	for _, sh := range s.observe(c.Duration.Seconds()).Shards {
		if !near(sh.QueueWait.Seconds(), hindsight, 1e-6) {
			t.Errorf("hindsight: shard %s told a queue wait of %v, want %.6f s", sh.Key, sh.QueueWait, hindsight)
		}
	}
}

// A signal the simulator does not know is refused by name, and the report says which one fed the
// loop.
func TestSimSignalConfig(t *testing.T) {
	c := quiet(time.Minute)
	c.Signal = "oracle"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `signal must be "live" or "hindsight", got "oracle"`) {
		t.Errorf("signal oracle: error %v", err)
	}
	for sig, want := range map[string]string{
		SignalLive:      "the decider's queue wait: live",
		SignalHindsight: "the decider's queue wait: hindsight (--signal hindsight",
	} {
		c.Signal = sig
		r, err := Run(c, onePool(4), oneStep(0), nil)
		if err != nil {
			t.Fatal(err)
		}
		rep := &Report{Options: Options{Config: c, Policy: onePool(4)}, Source: "test", Workload: oneStep(0), Base: r}
		if got := rep.Counted(); !strings.Contains(got, want) {
			t.Errorf("signal %s: counted %q lacks %q", sig, got, want)
		}
	}
}

// With an apply share, a step's update is done with its last rank's gradients: the same work,
// lumped. TestSimLiveQueueWait's job at ApplyShare 0.5: rank 0's gradients weigh 0.5 (0.25 ms a
// shard), the last rank's 1.5 (0.75 ms). Step 1, both in at 1 s: rank 0's wait 0, 0.25 and 0.5 ms;
// rank 1's start once rank 0's are summed, at 1.00075 s: shard 0 (taken at 1.00025) waits 0.5 ms,
// shard 1 (taken at 1.0005, started at 1.0015) 1 ms, shard 2 (1.00075, 1.00225) 1.5 ms. Per shard
// 0.5, 1.25 and 2 ms. Step 2, rank 1 10 ms after rank 0, on an idle core: 0, 0.25, 0.5 and 0,
// 0.75, 1.5, so 0, 1 and 2 ms. The averages: 0.35, 1.175 and 2 ms; the work is the same.
func TestSimApplyShare(t *testing.T) {
	t.Parallel()
	wl := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 100, Params: 750_000,
		StepTimes: [][]float64{{1, 1}, {1, 1.01}}}}}
	c := quiet(2500 * time.Millisecond)
	c.NIC, c.ShardBytes = 0, 1_000_000
	even := runState(t, c, wl, 1)
	c.ApplyShare = 0.5
	s := runState(t, c, wl, 1)
	j := s.jobs[0]
	if j.step != 2 {
		t.Fatalf("%d steps done, want 2", j.step)
	}
	for i, w := range []float64{0.00035, 0.001175, 0.002} {
		if !near(j.queueWait[i], w, 1e-9) {
			t.Errorf("shard %d: live queue wait %.6f s, want %.6f", i, j.queueWait[i], w)
		}
	}
	if !near(s.res.WorkCoreSeconds, even.res.WorkCoreSeconds, 1e-12) {
		t.Errorf("work %v core-s with the updates lumped, %v without: want the same", s.res.WorkCoreSeconds, even.res.WorkCoreSeconds)
	}
	for _, bad := range []float64{-0.1, 1, 2} {
		c.ApplyShare = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "apply share") {
			t.Errorf("apply share %v: %v, want refused", bad, err)
		}
	}
}
