package sim

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fanin-ml/fanin/autoscaler"
)

// The performance goals: a mean step slowdown of at most GoalSlowdown and a p99 of at most
// GoalP99, at a cost per GB summed of at most GoalOracle times the realistic oracle's (baseline
// c), saving at least GoalSavedPS of the per-job parameter servers' (baseline d). Costs count the
// whole service and are per GB of gradient summed in completed steps.
const (
	GoalSlowdown = 0.02
	GoalP99      = 0.10
	GoalOracle   = 1.30
	GoalSavedPS  = 0.60
)

// Options are the inputs of Simulate.
type Options struct {
	Config Config
	Policy autoscaler.Policy
	// TracesDir holds the shared traces; it is needed unless WorkloadFile gives every job its own
	// step times.
	TracesDir    string
	WorkloadFile string // "" draws a workload from the traces (with Config.Synth, synthesized step times)
	// SweepKnob and SweepValues: one more simulation per value, the policy's knob set to it.
	SweepKnob   string
	SweepValues []string
}

// Sweep is one simulation per value of a knob.
type Sweep struct {
	Knob   string
	Points []SweepPoint
}

// SweepPoint is the result for one value.
type SweepPoint struct {
	Value  string
	Result *Result
}

// Report is what Simulate produced; it renders as markdown and SVG.
type Report struct {
	Options  Options
	Source   string // where the workload came from, in words
	Workload *Workload
	Traces   *Traces // the traces read; nil when the workload needs none
	Base     *Result // the policy as given
	Sweep    *Sweep  // nil without a sweep
}

// Simulate builds or reads the workload, runs the policy on it, and the sweep if asked.
func Simulate(o Options) (*Report, error) {
	if err := errors.Join(o.Config.Validate(), o.Policy.Validate()); err != nil {
		return nil, err
	}
	rep := &Report{Options: o}
	var tr *Traces
	var err error
	if o.WorkloadFile != "" {
		if rep.Workload, err = ReadWorkload(o.WorkloadFile); err != nil {
			return nil, err
		}
		rep.Source = "read from " + filepath.Base(o.WorkloadFile)
		if rep.Workload.needsTraces() {
			if tr, err = LoadTraces(o.TracesDir); err != nil {
				return nil, err
			}
		}
	} else {
		if tr, err = LoadTraces(o.TracesDir); err != nil {
			return nil, err
		}
		if rep.Workload, err = Generate(o.Config, tr); err != nil {
			return nil, err
		}
		rep.Source = "drawn from the traces"
		if o.Config.Synth != nil {
			rep.Source = "drawn from the run-time trace, with step times synthesized (" + o.Config.Synth.String() + ")"
		}
	}
	rep.Traces = tr
	if rep.Base, err = Run(o.Config, o.Policy, rep.Workload, tr); err != nil {
		return nil, err
	}
	if o.SweepKnob != "" {
		if len(o.SweepValues) == 0 {
			return nil, fmt.Errorf("sweep %s: no values", o.SweepKnob)
		}
		rep.Sweep = &Sweep{Knob: o.SweepKnob}
		for _, v := range o.SweepValues {
			p := o.Policy
			if err := p.Set(o.SweepKnob, v); err != nil {
				return nil, fmt.Errorf("sweep: %w", err)
			}
			if err := p.Validate(); err != nil {
				return nil, fmt.Errorf("sweep %s=%s: %w", o.SweepKnob, v, err)
			}
			res, err := Run(o.Config, p, rep.Workload, tr)
			if err != nil {
				return nil, err
			}
			rep.Sweep.Points = append(rep.Sweep.Points, SweepPoint{Value: v, Result: res})
		}
	}
	return rep, nil
}

// WriteFiles writes report.md, pool.svg and, with a sweep, frontier.svg into dir (created).
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string][]byte{"report.md": r.Markdown(), "pool.svg": r.PoolSVG()}
	if r.Sweep != nil {
		files["frontier.svg"] = r.FrontierSVG()
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := os.WriteFile(filepath.Join(dir, name), files[name], 0o644); err != nil {
			return err
		}
	}
	return nil
}

