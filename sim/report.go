package sim

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fanin-ml/fanin/autoscaler"
)

// The performance goal: reserved core-seconds at most GoalCost of static peak provisioning
// at a mean step slowdown of at most GoalSlowdown.
const (
	GoalCost     = 0.20
	GoalSlowdown = 0.02
)

// Options are the inputs of Simulate.
type Options struct {
	Config Config
	Policy autoscaler.Policy
	// TracesDir holds the shared traces; it is needed unless WorkloadFile gives every job its own
	// step times.
	TracesDir    string
	WorkloadFile string // "" draws a workload from the traces
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

// meetsGoal says whether a result reaches the goal.
func meetsGoal(r *Result) bool {
	return r.CostRatio() <= GoalCost && r.Slowdown.Mean <= GoalSlowdown
}

// Markdown renders the report.
func (r *Report) Markdown() []byte {
	var b bytes.Buffer
	c, res := r.Options.Config, r.Base
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# fanin sim report\n\n")
	w("%d jobs %s, seed %d, %v simulated. The elastic pool is sized and placed by the autoscaler's own\n", res.Jobs, r.Source, c.Seed, c.Duration)
	w("`Decider` (the policy below); the baseline reserves, for each job's whole life, the cores that\n")
	w("aggregate its burst without queueing (static peak provisioning).\n\n")

	w("## Result\n\n")
	w("| | elastic pool | static peak provisioning |\n|---|---:|---:|\n")
	w("| reserved core-seconds | %.0f | %.0f |\n", res.ElasticCoreSeconds, res.StaticCoreSeconds)
	w("| aggregation work done, core-seconds (the floor: %s of static) | %.0f | |\n", pct(res.WorkCoreSeconds/max(res.StaticCoreSeconds, 1)), res.WorkCoreSeconds)
	w("| cost against static | **%s** | 100%% |\n", pct(res.CostRatio()))
	w("| mean cores | %.1f | %.1f |\n", res.ElasticCoreSeconds/c.Duration.Seconds(), res.StaticCoreSeconds/c.Duration.Seconds())
	w("| peak cores | %.0f | %.0f |\n", res.PeakCores, peakStatic(res))
	w("| mean step slowdown | **%s** | 0 (the ideal) |\n", pct2(res.Slowdown.Mean))
	w("| step slowdown p50 / p90 / p99 / max | %s / %s / %s / %s | |\n", pct2(res.Slowdown.P50), pct2(res.Slowdown.P90), pct2(res.Slowdown.P99), pct2(res.Slowdown.Max))
	w("| steps | %d | |\n", res.Steps)
	w("| migrations (moves of placed shards) | %d | |\n", res.Migrations)
	w("| first placements of shards | %d | |\n", res.Placements)
	w("| decisions (in panic) | %d (%d) | |\n", res.Decisions, res.PanicDecisions)
	w("| runtimes started (slow ones among them) | %d (%d) | |\n\n", res.RuntimesStarted, res.SlowRuntimes)
	goal := "not met"
	if meetsGoal(res) {
		goal = "met"
	} else if r.Sweep != nil {
		for _, pt := range r.Sweep.Points {
			if meetsGoal(pt.Result) {
				goal = "met by " + r.Sweep.Knob + "=" + pt.Value
				break
			}
		}
	}
	w("Goal of issue 3: reserved core-seconds <= %.0f%% of static at <= %.0f%% mean step slowdown: **%s**.\n\n", GoalCost*100, GoalSlowdown*100, goal)
	w("![pool size against load](pool.svg)\n\n")
	w("*Pool (reserved cores, starting and draining runtimes included) against the decider's sizing demand\n")
	w("(the peak over its window), the mean load (work per second that arrived) and what static provisioning\n")
	w("would reserve; buckets of %d s show their maximum (mean for the load).*\n\n", bucketSeconds(res, c))

	if r.Sweep != nil {
		w("## Sweep: %s\n\n", r.Sweep.Knob)
		w("| %s | cost against static | mean slowdown | p99 slowdown | migrations | runtimes started | goal |\n", r.Sweep.Knob)
		w("|---:|---:|---:|---:|---:|---:|:---:|\n")
		for _, pt := range r.Sweep.Points {
			x := pt.Result
			mark := ""
			if meetsGoal(x) {
				mark = "yes"
			}
			w("| %s | %s | %s | %s | %d | %d | %s |\n", pt.Value, pct(x.CostRatio()), pct2(x.Slowdown.Mean), pct2(x.Slowdown.P99), x.Migrations, x.RuntimesStarted, mark)
		}
		w("\n![cost against slowdown](frontier.svg)\n\n")
	}

	w("## Policy\n\n```yaml\n%s```\n\n", r.Options.Policy.YAML())

	w("## Model\n\n")
	w("- Jobs arrive as a Poisson process (%s); each runs for a Philly run time, truncated to %v and raised to %v;\n", rateWords(c), c.MaxJob, c.MinJob)
	w("  its model is drawn from %s.\n", modelWords())
	w("- A job trains in BSP steps; rank i computes for its PAI batch time (1000 normalized = %v) and then\n", c.StepScale)
	w("  publishes all its gradient shards (%d bytes each); one rank's gradient of a shard costs\n", c.ShardBytes)
	w("  shard bytes / %.3g B/s core-seconds; the step ends when every shard has summed every rank.\n", c.Throughput)
	w("- Runtimes are FIFO fluid servers of %d cores; %s of them run at %.2fx speed (stragglers).\n", r.Options.Policy.CoresPerRuntime, pct(c.SlowFraction), c.SlowSpeed)
	w("- A runtime is ready %v after it is asked for and costs from then until drained; a moved shard\n", c.StartupDelay)
	w("  pauses %v; the decider runs every %v and when a job arrives.\n", c.MigrationPause, c.Interval)
	w("- Step slowdown: time beyond the same step on the job's static cores, over that ideal step time.\n\n")

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
	w("| job | model | trace | shards | static cores | work/step (core-s) | step (s) | life (s) | steps | mean slowdown | p99 slowdown |\n")
	w("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, j := range res.JobRows {
		w("| %s | %s | %s | %d | %d | %.3f | %.2f | %.0f | %d | %s | %s |\n", j.ID, j.Model, j.Trace, j.Shards, j.StaticCores,
			j.WorkPerStep, j.MeanPeriod, j.Lifetime, j.Steps, pct2(j.MeanSlowdown), pct2(j.P99Slowdown))
	}
	return b.Bytes()
}

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

func modelWords() string {
	var s []string
	for _, m := range Models {
		s = append(s, fmt.Sprintf("%s (%.1fM)", m.Name, float64(m.Params)/1e6))
	}
	return strings.Join(s, ", ")
}
