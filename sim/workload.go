package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/fanin-ml/fanin/autoscaler"
)

// Config is the simulator's model of the world (not the autoscaler's policy).
type Config struct {
	Seed     uint64
	Duration time.Duration // simulated time
	// Rate is job arrivals per minute (Poisson). With Rate 0 and Jobs > 0 the rate is Jobs per
	// Duration.
	Rate float64
	Jobs int // at most this many jobs (0: as many as arrive within Duration)
	// A job runs for a Philly run time, truncated to MaxJob and raised to MinJob (Philly has many
	// jobs of a few seconds, and its tail runs for weeks).
	MaxJob, MinJob time.Duration
	// StepScale is the real time of a normalized PAI batch time of 1000.
	StepScale  time.Duration
	ShardBytes int64 // shard size: a job has ceil(params x 4 / ShardBytes) shards
	// Throughput is the bytes of gradient one runtime core sums per second (one rank's gradient
	// into the sum), everything the runtime process does for them included; 0 takes it from Cost
	// (1 / RuntimeCPUPerByte). The decider is told a shard's Work at this rate.
	Throughput float64
	// Cost is the service's measured CPU per byte (ServiceCost): the broker's, charged to the
	// elastic pool and to the baselines that run on fanin, and the runtimes' (Throughput 0).
	Cost ServiceCost
	// Broker is how the NATS servers are sized: BrokerFixed, a cluster sized at the peak of its
	// demand over the whole run, as deployed; BrokerPool, resized every interval to its demand (a
	// lower bound for a broker that scales with the pool); BrokerInRuntimes, run in the runtimes'
	// processes (`fanin runtime --nats-config`), so charged in the runtimes' rate, which Cost must
	// then have been measured with; or BrokerNone, not counted (the earlier reports' model, for
	// comparison).
	Broker string
	// BrokerNodeCores is the cores of a broker node, which has one NIC of NIC bytes per second
	// each way: with a NIC modelled, the broker needs as many nodes as its bytes fill NICs.
	BrokerNodeCores int
	// KernelWork is a what-if: the decider is told a shard's Work as the time in the aggregation
	// function (Cost.KernelCPUPerByte), not the runtime's whole CPU: what a live runtime sharing its
	// process (fanin dev) reports, with no process overhead to multiply it by.
	KernelWork bool
	// OraclePeriod is how often the oracle resizes its pool (0: Interval, the decider's period);
	// OracleStartup is how long before it needs cores it must ask for them (0: StartupDelay, the
	// pool's start-up; < 0: none, the instant oracle).
	OraclePeriod, OracleStartup time.Duration
	// PSRate is the bytes of gradient one core of a parameter server sums per second (baseline
	// d: a parameter server per job sized to its peak).
	PSRate float64
	// Interval is the control loop's decision period; a job's arrival triggers a decision too.
	Interval       time.Duration
	StartupDelay   time.Duration // from asking for a runtime to its being ready
	MigrationPause time.Duration // a moved shard processes nothing for this long
	// SlowFraction of the runtimes the pool starts run at SlowSpeed (stragglers: interference, a
	// bad node).
	SlowFraction float64
	SlowSpeed    float64
	// NIC is a runtime's network bandwidth in bytes per second, each way (0: unlimited). Gradients
	// come in through it before the cores can sum them; new parameters go out through it.
	NIC float64
	// ApplyShare is the share of a shard's work in a step that its runtime does once, when the
	// step's last gradient is in (the function's update; a slow user function's is most of it);
	// the rest is summing, the same for every gradient. 0: every gradient costs the same. The
	// step's work is the same either way; where it falls decides what waits for a core.
	ApplyShare float64
	// NICWork is a what-if: the decider is told a shard's work as the larger of its cores' time
	// and its share of a runtime's NIC time in cores (bytes / NIC x runtime cores), as a decider
	// that planned the network would see it. The live runtime reports CPU time only.
	NICWork bool
	// Signal is what the decider is told as a shard's QueueWait: SignalLive (or ""), what the live
	// runtime measures (per shard, the time a step's gradients waited for a core from when the
	// runtime took each, in through the NIC and its shard's previous one summed, summed over the
	// ranks, averaged over steps); or SignalHindsight, the step's time beyond its ideal, which no
	// live runtime can measure (the earlier reports' signal, for comparison).
	Signal string
	// RuntimeCores is the cores of a runtime when the policy's cores_per_runtime is 0 (runtimes
	// sized to their machine).
	RuntimeCores int
	// StaticCoresPerWorker sizes baseline a, the per-job reservation: this many cores per worker
	// (rank), rounded up per job, for the job's life.
	StaticCoresPerWorker float64
	// HighFraction and LowFraction of the jobs drawn are of priority high and low (the others
	// normal).
	HighFraction, LowFraction float64
	// Synth, when set, gives every job drawn its own synthesized step times instead of a PAI trace.
	Synth *Synth
}