// PoolSVG plots the base run.
func (r *Report) PoolSVG() []byte {
	return PoolSVG(r.Base, fmt.Sprintf("Pool against load (seed %d, %d jobs)", r.Options.Config.Seed, r.Base.Jobs))
}

// FrontierSVG plots the sweep (nil without one).
func (r *Report) FrontierSVG() []byte {
	if r.Sweep == nil {
		return nil
	}
	return FrontierSVG(r.Sweep, fmt.Sprintf("Cost against slowdown, sweeping %s", r.Sweep.Knob))
}

func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }
func pct2(x float64) string {
	return fmt.Sprintf("%.2f%%", 100*x)
}

// Missed lists the goals a result misses (none: it meets them all).
func (r *Result) Missed() []string {
	var m []string
	if r.Slowdown.Mean > GoalSlowdown {
		m = append(m, fmt.Sprintf("mean slowdown %s > %s", pct2(r.Slowdown.Mean), pct(GoalSlowdown)))
	}
	if r.Slowdown.P99 > GoalP99 {
		m = append(m, fmt.Sprintf("p99 slowdown %s > %s", pct2(r.Slowdown.P99), pct(GoalP99)))
	}
	if !(r.OracleRatio() <= GoalOracle) {
		m = append(m, fmt.Sprintf("cost per GB %.2fx the oracle's > %.2fx", r.OracleRatio(), GoalOracle))
	}
	if !(r.SavedVsPS() >= GoalSavedPS) {
		m = append(m, fmt.Sprintf("saves %s of per-job parameter servers per GB < %s", pct(r.SavedVsPS()), pct(GoalSavedPS)))
	}
	return m
}

func meetsGoal(r *Result) bool { return len(r.Missed()) == 0 }

