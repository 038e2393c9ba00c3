package bench

import (
	"context"
	"fmt"
	"strings"

	"github.com/fanin-ml/fanin/job"
)

// Model sizes of the end-to-end scenarios.
const (
	resnet50Elements = 25_557_032 // ResNet-50's parameter count: 97.5 MiB of float32
	quickElements    = 2_555_703  // a tenth of it, for --quick
)

// e2eRuntimes is the size of fanin's runtime pool in the end-to-end scenarios: the figure,
// the devstack default, and the best of 1, 2, 3, 5 and 8 on 2 cores (the shards a runtime serves
// share its NATS connection, so fewer runtimes overload it; see analysis.md).
const e2eRuntimes = 3

// e2eShardSizes are the shard sizes the e2e-resnet50 scenario tries.
var e2eShardSizes = []int{1 << 20, 4 << 20, 8 << 20}

// redisShardSize is the shard size of the e2e-redis scenario: the suggested 4 MiB.
const redisShardSize = 4 << 20

// The baselines of the end-to-end scenarios.
const (
	bareBaseline   = "bare aggregator over core NATS (no JetStream, no durability)"
	bareJSBaseline = "bare aggregator over JetStream (fanin's stream path: memory streams, message ids, acknowledgements, a pull consumer per shard; none of fanin's code)"
	redisBaseline  = "Redis SET/GET with a polling aggregator"
)

// e2ePlan is how long each measurement runs.
type e2ePlan struct {
	warmup, steps, reps int
}

func (rs *runState) e2ePlan() e2ePlan {
	if rs.cfg.Quick {
		return e2ePlan{warmup: 2, steps: 10, reps: 1}
	}
	return e2ePlan{warmup: 2, steps: 10, reps: 3}
}

func (rs *runState) e2eElements() (int, string) {
	if rs.cfg.Quick {
		return quickElements, "quick: a tenth of ResNet-50 (2.56M float32, 9.7 MiB)"
	}
	return resnet50Elements, "ResNet-50 size (25.6M float32, 97.5 MiB)"
}

// compare measures fanin and a baseline on the same workload, alternately, reps times each on
// fresh servers, and keeps the best figure of each (the one least disturbed by the rest of the
// machine) with the list of all runs. It checks that both end with bit-identical parameters.
// fanin is measured again for every baseline, never reused: alternating is what makes the two
// figures comparable on a machine whose load changes.
func (rs *runState) compare(ctx context.Context, w workload, base starter, baseName string) (fanin, baseline e2eFigure, err error) {
	return rs.compareStarters(ctx, w, startFanin, base, baseName)
}

// compareStarters is compare with fanin started by start.
func (rs *runState) compareStarters(ctx context.Context, w workload, start, base starter, baseName string) (fanin, baseline e2eFigure, err error) {
	p := rs.e2ePlan()
	var fRuns, bRuns []float64
	var fEvents, bEvents []string
	for i := range p.reps {
		rs.printf("   %s fanin run %d/%d ...", w.name(), i+1, p.reps)
		f, err := measureFresh(ctx, rs, start, w, p.warmup, p.steps)
		if err != nil {
			return fanin, baseline, fmt.Errorf("fanin %s: %w", w.name(), err)
		}
		rs.printf("   %s fanin: %.3f steps/s %s", w.name(), f.stepsPerSec, f.observed)
		fRuns, fEvents = append(fRuns, f.stepsPerSec), append(fEvents, f.observed)
		if f.stepsPerSec > fanin.stepsPerSec {
			fanin = f
		}
		rs.printf("   %s %s run %d/%d ...", w.name(), baseName, i+1, p.reps)
		b, err := measureFresh(ctx, rs, base, w, p.warmup, p.steps)
		if err != nil {
			return fanin, baseline, fmt.Errorf("%s %s: %w", baseName, w.name(), err)
		}
		rs.printf("   %s %s: %.3f steps/s %s", w.name(), baseName, b.stepsPerSec, b.observed)
		bRuns, bEvents = append(bRuns, b.stepsPerSec), append(bEvents, b.observed)
		if b.stepsPerSec > baseline.stepsPerSec {
			baseline = b
		}
	}
	fanin.runs, fanin.events = fRuns, fEvents
	baseline.runs, baseline.events = bRuns, bEvents
	if fanin.sum != baseline.sum {
		return fanin, baseline, fmt.Errorf("%s: after %d steps fanin's parameters (crc32c %08x) differ from the %s's (%08x): they did not compute the same thing",
			w.name(), p.warmup+p.steps, fanin.sum, baseName, baseline.sum)
	}
	return fanin, baseline, nil
}