// Brokers: how the NATS servers are sized (Config.Broker).
const (
	BrokerFixed = "fixed" // a cluster sized at the peak of its demand over the run
	BrokerPool  = "pool"  // resized every interval to its demand
	BrokerNone  = "none"  // not counted
	// BrokerInRuntimes: each runtime runs its node's NATS server in its process; the runtimes'
	// rate counts it.
	BrokerInRuntimes = "in-runtimes"
)

// Signals: what the decider is told as a shard's queue wait (Config.Signal).
const (
	SignalLive      = "live"      // the time the gradients waited for a core, as the runtime measures it
	SignalHindsight = "hindsight" // the step's excess over its ideal
)

// BytePSRate is BytePS's published summation rate, about 6 Gbit/s of gradient per CPU core (Jiang
// et al., OSDI 2020): the bytes of gradient one core of a parameter server receives and sums per
// second, sending the parameters back included.
const BytePSRate = 0.75e9

// throughput is Config.Throughput, or the runtimes' rate from the service cost.
func (c Config) throughput() float64 {
	if c.Throughput > 0 {
		return c.Throughput
	}
	return 1 / c.Cost.RuntimeCPUPerByte
}

// oraclePeriod and oracleStartup are the oracle's, in seconds, defaults applied.
func (c Config) oraclePeriod() float64 {
	if c.OraclePeriod > 0 {
		return c.OraclePeriod.Seconds()
	}
	return c.Interval.Seconds()
}

func (c Config) oracleStartup() float64 {
	switch {
	case c.OracleStartup < 0:
		return 0
	case c.OracleStartup == 0:
		return c.StartupDelay.Seconds()
	}
	return c.OracleStartup.Seconds()
}