// Markdown renders the report.
func (r *Report) Markdown() []byte {
	var b bytes.Buffer
	c, res := r.Options.Config, r.Base
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# fanin sim report\n\n")
	w("%d jobs %s, seed %d, %v simulated. The elastic pool is sized and placed by the autoscaler's own\n", res.Jobs, r.Source, c.Seed, c.Duration)
	w("`Decider` (the policy below).\n\n")
	w("counted: %s\n\n", r.Counted())
	w("Every cost is also given per completed step and per GB of gradient summed in the steps completed\n")
	w("within the run: a pool that slows its jobs completes fewer and pays more per step. The baselines\n")
	w("run every job on its ideal schedule: (a) each job reserving %g core(s) per worker for its life, as\n", c.StaticCoresPerWorker)
	w("parameter-server jobs request; (d) each job a parameter server of its own, sized to the peak of its\n")
	w("gradient arrivals (its typical burst) at %s of gradient received and summed per core-second\n", gbps(c.PSRate))
	w("(BytePS's published rate; sending the parameters back included); neither has a broker. On fanin,\n")
	w("with the broker of the ideal schedules: (b) each job reserving the fewest runtime cores that sum\n")
	w("its burst without queueing (hindsight-tightest static); (c) the realistic oracle: the runtimes\n")
	w("resized every %v to the most cores busy within it, asked for %v ahead.\n\n", secs(c.oraclePeriod()), secs(c.oracleStartup()))

	w("## Result\n\n")
	w("| | core-seconds (runtimes + broker) | mean cores | steps completed | core-s per step | core-s per GB summed | elastic per GB against it |\n")
	w("|---|---:|---:|---:|---:|---:|---:|\n")
	mc := func(x float64) float64 { return x / c.Duration.Seconds() }
	perStep := func(cs float64, steps int) string {
		if steps == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f", cs/float64(steps))
	}
	w("| **elastic pool** | %.0f (%.0f + %.0f) | %.1f | %d | %s | **%.3f** | |\n", res.Total(), res.ElasticCoreSeconds, res.Broker.CoreSeconds, mc(res.Total()),
		res.Steps, perStep(res.Total(), res.Steps), res.ElasticPerGB())
	w("| (a) per-job reservation, %g core(s) per worker | %.0f | %.1f | %d | %s | %.3f | %s (**%s saved**) |\n", c.StaticCoresPerWorker, res.ReservedCoreSeconds, mc(res.ReservedCoreSeconds),
		res.IdealSteps, perStep(res.ReservedCoreSeconds, res.IdealSteps), res.ReservedPerGB(), pct(ratio(res.ElasticPerGB(), res.ReservedPerGB())), pct(res.Saved()))
	w("| (d) per-job parameter server at %s per core, sized to its peak | %.0f | %.1f | %d | %s | %.3f | %s (**%s saved**) |\n", gbps(c.PSRate), res.PSCoreSeconds, mc(res.PSCoreSeconds),
		res.IdealSteps, perStep(res.PSCoreSeconds, res.IdealSteps), res.PSPerGB(), pct(ratio(res.ElasticPerGB(), res.PSPerGB())), pct(res.SavedVsPS()))
	w("| (b) hindsight-tightest static, on fanin | %.0f (%.0f + %.0f) | %.1f | %d | %s | %.3f | %s |\n", res.StaticTotal(), res.StaticCoreSeconds, res.IdealBroker.CoreSeconds, mc(res.StaticTotal()),
		res.IdealSteps, perStep(res.StaticTotal(), res.IdealSteps), res.StaticPerGB(), pct(res.StaticRatio()))
	w("| (c) realistic oracle, on fanin | %.0f (%.0f + %.0f) | %.1f | %d | %s | %.3f | **%.2fx** |\n", res.OracleTotal(), res.OracleCoreSeconds, res.IdealBroker.CoreSeconds, mc(res.OracleTotal()),
		res.IdealSteps, perStep(res.OracleTotal(), res.IdealSteps), res.OraclePerGB(), res.OracleRatio())
	w("| aggregation work done (the runtimes' floor) | %.0f | %.1f | | | | |\n", res.WorkCoreSeconds, mc(res.WorkCoreSeconds))
	if c.NIC > 0 {
		cores := r.Options.Policy.CoresPerRuntime
		if cores == 0 {
			cores = c.RuntimeCores
		}
		nf := res.WorkCoreSeconds * c.throughput() / c.NIC * float64(cores)
		w("| network floor: runtimes whose NICs take the gradients in without a pause | %.0f | %.1f | | | | |\n", nf, mc(nf))
	}
	w("\n")
	w("| | elastic pool |\n|---|---:|\n")
	w("| peak runtime cores (static b's peak) | %.0f (%.0f) |\n", res.PeakCores, peakStatic(res))
	w("| broker: peak cores for its CPU / its NICs; paid for | %.1f / %.1f; %.0f core-s |\n", res.Broker.CPUPeak, res.Broker.NICPeak, res.Broker.CoreSeconds)
	w("| mean step slowdown (not floored) | **%s** (%s) |\n", pct2(res.Slowdown.Mean), pct2(res.RawSlowdown))
	w("| step slowdown p50 / p90 / **p99** / max | %s / %s / **%s** / %s |\n", pct2(res.Slowdown.P50), pct2(res.Slowdown.P90), pct2(res.Slowdown.P99), pct2(res.Slowdown.Max))
	w("| job-time stretch (actual / ideal duration) mean / p99 / max | %.4f / %.4f / %.4f |\n", res.Stretch.Mean, res.Stretch.P99, res.Stretch.Max)
	w("| steps completed (the ideal schedules') | %d (%d) |\n", res.Steps, res.IdealSteps)
	w("| migrations (moves of placed shards) | %d |\n", res.Migrations)
	w("| first placements of shards | %d |\n", res.Placements)
	w("| decisions (in panic) | %d (%d) |\n", res.Decisions, res.PanicDecisions)
	w("| runtimes started (slow ones among them) | %d (%d) |\n\n", res.RuntimesStarted, res.SlowRuntimes)
	w("| class | jobs | steps | mean slowdown (not floored) | p99 slowdown | stretch mean / p99 |\n|---|---:|---:|---:|---:|---:|\n")
	for _, cl := range res.Classes {
		w("| %s | %d | %d | %s (%s) | %s | %.4f / %.4f |\n", cl.Class, cl.Jobs, cl.Slowdown.N, pct2(cl.Slowdown.Mean), pct2(cl.RawSlowdown), pct2(cl.Slowdown.P99), cl.Stretch.Mean, cl.Stretch.P99)
	}
	w("\n")
	goal := "met"
	if m := res.Missed(); len(m) > 0 {
		goal = "not met: " + strings.Join(m, "; ")
		if r.Sweep != nil {
			for _, pt := range r.Sweep.Points {
				if meetsGoal(pt.Result) {
					goal += " (met by " + r.Sweep.Knob + "=" + pt.Value + ")"
					break
				}
			}
		}
	}
	w("Goals: mean step slowdown <= %s and p99 <= %s, cost per GB <= %.2fx the realistic oracle's (c), >= %s saved against per-job parameter servers (d), per GB: **%s**.\n\n",
		pct(GoalSlowdown), pct(GoalP99), GoalOracle, pct(GoalSavedPS), goal)
	w("![pool size against load](pool.svg)\n\n")
	w("*Pool (reserved cores, starting and draining runtimes included) against the decider's sizing demand\n")
	w("(the peak over its window), the mean load (work per second that arrived), what static provisioning (b)\n")
	w("would reserve and the realistic oracle's runtime cores (the broker is not drawn); buckets of %d s show\n", bucketSeconds(res, c))
	w("their maximum (mean for the load and the oracle).*\n\n")

	if r.Sweep != nil {
		w("## Sweep: %s\n\n", r.Sweep.Knob)
		w("Costs per GB summed, the whole service.\n\n")
		w("| %s | x oracle | saved against (d) | against (a) | against (b) | steps completed | mean slowdown | p99 slowdown | stretch p99 | migrations | runtimes started | goals |\n", r.Sweep.Knob)
		w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|\n")
		for _, pt := range r.Sweep.Points {
			x := pt.Result
			mark := "all"
			if m := x.Missed(); len(m) > 0 {
				mark = fmt.Sprintf("%d missed", len(m))
			}
			w("| %s | %.2fx | %s | %s | %s | %d | %s | %s | %.4f | %d | %d | %s |\n", pt.Value, x.OracleRatio(), pct(x.SavedVsPS()), pct(x.Saved()), pct(x.StaticRatio()),
				x.Steps, pct2(x.Slowdown.Mean), pct2(x.Slowdown.P99), x.Stretch.P99, x.Migrations, x.RuntimesStarted, mark)
		}
		w("\n![cost against slowdown](frontier.svg)\n\n")
	}

	w("## Policy\n\n```yaml\n%s```\n\n", r.Options.Policy.YAML())

	w("## Model\n\n")
	w("- Jobs arrive as a Poisson process (%s); each runs as many steps as a Philly run time, truncated to %v\n", rateWords(c), c.MaxJob)
	w("  and raised to %v, holds at its ideal step time; its model is drawn from %s.\n", c.MinJob, modelWords())
	if c.HighFraction+c.LowFraction > 0 {
		w("- %s of the jobs drawn are of priority high, %s low, the others normal.\n", pct(c.HighFraction), pct(c.LowFraction))
	}
	w("- A job trains in BSP steps; rank i computes for its PAI batch time (1000 normalized = %v) and then\n", c.StepScale)
	w("  publishes all its gradient shards (%d bytes each); one rank's gradient of a shard costs\n", c.ShardBytes)
	w("  shard bytes / %.3g B/s core-seconds (%s); the step ends when every shard has summed every rank.\n", c.throughput(), throughputWords(c))
	if c.ApplyShare > 0 {
		w("- %s of a shard's step work is its update, done with the step's last rank's gradients (--apply-share);\n", pct(c.ApplyShare))
		w("  the rest is spread evenly over every rank's.\n")
	}
	cores := r.Options.Policy.CoresPerRuntime
	if cores == 0 {
		cores = c.RuntimeCores
	}
	w("- Runtimes of %d cores: their NIC (%s each way) takes in gradients first come first served and the\n", cores, nicWords(c.NIC))
	w("  cores sum them as they come in, higher priority classes first (fluid, preemptive); new parameters\n")
	w("  leave once per shard and step through the NIC; %s of the runtimes run at %.2fx speed (stragglers).\n", pct(c.SlowFraction), c.SlowSpeed)
	if c.NICWork && c.NIC > 0 {
		w("- What-if (--nic-work): the decider sees a shard's work as the larger of its CPU time and its share of\n")
		w("  a runtime's NIC time in cores; the live runtime reports CPU time only.\n")
	}
	w("- A runtime is ready %v after it is asked for and costs from then until drained; a moved shard\n", c.StartupDelay)
	w("  pauses %v; the decider runs every %v and when a job arrives.\n", c.MigrationPause, c.Interval)
	w("- Step slowdown: time beyond the same step on the job's static cores (b, with their share of NIC),\n")
	w("  over that ideal step time; job-time stretch: a job's time over the ideal time of the steps it ran.\n")
	w("- The broker (NATS servers): a rank's gradient goes into it when published and out to the runtimes; a\n")
	w("  step's parameters go into it once and out to every rank. Per %v interval it needs %.3g ns of CPU\n", c.Interval, 1e9*c.Cost.BrokerCPUPerByteIn)
	w("  per byte in and %.3g ns per byte out", 1e9*c.Cost.BrokerCPUPerByteOut)
	if c.NIC > 0 {
		w(", or the cores of the %d-core nodes (one NIC each) whose NICs carry\n  its bytes, whichever is more", c.BrokerNodeCores)
	}
	switch c.Broker {
	case BrokerNone:
		w("; it is NOT counted here (--broker none).\n")
	case BrokerInRuntimes:
		w(";\n  here the servers run in the runtimes' processes (--broker in-runtimes): the runtimes' rate counts them.\n")
	case BrokerPool:
		w("; it is resized every interval to that (a lower bound).\n")
	default:
		w("; it is a fixed cluster sized at the peak of that over the run,\n  in whole cores, as deployed.\n")
	}
	if c.KernelWork {
		w("- What-if (--kernel-work): the decider is told a shard's work as the aggregation function's time\n")
		w("  (%.3g ns per byte), as a runtime inside another process reports it, not the runtime's whole CPU.\n", 1e9*c.Cost.KernelCPUPerByte)
	}
	w("\n")

	w("## Traces\n\n")
	if r.Traces == nil {
		w("None read: every job of the workload has its own step times.\n\n")
	} else {
		follow := map[string]int{}
		for _, j := range r.Workload.Jobs {
			if len(j.StepTimes) == 0 {
				follow[j.Trace]++
			}
		}
		w("Every trace file of the trace directory was read:\n\n")
		for _, f := range r.Traces.Files {
			if f.Trace == "" {
				w("- %s\n", f)
				continue
			}
			w("- %s: %d of the workload's jobs\n", f, follow[f.Trace])
		}
		w("\n")
	}

	w("## Jobs\n\n")
	w("The queue wait is the closed loop's input, averaged over the decision ticks: the longest of the job's shards the decider\n")
	w("was told (live, `fanin jobs get` shows it per shard as QUEUE_MS), and that over the period, which `slowdown_budget` bounds.\n\n")
	w("| job | model | trace | priority | shards | static cores | work/step (core-s) | step (s) | life (s) | ideal (s) | steps (of) | mean slowdown | p99 slowdown | stretch | queue wait (ms) | ÷ period |\n")
	w("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, j := range res.JobRows {
		w("| %s | %s | %s | %s | %d | %d | %.3f | %.2f | %.0f | %.0f | %d (%d) | %s | %s | %.4f | %.2f | %s |\n", j.ID, j.Model, j.Trace, j.Priority, j.Shards, j.StaticCores,
			j.WorkPerStep, j.MeanPeriod, j.Lifetime, j.IdealDuration, j.Steps, j.TotalSteps, pct2(j.MeanSlowdown), pct2(j.P99Slowdown), j.Stretch,
			1000*j.MeanQueueWait, pct2(j.MeanSignal))
	}
	return b.Bytes()
}