func e2eResult(scenario, baseName string, w workload, model string, p e2ePlan, goal float64, f, b e2eFigure) Result {
	return throughput(Result{
		Scenario: scenario, Case: w.name(), Metric: "steps/s", Baseline: baseName,
		Fanin: f.stepsPerSec, Base: b.stepsPerSec, Goal: goal,
		FaninCPU: f.cpu, BaseCPU: b.cpu, FuncTime: f.funcTime,
		Setup: fmt.Sprintf("%s, %d ranks each with its own connection, sgd, fanin with %d runtimes; best of %d fresh runs of %d steps after %d warm-up steps, fanin and baseline alternating; every run ends with fanin's parameters bit-identical to the baseline's",
			model, w.Ranks, w.Runtimes, p.reps, p.steps, p.warmup),
		Notes: fmt.Sprintf("fanin: %s; runs %s. Baseline: %s; runs %s", f.notes, runList(f), b.notes, runList(b)),
	})
}

// runList names every run of a figure, with what was observed in it: "0.19 (the NATS server cut
// 26 slow consumers), 0.79, 0.77 steps/s".
func runList(f e2eFigure) string {
	var parts []string
	for i, r := range f.runs {
		s := num(r)
		if i < len(f.events) && f.events[i] != "" {
			s += " (" + f.events[i] + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ") + " steps/s"
}

func runE2E(ctx context.Context, rs *runState) ([]Result, error) {
	n, model := rs.e2eElements()
	var out []Result
	for _, shard := range e2eShardSizes {
		w := workload{Ranks: 8, Elements: n, ShardSize: shard, Runtimes: e2eRuntimes}
		f, b, err := rs.compare(ctx, w, startBareNATS, bareBaseline)
		if err != nil {
			return out, err
		}
		out = append(out, e2eResult("e2e-resnet50", bareBaseline, w, model, rs.e2ePlan(), 1, f, b))
	}
	// What fanin's own code costs on top of the JetStream path it uses, at the best shard size.
	w := workload{Ranks: 8, Elements: n, ShardSize: securedShardSize, Runtimes: e2eRuntimes}
	f, b, err := rs.compare(ctx, w, startBareJetStream, bareJSBaseline)
	if err != nil {
		return out, err
	}
	r := e2eResult("e2e-resnet50", bareJSBaseline, w, model, rs.e2ePlan(), 0, f, b)
	r.Case += " vs bare JetStream"
	r.Notes += ". The bare aggregator takes every shard on one connection; fanin's runtimes have one each"
	out = append(out, r)
	// Direct gradients (core NATS requests, nothing stored) against the stored path.
	wd := w
	wd.Gradients = job.GradientsDirect
	f, b, err = rs.compareStarters(ctx, wd, startFanin, startFaninStored, storedBaseline)
	if err != nil {
		return out, err
	}
	r = e2eResult("e2e-resnet50", storedBaseline, wd, model, rs.e2ePlan(), 0, f, b)
	r.Notes += ". Both are fanin; the baseline's job has gradients: stored"
	return append(out, r), nil
}

// storedBaseline is what direct gradients are compared with.
const storedBaseline = "the same fanin job with its gradients stored (gradients: stored, the default)"

// startFaninStored is startFanin with the job's gradients stored, whatever the workload asks.
func startFaninStored(ctx context.Context, rs *runState, w workload, dir string) (*system, error) {
	w.Gradients = ""
	return startFanin(ctx, rs, w, dir)
}

// openBaseline is the baseline of the e2e-secured scenario.
const openBaseline = "the same fanin without security (no NATS accounts, no credentials)"

// securedShardSize is the e2e-secured scenario's shard size: the e2e scenario's best.
const securedShardSize = 4 << 20

// runSecured measures what tenant isolation costs: every gradient crosses from the job's account
// into fanin's through a service import, and every parameter push back through a stream import.
func runSecured(ctx context.Context, rs *runState) ([]Result, error) {
	n, model := rs.e2eElements()
	w := workload{Ranks: 8, Elements: n, ShardSize: securedShardSize, Runtimes: e2eRuntimes}
	f, b, err := rs.compareStarters(ctx, w, startFaninSecured, startFanin, openBaseline)
	if err != nil {
		return nil, err
	}
	return []Result{e2eResult("e2e-secured", openBaseline, w, model, rs.e2ePlan(), 0.97, f, b)}, nil
}

func runRedis(ctx context.Context, rs *runState) ([]Result, error) {
	n, model := rs.e2eElements()
	w := workload{Ranks: 8, Elements: n, ShardSize: redisShardSize, Runtimes: e2eRuntimes}
	if _, err := findRedis(rs.cfg); err != nil {
		return []Result{{Scenario: "e2e-redis", Case: w.name(), Metric: "steps/s", Baseline: redisBaseline, Goal: 1.3, Skipped: err.Error()}}, nil
	}
	f, b, err := rs.compare(ctx, w, startRedis, redisBaseline)
	if err != nil {
		return nil, err
	}
	return []Result{e2eResult("e2e-redis", redisBaseline, w, model, rs.e2ePlan(), 1.3, f, b)}, nil
}