// DefaultConfig is the model documented in docs/lab/autoscaling.md, "The simulator".
func DefaultConfig() Config {
	return Config{
		Seed:       1,
		Duration:   time.Hour,
		Rate:       1,
		MaxJob:     20 * time.Minute,
		MinJob:     time.Minute,
		StepScale:  2 * time.Second,
		ShardBytes: 4 << 20,
		Cost:       DefaultServiceCost(),
		Broker:     BrokerFixed,
		// A broker node is a runtime's machine of the default policy: 4 cores and one NIC.
		BrokerNodeCores: 4,
		PSRate:          BytePSRate,
		Interval:        time.Second,
		StartupDelay:    time.Second,
		MigrationPause:  20 * time.Millisecond,
		SlowFraction:    0.1,
		SlowSpeed:       0.4,
		NIC:             25e9 / 8,
		RuntimeCores:    16,
		Signal:          SignalLive,

		StaticCoresPerWorker: 1,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	bad := func(f string, args ...any) { errs = append(errs, fmt.Errorf(f, args...)) }
	if c.Duration <= 0 {
		bad("duration must be > 0, got %v", c.Duration)
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		bad("rate must be >= 0 jobs per minute, got %v", c.Rate)
	}
	if c.Jobs < 0 {
		bad("jobs must be >= 0, got %d", c.Jobs)
	}
	if c.MinJob <= 0 || c.MaxJob < c.MinJob {
		bad("job durations: want 0 < min (%v) <= max (%v)", c.MinJob, c.MaxJob)
	}
	if c.StepScale <= 0 {
		bad("step scale must be > 0, got %v", c.StepScale)
	}
	if c.ShardBytes < 1024 {
		bad("shard bytes must be >= 1024, got %d", c.ShardBytes)
	}
	if !(c.Throughput >= 0) || math.IsInf(c.Throughput, 0) {
		bad("throughput must be > 0 bytes/s per core (0: from the service cost), got %v", c.Throughput)
	}
	if err := c.Cost.Validate(); err != nil {
		errs = append(errs, err)
	}
	if !(c.ApplyShare >= 0 && c.ApplyShare < 1) {
		bad("apply share must be in [0, 1), got %v", c.ApplyShare)
	}
	if c.Throughput == 0 && !(c.Cost.RuntimeCPUPerByte > 0) {
		bad("throughput: neither given nor in the service cost (runtime_cpu_s_per_byte is 0)")
	}
	if c.KernelWork && !(c.Cost.KernelCPUPerByte > 0) {
		bad("kernel work: the service cost has no kernel_cpu_s_per_byte")
	}
	if c.Broker != BrokerFixed && c.Broker != BrokerPool && c.Broker != BrokerNone && c.Broker != BrokerInRuntimes {
		bad("broker must be %q, %q, %q or %q, got %q", BrokerFixed, BrokerPool, BrokerInRuntimes, BrokerNone, c.Broker)
	}
	if c.Signal != "" && c.Signal != SignalLive && c.Signal != SignalHindsight {
		bad("signal must be %q or %q, got %q", SignalLive, SignalHindsight, c.Signal)
	}
	if c.BrokerNodeCores < 1 {
		bad("broker node cores must be >= 1, got %d", c.BrokerNodeCores)
	}
	if c.OraclePeriod < 0 {
		bad("oracle period must be >= 0 (0: the decision interval), got %v", c.OraclePeriod)
	}
	if !(c.PSRate > 0) || math.IsInf(c.PSRate, 0) {
		bad("parameter server rate must be > 0 bytes/s per core, got %v", c.PSRate)
	}
	if c.Interval <= 0 {
		bad("decision interval must be > 0, got %v", c.Interval)
	}
	if c.StartupDelay < 0 || c.MigrationPause < 0 {
		bad("startup delay and migration pause must be >= 0")
	}
	if !(c.SlowFraction >= 0 && c.SlowFraction <= 1) {
		bad("slow fraction must be in [0, 1], got %v", c.SlowFraction)
	}
	if !(c.SlowSpeed > 0 && c.SlowSpeed <= 1) {
		bad("slow speed must be in (0, 1], got %v", c.SlowSpeed)
	}
	if !(c.NIC >= 0) || math.IsInf(c.NIC, 0) {
		bad("NIC bandwidth must be >= 0 (0: unlimited), got %v", c.NIC)
	}
	if c.RuntimeCores < 1 {
		bad("runtime cores must be >= 1, got %d", c.RuntimeCores)
	}
	if !(c.StaticCoresPerWorker > 0) || math.IsInf(c.StaticCoresPerWorker, 0) {
		bad("static cores per worker must be > 0, got %v", c.StaticCoresPerWorker)
	}
	if !(c.HighFraction >= 0 && c.LowFraction >= 0 && c.HighFraction+c.LowFraction <= 1) {
		bad("priority fractions: want high (%v) and low (%v) >= 0 with a sum <= 1", c.HighFraction, c.LowFraction)
	}
	if c.Synth != nil {
		if err := c.Synth.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// LargeModel is the size (parameters) from which a model counts as large in the report's classes.
const LargeModel = 50_000_000

// Model is a well-known model and its parameter count.
type Model struct {
	Name   string
	Params int64
}

// Models are drawn from uniformly.
var Models = []Model{
	{"mobilenet-v2", 3_500_000},
	{"resnet-18", 11_700_000},
	{"inception-v3", 23_800_000},
	{"resnet-50", 25_600_000},
	{"bert-base", 110_000_000},
	{"vgg-16", 138_000_000},
}

// Workload is a list of training jobs. As a file it is JSON:
//
//	{"jobs": [
//	  {"id": "j001", "arrival_s": 12.5, "duration_s": 600, "model": "resnet-50", "params": 25600000,
//	   "trace": "pai-1", "offset": 17, "priority": "low"},
//	  {"id": "mine", "arrival_s": 0, "duration_s": 60, "params": 1000000,
//	   "step_times_s": [[0.50, 0.52, 0.61], [0.49, 0.55, 0.70]]}
//	]}
//
// A job's iteration times come either from a PAI trace of the trace directory (trace "pai-1" for
// pai-minibatch-job_1_norm.csv, or another file's name without .csv: see Traces), starting at
// iteration offset, scaled by the config's StepScale, or from step_times_s: seconds of compute per
// rank, one row per iteration. Either way they are cycled, from iteration offset, for the job's
// fixed number of steps: as many as duration_s holds at their ideal step times. The number of
// ranks is the number of workers of a row. priority is "high", "normal" (the default) or "low".
type Workload struct {
	Jobs []JobSpec `json:"jobs"`
}

// JobSpec is one job of a workload.
type JobSpec struct {
	ID        string      `json:"id"`
	Arrival   float64     `json:"arrival_s"`  // seconds after the start of the simulation
	Duration  float64     `json:"duration_s"` // seconds it trains for
	Model     string      `json:"model,omitempty"`
	Params    int64       `json:"params"` // float32 parameters
	Trace     string      `json:"trace,omitempty"`
	Offset    int         `json:"offset,omitempty"`
	StepTimes [][]float64 `json:"step_times_s,omitempty"`
	// Priority is the job's class: "high", "normal" (also "") or "low"; the decider sees it as
	// ShardObs.Priority and the runtimes serve higher classes first.
	Priority string `json:"priority,omitempty"`
}

// priorityOf maps a JobSpec.Priority to autoscaler.PriorityHigh/Normal/Low.
func priorityOf(p string) (int, error) {
	switch p {
	case "high":
		return autoscaler.PriorityHigh, nil
	case "", "normal":
		return autoscaler.PriorityNormal, nil
	case "low":
		return autoscaler.PriorityLow, nil
	}
	return 0, fmt.Errorf("priority must be high, normal or low, got %q", p)
}

func priorityName(p int) string {
	switch p {
	case autoscaler.PriorityHigh:
		return "high"
	case autoscaler.PriorityLow:
		return "low"
	}
	return "normal"
}

// Generate draws a workload from the traces: Poisson arrivals, Philly run times, a PAI trace per
// job (at a random iteration offset) and a model drawn from Models.
func Generate(c Config, tr *Traces) (*Workload, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rate := c.Rate / 60 // per second
	if c.Rate == 0 {
		if c.Jobs == 0 {
			return nil, errors.New("workload: rate and jobs are both 0")
		}
		rate = float64(c.Jobs) / c.Duration.Seconds()
	}
	if (len(tr.PAI) == 0 && c.Synth == nil) || len(tr.Philly) == 0 {
		return nil, fmt.Errorf("%w: drawing a workload needs a PAI mini-batch trace and run times, read %v", ErrNoTraces, tr.Files)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x776f726b6c6f6164)) // "workload"
	names := tr.PAINames()
	wl := &Workload{}
	t := 0.0
	for c.Jobs == 0 || len(wl.Jobs) < c.Jobs {
		t += rng.ExpFloat64() / rate
		if t >= c.Duration.Seconds() {
			break
		}
		d := tr.Philly[rng.IntN(len(tr.Philly))]
		d = min(max(d, c.MinJob.Seconds()), c.MaxJob.Seconds())
		m := Models[rng.IntN(len(Models))]
		js := JobSpec{
			ID:       fmt.Sprintf("j%03d", len(wl.Jobs)+1),
			Arrival:  math.Round(t*1000) / 1000,
			Duration: d,
			Model:    m.Name,
			Params:   m.Params,
		}
		if c.Synth != nil {
			js.StepTimes = c.Synth.Generate(c.Seed, len(wl.Jobs))
		} else {
			js.Trace = names[rng.IntN(len(names))]
			js.Offset = rng.IntN(len(tr.PAI[js.Trace]))
		}
		if c.HighFraction+c.LowFraction > 0 { // drawn only then, so that other workloads stay the same
			switch x := rng.Float64(); {
			case x < c.HighFraction:
				js.Priority = "high"
			case x < c.HighFraction+c.LowFraction:
				js.Priority = "low"
			}
		}
		wl.Jobs = append(wl.Jobs, js)
	}
	return wl, nil
}

// ReadWorkload reads a workload file (JSON, see Workload), rejecting unknown fields.
func ReadWorkload(path string) (*Workload, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var wl Workload
	if err := dec.Decode(&wl); err != nil {
		return nil, fmt.Errorf("workload %s: %w", path, err)
	}
	return &wl, nil
}

// check validates a workload against the traces it refers to (tr may be nil if none does).
func (wl *Workload) check(tr *Traces) error {
	seen := map[string]bool{}
	for i, j := range wl.Jobs {
		where := fmt.Sprintf("workload job %d (%s)", i, j.ID)
		switch {
		case j.ID == "" || seen[j.ID]:
			return fmt.Errorf("%s: ids must be non-empty and unique", where)
		case j.Arrival < 0 || j.Duration <= 0:
			return fmt.Errorf("%s: want arrival_s >= 0 and duration_s > 0", where)
		case j.Params <= 0:
			return fmt.Errorf("%s: params must be > 0", where)
		case j.Offset < 0:
			return fmt.Errorf("%s: offset must be >= 0", where)
		case j.Priority != "" && j.Priority != "high" && j.Priority != "normal" && j.Priority != "low":
			return fmt.Errorf("%s: priority must be high, normal or low, got %q", where, j.Priority)
		case len(j.StepTimes) == 0 && j.Trace == "":
			return fmt.Errorf("%s: needs a trace or step_times_s", where)
		case len(j.StepTimes) == 0 && (tr == nil || tr.PAI[j.Trace] == nil):
			var known []string
			if tr != nil {
				known = tr.PAINames()
			}
			return fmt.Errorf("%s: unknown trace %q (the traces read: %s)", where, j.Trace, strings.Join(known, ", "))
		}
		for _, row := range j.StepTimes {
			if len(row) == 0 || len(row) != len(j.StepTimes[0]) {
				return fmt.Errorf("%s: every row of step_times_s needs the same number (> 0) of ranks", where)
			}
			for _, x := range row {
				if !(x > 0) {
					return fmt.Errorf("%s: step times must be > 0", where)
				}
			}
		}
		seen[j.ID] = true
	}
	return nil
}

// needsTraces says whether some job refers to a PAI trace.
func (wl *Workload) needsTraces() bool {
	for _, j := range wl.Jobs {
		if len(j.StepTimes) == 0 {
			return true
		}
	}
	return false
}

// MarshalIndent renders the workload as the JSON ReadWorkload reads.
func (wl *Workload) MarshalIndent() []byte {
	var b bytes.Buffer
	b.WriteString("{\"jobs\": [\n")
	for i, j := range wl.Jobs {
		line, _ := json.Marshal(j)
		b.WriteString("  ")
		b.Write(line)
		if i < len(wl.Jobs)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("]}\n")
	return b.Bytes()
}