// Counted says what the costs count, in one line: the runtimes' rate, the broker's, how the
// broker is sized, where the figures come from, and what is left out.
func (r *Report) Counted() string {
	c, res := r.Options.Config, r.Base
	var b strings.Builder
	fmt.Fprintf(&b, "the runtimes at %s of gradient per core-second (%s); %s; ", gbps(c.throughput()), throughputWords(c), signalWords(c.Signal))
	if c.Broker == BrokerInRuntimes {
		fmt.Fprintf(&b, "the NATS servers in the runtimes' processes (--broker in-runtimes), their CPU in the runtimes' rate; measured %s. Not counted: the workers, the gateway and autoscaler, disks, and the parameter servers' network.", costWords(c.Cost))
		return b.String()
	}
	if c.Broker == BrokerNone {
		fmt.Fprintf(&b, "the NATS broker is NOT counted (--broker none); measured %s. Not counted either: the workers, the gateway and autoscaler, disks, and the parameter servers' network.", costWords(c.Cost))
		return b.String()
	}
	fmt.Fprintf(&b, "the NATS broker at %.3g ns of CPU per byte in and %.3g ns per byte out", 1e9*c.Cost.BrokerCPUPerByteIn, 1e9*c.Cost.BrokerCPUPerByteOut)
	if c.NIC > 0 {
		fmt.Fprintf(&b, ", and its NICs (%s each way per %d-core node)", nicWords(c.NIC), c.BrokerNodeCores)
	}
	if c.Broker == BrokerPool {
		b.WriteString(", resized every interval to its demand (a lower bound)")
	} else {
		fmt.Fprintf(&b, ", a fixed cluster sized at its peak (%.0f cores for the elastic pool, %.0f for the ideal schedules)", math.Ceil(res.Broker.Peak-1e-9), math.Ceil(res.IdealBroker.Peak-1e-9))
	}
	fmt.Fprintf(&b, "; measured %s", costWords(c.Cost))
	b.WriteString(". Not counted: the workers, the gateway and autoscaler at rest, disks, and the parameter servers' network.")
	return b.String()
}

