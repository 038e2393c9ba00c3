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

// The live queue wait is what the runtime measures: the time a step's gradients waited, once in,
// for a core, summed over the ranks, averaged over steps (weight 0.3 for the newest). Two ranks of
// 4 MB (one shard) on one 1-core runtime at 2 GB/s, no NIC limit: each rank's sum takes 2 ms.
// Step 1: both ranks are in at 1 s, the second waits the first's 2 ms. Step 2: the second rank is
// in 1 ms after the first and waits the 1 ms left. The average: 2 + 0.3 x (1 - 2) = 1.7 ms.
func TestSimLiveQueueWait(t *testing.T) {
	wl := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 100, Params: 1_000_000,
		StepTimes: [][]float64{{1, 1}, {1, 1.001}}}}}
	c := quiet(2500 * time.Millisecond) // step 1 ends at 1.004 s, step 2 at 2.008 s
	c.NIC = 0
	s := runState(t, c, wl, 1)
	j := s.jobs[0]
	if j.step != 2 {
		t.Fatalf("%d steps done, want 2", j.step)
	}
	if want := 0.002 + 0.3*(0.001-0.002); !near(j.queueWait, want, 1e-9) {
		t.Errorf("live queue wait %.6f s, want %.6f", j.queueWait, want)
	}
	obs := s.observe(c.Duration.Seconds())
	if len(obs.Shards) != 1 || !near(obs.Shards[0].QueueWait.Seconds(), 0.0017, 1e-8) {
		t.Errorf("the decider was told %+v, want one shard with a queue wait of 1.7 ms", obs.Shards)
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

// The closed loop's input is tallied per job at every decision tick with a measured period: two
// ranks of one 4 MB shard in at once on one core at 2 GB/s, a step of 1 s of compute and 4 ms of
// sums. The second rank waits 2 ms at every step; the period is 1.004 s.
func TestSimSignalTallied(t *testing.T) {
	t.Parallel()
	wl := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 100, Params: 1_000_000,
		StepTimes: [][]float64{{1, 1}}}}}
	c := quiet(20 * time.Second)
	c.NIC = 0
	r, err := Run(c, onePool(1), wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	row := r.JobRows[0]
	if row.SignalTicks < 10 || row.SignalTicks > 20 {
		t.Errorf("%d ticks sampled in 20 s at 1 s, want those after the second step (10-20)", row.SignalTicks)
	}
	if !near(row.MeanQueueWait, 0.002, 1e-9) || !near(row.MeanSignal, 0.002/1.004, 1e-6) {
		t.Errorf("mean queue wait %.6f s and signal %.6f, want 0.002 s and %.6f", row.MeanQueueWait, row.MeanSignal, 0.002/1.004)
	}
}
