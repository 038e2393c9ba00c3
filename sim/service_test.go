package sim

import (
	"math"
	"strings"
	"testing"
	"time"
)

// oneStep is a workload of one job of one step: 2 ranks publishing their gradients of 1M float32
// parameters (4 MB each) at arrival + 0.5 s.
func oneStep(arrival float64) *Workload {
	return &Workload{Jobs: []JobSpec{{ID: "a", Arrival: arrival, Duration: 0.1, Params: 1_000_000,
		StepTimes: [][]float64{{0.5, 0.5}}}}}
}

// The broker is charged for the bytes it moves. One step of 2 ranks of 4 MB: in its interval the
// gradients go in (8 MB) and out to the runtime (8 MB), the parameters in (4 MB) and out to both
// ranks (8 MB): 12 MB in and 16 MB out. At 100 ns per byte in and 50 ns out that is 1.2 + 0.8 = 2
// cores for that second; a fixed broker pays 2 cores for the whole minute, one that scales pays 2
// core-seconds. The elastic pool and the baselines on fanin pay for it; without it the totals are
// the runtimes' alone.
func TestSimBrokerCounted(t *testing.T) {
	c := quiet(time.Minute)
	c.NIC = 0
	c.Cost = ServiceCost{BrokerCPUPerByteIn: 100e-9, BrokerCPUPerByteOut: 50e-9, RuntimeCPUPerByte: 0.5e-9}
	run := func(c Config) *Result {
		t.Helper()
		r, err := Run(c, onePool(4), oneStep(0), nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.Steps != 1 || r.IdealSteps != 1 {
			t.Fatalf("%d steps (ideal %d), want 1", r.Steps, r.IdealSteps)
		}
		return r
	}
	r := run(c)
	if b := r.Broker; !near(b.CPUPeak, 2, 1e-9) || b.NICPeak != 0 || !near(b.Peak, 2, 1e-9) || !near(b.CoreSeconds, 2*60, 1e-6) {
		t.Errorf("fixed broker %+v, want a peak of 2 cores paid for 60 s", b)
	}
	if !near(r.IdealBroker.CoreSeconds, 120, 1e-6) {
		t.Errorf("the ideal schedule's broker %+v, want the same 2 cores for 60 s", r.IdealBroker)
	}
	if !near(r.Total(), r.ElasticCoreSeconds+120, 1e-6) || !near(r.OracleTotal(), r.OracleCoreSeconds+120, 1e-6) ||
		!near(r.StaticTotal(), r.StaticCoreSeconds+120, 1e-6) {
		t.Errorf("totals %.1f / %.1f / %.1f leave the broker out (runtimes %.1f / %.1f / %.1f)", r.Total(), r.OracleTotal(), r.StaticTotal(),
			r.ElasticCoreSeconds, r.OracleCoreSeconds, r.StaticCoreSeconds)
	}
	// The costs per GB count it: 8 MB summed.
	if want := (r.ElasticCoreSeconds + 120) / 0.008; !near(r.ElasticPerGB(), want, 1e-6*want) {
		t.Errorf("elastic %.1f core-s per GB, want %.1f", r.ElasticPerGB(), want)
	}
	// The parameter servers and the per-worker reservation have no broker.
	if !near(r.PSPerGB(), r.PSCoreSeconds/0.008, 1e-6) || !near(r.ReservedPerGB(), r.ReservedCoreSeconds/0.008, 1e-6) {
		t.Errorf("baselines a and d per GB %.1f and %.1f, want their cores alone", r.ReservedPerGB(), r.PSPerGB())
	}

	c.Broker = BrokerPool
	if b := run(c).Broker; !near(b.CoreSeconds, 2, 1e-9) {
		t.Errorf("a broker that scales: %+v, want 2 core-seconds", b)
	}
	c.Broker = BrokerNone // the earlier model: the totals are the runtimes'
	if r := run(c); r.Broker != (BrokerCost{}) || r.IdealBroker != (BrokerCost{}) || r.Total() != r.ElasticCoreSeconds {
		t.Errorf("no broker: %+v, %+v", r.Broker, r.IdealBroker)
	}
	c.Broker = BrokerInRuntimes // the runtimes' rate counts the servers in their processes
	if r := run(c); r.Broker != (BrokerCost{}) || r.IdealBroker != (BrokerCost{}) || r.Total() != r.ElasticCoreSeconds {
		t.Errorf("servers in the runtimes: %+v, %+v", r.Broker, r.IdealBroker)
	}

	// With NICs of 1 MB/s on 4-core nodes: the runtime's own NIC takes the gradients in over 8 s,
	// so the parameters leave seconds after them. In the gradients' second 8 MB go in and out: 8
	// nodes' NICs, 32 cores (their CPU needs 1.2); in the parameters' second 4 MB in and 8 out: 32.
	c.Broker, c.NIC, c.BrokerNodeCores = BrokerFixed, 1e6, 4
	if b := run(c).Broker; !near(b.NICPeak, 32, 1e-9) || !near(b.CPUPeak, 1.2, 1e-9) || !near(b.Peak, 32, 1e-9) || !near(b.CoreSeconds, 32*60, 1e-6) {
		t.Errorf("broker with NICs %+v, want 32 cores of nodes for 60 s", b)
	}

	// 2.8 cores are paid as 3.
	c.NIC = 0
	c.Cost.BrokerCPUPerByteOut = 100e-9
	if b := run(c).Broker; !near(b.Peak, 2.8, 1e-9) || !near(b.CoreSeconds, 3*60, 1e-6) {
		t.Errorf("broker %+v, want a peak of 2.8 paid as 3 cores", b)
	}
}

// The runtimes' rate comes from the service cost unless given: a runtime process's whole CPU per
// byte, everything it does included.
func TestSimThroughputFromCost(t *testing.T) {
	c := quiet(time.Minute)
	c.Throughput = 0
	c.Cost = ServiceCost{RuntimeCPUPerByte: 2e-9, KernelCPUPerByte: 0.5e-9}
	r, err := Run(c, onePool(4), oneStep(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	// 2 ranks of 4 MB at 0.5 GB/s per core: 0.016 core-seconds.
	if w := r.JobRows[0].WorkPerStep; !near(w, 0.016, 1e-12) || !near(r.WorkCoreSeconds, 0.016, 1e-12) {
		t.Errorf("work %.6f core-s per step (%.6f in all), want 0.016", w, r.WorkCoreSeconds)
	}
	c.Cost.RuntimeCPUPerByte = 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "runtime_cpu_s_per_byte") {
		t.Errorf("no throughput anywhere: %v", err)
	}
	c.Cost.RuntimeCPUPerByte, c.KernelWork, c.Cost.KernelCPUPerByte = 2e-9, true, 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "kernel") {
		t.Errorf("kernel work without a kernel figure: %v", err)
	}
}

// Baseline d: a parameter server per job, sized to the peak of its gradient arrivals at the
// parameter server's rate: 4 ranks of 102.4 MB over a 0.2 s burst at 0.75 GB/s per core need
// 2.73, so 3 cores, for the job's ideal life, without a broker.
func TestSimPSBaseline(t *testing.T) {
	wl := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 60, Params: 25_600_000,
		StepTimes: [][]float64{{0.8, 0.9, 1.0, 1.0}}}}}
	c := quiet(2 * time.Minute)
	r, err := Run(c, onePool(16), wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	life := r.JobRows[0].IdealDuration
	if want := 3 * life; !near(r.PSCoreSeconds, want, 1e-9) {
		t.Errorf("parameter server %.3f core-s, want 3 cores for %.3f s", r.PSCoreSeconds, life)
	}
	if want := 1 - r.ElasticPerGB()/(3*life/(float64(r.IdealSteps)*4*102.4e6/1e9)); !near(r.SavedVsPS(), want, 1e-9) {
		t.Errorf("saved against d %.4f, want %.4f", r.SavedVsPS(), want)
	}
	c.PSRate = 0.5e9 // 4.1: 5 cores
	if r, _ = Run(c, onePool(16), wl, nil); !near(r.PSCoreSeconds, 5*life, 1e-9) {
		t.Errorf("at 0.5 GB/s per core: %.3f core-s, want 5 cores", r.PSCoreSeconds)
	}
}