// signalWords says which queue wait fed the decider's closed loop.
func signalWords(signal string) string {
	if signal == SignalHindsight {
		return "the decider's queue wait: hindsight (--signal hindsight, a step's time beyond its ideal, not measurable live)"
	}
	return "the decider's queue wait: live (per shard, the time its gradients waited for a core once in and once its previous one was summed, summed over a step's ranks, averaged over steps, as the runtime measures it)"
}

func costWords(c ServiceCost) string {
	s := c.Date
	if s == "" {
		s = "(undated)"
	}
	if c.Machine != "" {
		s += " on " + c.Machine
	}
	if c.Commit != "" {
		s += " at " + c.Commit
	}
	if c.Source != "" {
		s += " (" + c.Source + ")"
	}
	return s
}

func throughputWords(c Config) string {
	if c.Throughput > 0 {
		return "as given"
	}
	return "the runtime process's measured rate, everything it does included"
}

func gbps(bytesPerSecond float64) string { return fmt.Sprintf("%.3g GB/s", bytesPerSecond/1e9) }

func secs(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }

func peakStatic(r *Result) float64 {
	m := 0.0
	for _, s := range r.Pool {
		m = max(m, s.Static)
	}
	return m
}

func bucketSeconds(r *Result, c Config) int {
	per := max(1, (len(r.Pool)+maxPoints-1)/maxPoints)
	return int(float64(per) * c.Interval.Seconds())
}

func rateWords(c Config) string {
	switch {
	case c.Rate > 0 && c.Jobs > 0:
		return fmt.Sprintf("%g per minute, at most %d jobs", c.Rate, c.Jobs)
	case c.Rate > 0:
		return fmt.Sprintf("%g per minute", c.Rate)
	default:
		return fmt.Sprintf("%d jobs over the run", c.Jobs)
	}
}

func nicWords(nic float64) string {
	if nic <= 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%g Gbit/s", nic*8/1e9)
}

func modelWords() string {
	var s []string
	for _, m := range Models {
		s = append(s, fmt.Sprintf("%s (%.1fM)", m.Name, float64(m.Params)/1e6))
	}
	return strings.Join(s, ", ")
}
