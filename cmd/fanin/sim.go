package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/sim"
)

func simCmd() *cobra.Command {
	c := sim.DefaultConfig()
	var traces, policyFile, sweep, out, workload, saveWorkload, shardSize, synth, costFile string
	nicGbit := c.NIC * 8 / 1e9
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Replay a training workload against the autoscaler's decider in simulated time",
		Long: `sim draws a multi-job workload from the shared cluster traces (Poisson arrivals, Philly run
times, PAI per-worker iteration times, well-known model sizes) or reads one from a file, replays it
against the autoscaler's Decider in simulated time, and writes a markdown report with the cost of
the whole service (runtimes and NATS broker, from the CPU per byte fanin bench measured: --cost)
against per-job parameter servers, static provisioning and a realistic oracle, per GB of gradient
summed in completed steps, and the step slowdown; and SVG plots: the pool against the load over
time, and with --sweep the cost/slowdown frontier of one policy knob.
The same inputs and seed give the same bytes.`,
		Example: `  fanin sim                                              # 1h, 1 job/min, default policy -> fanin-sim/
  fanin sim --duration 2h --seed 7 --sweep target_utilization=0.5,0.6,0.7,0.8,0.9,1
  fanin sim --policy policy.yaml --workload jobs.json --out /tmp/sim`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			if f.Changed("jobs") && !f.Changed("rate") {
				c.Rate = 0 // --jobs alone: that many jobs over the run
			}
			if shardSize != "" {
				n, err := job.ParseByteSize(shardSize)
				if err != nil {
					return fmt.Errorf("--shard-size: %w", err)
				}
				c.ShardBytes = int64(n)
			}
			c.NIC = nicGbit * 1e9 / 8
			if costFile != "" {
				sc, err := sim.ReadServiceCost(costFile)
				if err != nil {
					return fmt.Errorf("--cost: %w", err)
				}
				c.Cost = sc
			}
			if synth != "" {
				if workload != "" {
					return errors.New("--synth and --workload: choose one (a saved synthesized workload is a workload file)")
				}
				s, err := sim.ParseSynth(synth)
				if err != nil {
					return fmt.Errorf("--synth: %w", err)
				}
				c.Synth = s
			}
			if err := c.Validate(); err != nil {
				return fmt.Errorf("sim: %w", err)
			}
			pol := autoscaler.DefaultPolicy()
			if policyFile != "" {
				data, err := os.ReadFile(policyFile)
				if err != nil {
					return fmt.Errorf("--policy: %w", err)
				}
				if pol, err = autoscaler.ParsePolicy(data); err != nil {
					return fmt.Errorf("--policy %s: %w", policyFile, err)
				}
			}
			opts := sim.Options{Config: c, Policy: pol, TracesDir: traces, WorkloadFile: workload}
			if !f.Changed("traces") {
				opts.TracesDir = defaultTracesDir()
			}
			if sweep != "" {
				knob, values, ok := strings.Cut(sweep, "=")
				if !ok || knob == "" || values == "" {
					return fmt.Errorf("--sweep: want knob=a,b,c, got %q (knobs: %s)", sweep, strings.Join(autoscaler.KnobNames(), ", "))
				}
				opts.SweepKnob = strings.TrimSpace(knob)
				for _, v := range strings.Split(values, ",") {
					opts.SweepValues = append(opts.SweepValues, strings.TrimSpace(v))
				}
			}
			rep, err := sim.Simulate(opts)
			if errors.Is(err, sim.ErrNoTraces) {
				return fmt.Errorf("%w (set --traces to the directory of the trace files)", err)
			}
			if err != nil {
				return err
			}
			if err := rep.WriteFiles(out); err != nil {
				return err
			}
			if saveWorkload != "" {
				if err := os.WriteFile(saveWorkload, rep.Workload.MarshalIndent(), 0o644); err != nil {
					return fmt.Errorf("--save-workload: %w", err)
				}
			}
			w := cmd.OutOrStdout()
			r := rep.Base
			fmt.Fprintf(w, "%d jobs, %d of %d steps: %.0f core-s (runtimes %.0f + broker %.0f), per GB %.2fx oracle, %.1f%% saved vs per-job PS, %.1f%% vs 1 core/worker; "+
				"mean step slowdown %.2f%% (p99 %.2f%%), stretch p99 %.4f; %d migrations\n",
				r.Jobs, r.Steps, r.IdealSteps, r.Total(), r.ElasticCoreSeconds, r.Broker.CoreSeconds, r.OracleRatio(), 100*r.SavedVsPS(), 100*r.Saved(),
				100*r.Slowdown.Mean, 100*r.Slowdown.P99, r.Stretch.P99, r.Migrations)
			if rep.Sweep != nil {
				for _, pt := range rep.Sweep.Points {
					x := pt.Result
					fmt.Fprintf(w, "  %s=%-8s oracle %.2fx  saved vs PS %5.1f%%  steps %d  slowdown %5.2f%%  p99 %6.2f%%  migrations %d\n", rep.Sweep.Knob, pt.Value,
						x.OracleRatio(), 100*x.SavedVsPS(), x.Steps, 100*x.Slowdown.Mean, 100*x.Slowdown.P99, x.Migrations)
				}
			}
			fmt.Fprintf(w, "wrote %s\n", filepath.Join(out, "report.md"))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&traces, "traces", "../shared/traces", "directory of the traces: every *.csv file in it, PAI mini-batch traces and run times (default: ../shared/traces from the repository root)")
	f.StringVar(&workload, "workload", "", "read the workload from this JSON file instead of drawing it from the traces")
	f.StringVar(&saveWorkload, "save-workload", "", "also write the workload simulated to this JSON file (readable by --workload)")
	f.StringVar(&policyFile, "policy", "", "autoscaler policy (YAML or JSON; absent knobs take the defaults)")
	f.StringVar(&sweep, "sweep", "", "one more simulation per value of a policy knob: knob=a,b,c")
	f.StringVar(&out, "out", "fanin-sim", "directory for report.md, pool.svg and frontier.svg")
	f.Uint64Var(&c.Seed, "seed", c.Seed, "random seed of the workload and of which runtimes are slow")
	f.DurationVar(&c.Duration, "duration", c.Duration, "simulated time")
	f.Float64Var(&c.Rate, "rate", c.Rate, "job arrivals per minute (Poisson)")
	f.IntVar(&c.Jobs, "jobs", c.Jobs, "at most this many jobs; alone (without --rate), this many jobs over the run")
	f.DurationVar(&c.MaxJob, "max-job", c.MaxJob, "truncate Philly run times to this")
	f.DurationVar(&c.MinJob, "min-job", c.MinJob, "raise Philly run times to at least this")
	f.DurationVar(&c.StepScale, "step-scale", c.StepScale, "real time of a normalized PAI batch time of 1000")
	f.StringVar(&shardSize, "shard-size", "4MiB", "shard size")
	f.Float64Var(&c.Throughput, "throughput", c.Throughput, "bytes of gradient one runtime core sums per second (default: from the service cost, the runtime process's measured rate)")
	f.StringVar(&costFile, "cost", "", "service cost file (JSON, as fanin bench --only service-cost writes it): the broker's CPU per byte and the runtimes' (default: the measurement committed with fanin)")
	f.StringVar(&c.Broker, "broker", c.Broker, "how the NATS broker is sized: fixed (at its peak over the run, as deployed), pool (resized every interval to its demand: a lower bound), in-runtimes (run in the runtimes' processes, fanin runtime --nats-config: counted in their rate; use a --cost measured so, e.g. sim/service-cost-embedded.json) or none (not counted: the earlier reports' model)")
	f.IntVar(&c.BrokerNodeCores, "broker-node-cores", c.BrokerNodeCores, "cores of a broker node, which has one NIC of --nic")
	f.BoolVar(&c.KernelWork, "kernel-work", false, "what-if: the decider sees a shard's work as the aggregation function's time (as a runtime inside another process reports it), not the runtime's whole CPU")
	f.DurationVar(&c.OraclePeriod, "oracle-period", 0, "how often the oracle resizes its pool (default: --interval)")
	f.DurationVar(&c.OracleStartup, "oracle-startup", 0, "how far ahead the oracle asks for cores (default: --startup; negative, e.g. -1s: none)")
	f.Float64Var(&c.PSRate, "ps-rate", c.PSRate, "baseline d: bytes of gradient one parameter-server core sums per second (BytePS's published rate)")
	f.DurationVar(&c.Interval, "interval", c.Interval, "decision interval")
	f.DurationVar(&c.StartupDelay, "startup", c.StartupDelay, "time for a new runtime to become ready")
	f.DurationVar(&c.MigrationPause, "migration-pause", c.MigrationPause, "pause of a shard when it moves")
	f.Float64Var(&c.SlowFraction, "slow-fraction", c.SlowFraction, "fraction of runtimes that are stragglers")
	f.Float64Var(&c.SlowSpeed, "slow-speed", c.SlowSpeed, "speed of a straggler runtime (1 = normal)")
	f.Float64Var(&nicGbit, "nic", nicGbit, "a runtime's NIC bandwidth each way, Gbit/s (0: unlimited)")
	f.StringVar(&c.Signal, "signal", c.Signal, "what the decider is told as a shard's queue wait: live (the time its gradients waited for a core, as the runtime measures it) or hindsight (the step's time beyond its ideal, not measurable live)")
	f.Float64Var(&c.ApplyShare, "apply-share", 0, "share of a shard's step work in its update, done when the step's last gradient is in (the runtimes' load reports give it: apply over work); 0: every gradient costs the same")
	f.BoolVar(&c.NICWork, "nic-work", false, "what-if: the decider sees a shard's work as the larger of its CPU time and its share of a runtime's NIC time, in cores")
	f.IntVar(&c.RuntimeCores, "runtime-cores", c.RuntimeCores, "cores of a runtime when the policy's cores_per_runtime is 0")
	f.Float64Var(&c.StaticCoresPerWorker, "static-cores-per-worker", c.StaticCoresPerWorker, "baseline a: cores each job reserves per worker")
	f.Float64Var(&c.HighFraction, "high-fraction", 0, "fraction of the jobs drawn that are of priority high")
	f.Float64Var(&c.LowFraction, "low-fraction", 0, "fraction of the jobs drawn that are of priority low")
	f.StringVar(&synth, "synth", "", "synthesize each drawn job's step times: spread=0.8,cov=0.6,groups=2,ranks=10,steps=200,step=1.5s (any subset)")
	return cmd
}

// defaultTracesDir is ../shared/traces from the repository root (found by walking up to fanin's
// go.mod), else from the working directory.
func defaultTracesDir() string {
	dir, err := os.Getwd()
	if err != nil {
		return filepath.Join("..", "shared", "traces")
	}
	for d := dir; ; d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(data), "module github.com/fanin-ml/fanin\n") {
			return filepath.Join(d, "..", "shared", "traces")
		}
		if filepath.Dir(d) == d {
			return filepath.Join("..", "shared", "traces")
		}
	}
}