// The oracle resizes every oracle period and asks for the cores a period needs the start-up
// ahead. A job busy on 1 core at 2.7 s (within the period [2.5, 3) of 0.5 s periods) costs the
// instant oracle 0.5 core-seconds, 1.5 with a start-up of 1 s ([1.5, 3)), and with the decider's
// 1 s period and the pool's 1 s start-up (the defaults), [1, 3): 2.
func TestSimRealisticOracle(t *testing.T) {
	for _, tc := range []struct {
		period, startup time.Duration
		want            float64
	}{
		{500 * time.Millisecond, -1, 0.5},
		{500 * time.Millisecond, time.Second, 1.5},
		{0, 0, 2},
	} {
		c := quiet(10 * time.Second)
		c.OraclePeriod, c.OracleStartup = tc.period, tc.startup
		r, err := Run(c, onePool(4), oneStep(2.2), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !near(r.OracleCoreSeconds, tc.want, 1e-9) {
			t.Errorf("period %v, start-up %v: oracle %.3f core-s, want %.3f", tc.period, tc.startup, r.OracleCoreSeconds, tc.want)
		}
		sum := 0.0
		for _, x := range r.Oracle {
			sum += x * c.Interval.Seconds()
		}
		if len(r.Oracle) != 10 || !near(sum, r.OracleCoreSeconds, 1e-9) {
			t.Errorf("oracle series %v does not sum to its cost", r.Oracle)
		}
	}
}

// A pool that stalls its jobs cannot look cheap: costs are per GB summed in completed steps. A
// runtime whose NIC takes 1 MB/s completes one step of 8 MB in 20 s, where the ideal schedule
// completes 19: the elastic pool pays for 1 step's GB, the baselines for 19.
func TestSimCostPerCompletedStep(t *testing.T) {
	wl := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 30, Params: 1_000_000,
		StepTimes: [][]float64{{1, 1}}}}}
	c := quiet(20 * time.Second)
	c.NIC = 1e6
	r, err := Run(c, onePool(4), wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The ideal step: 1 s and 8 MB summed on 1 core at 2 GB/s (4 ms): 19 steps end within 20 s.
	if r.IdealSteps != 19 || r.IdealGradientBytes != 19*8e6 || r.Steps != 1 || r.GradientBytes != 8e6 {
		t.Fatalf("steps %d (%.0f B), ideal %d (%.0f B): want 1 and 19 of 8 MB", r.Steps, r.GradientBytes, r.IdealSteps, r.IdealGradientBytes)
	}
	if want := (r.Total() / r.OracleTotal()) * 19; !near(r.OracleRatio(), want, 1e-9*want) {
		t.Errorf("cost per GB %.3fx the oracle's, want the totals' ratio x 19 = %.3f", r.OracleRatio(), want)
	}
	missed := strings.Join(r.Missed(), "; ")
	if !strings.Contains(missed, "the oracle's") || !strings.Contains(missed, "parameter servers") {
		t.Errorf("goals missed: %s", missed)
	}
	// No step completed at all: the cost per GB is infinite, and the goals missed.
	c.Duration = 5 * time.Second
	if r, err = Run(c, onePool(4), wl, nil); err != nil {
		t.Fatal(err)
	}
	if r.Steps != 0 || !math.IsInf(r.ElasticPerGB(), 1) || !math.IsInf(r.OracleRatio(), 1) || len(r.Missed()) < 2 {
		t.Errorf("no step: %d steps, %.3f per GB, %.3fx the oracle, missed %v", r.Steps, r.ElasticPerGB(), r.OracleRatio(), r.Missed())
	}
}

// The report says what it counts, and its goal check is per GB against the realistic oracle and
// the parameter servers.
func TestSimReportCounted(t *testing.T) {
	c := quiet(time.Minute)
	c.Cost = ServiceCost{Date: "2026-11-26 18:00 UTC", Machine: "m", Commit: "abc", BrokerCPUPerByteIn: 1e-9, BrokerCPUPerByteOut: 1e-9, RuntimeCPUPerByte: 2e-9}
	c.Throughput = 0
	r, err := Run(c, onePool(4), oneStep(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	rep := &Report{Options: Options{Config: c, Policy: onePool(4)}, Source: "test", Workload: oneStep(0), Base: r}
	md := string(rep.Markdown())
	for _, want := range []string{
		"counted: the runtimes at 0.5 GB/s of gradient per core-second (the runtime process's measured rate",
		"the NATS broker at 1 ns of CPU per byte in and 1 ns per byte out, and its NICs (25 Gbit/s each way per 4-core node)",
		"a fixed cluster sized at its peak", "measured 2026-11-26 18:00 UTC on m at abc", "Not counted:",
		"cost per GB <= 1.30x the realistic oracle's (c), >= 60.0% saved against per-job parameter servers (d)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	rep.Options.Config.Broker = BrokerNone
	if md := string(rep.Markdown()); !strings.Contains(md, "the NATS broker is NOT counted (--broker none)") {
		t.Errorf("a report without the broker does not say so")
	}
	rep.Options.Config.Broker = BrokerInRuntimes
	if md := string(rep.Markdown()); !strings.Contains(md, "the NATS servers in the runtimes' processes (--broker in-runtimes), their CPU in the runtimes' rate") ||
		!strings.Contains(md, "here the servers run in the runtimes' processes") {
		t.Errorf("a report with the servers in the runtimes does not say so")
	}
}
