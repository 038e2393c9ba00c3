package bench

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The gloo scenario compares fanin with what a training team compares it with: PyTorch's own
// all-reduce. gloo.py is one rank of DistributedDataParallel's gradient path on CPU (copy into the
// bucket, divide by the world size, gloo all_reduce, SGD step), one thread per process; the bench
// runs N of them on the gradients fanin's workers send (the same values, made by the same
// function), alternating with fanin in the same run. fanin's workers run in a worker process of
// their own (`fanin bench-workers`), as gloo's ranks do, which also separates the CPU of the
// service (this process: NATS server, gateway, runtimes) from the workers'.
//
//go:embed gloo.py
var glooScript string

const glooBaseline = "PyTorch gloo all-reduce + SGD, one process per rank, one thread each (DDP's path on CPU: copy into the bucket, divide by the world size, all_reduce, SGD step)"

// bytepsBaseline is the reference of the service-cost rows: BytePS's published sizing of its
// summation service, about 6 Gbit/s of gradient per CPU core (Jiang et al., OSDI 2020), 0.75 GB/s.
const bytepsBaseline = "BytePS's published summation rate, ~6 Gbit/s per CPU core (reference figure from its paper, not measured here)"

const bytepsGBPerCoreSecond = 0.75

// findTorch finds a Python with numpy and torch whose torch.distributed has gloo: FANIN_PYTHON,
// else Debian's /usr/bin/python3, else python3 on PATH.
func findTorch(ctx context.Context) (string, error) {
	var tried []string
	for _, p := range []string{os.Getenv("FANIN_PYTHON"), "/usr/bin/python3", "python3"} {
		if p == "" {
			continue
		}
		tried = append(tried, p)
		check := exec.CommandContext(ctx, p, "-c", "import numpy, torch, torch.distributed as d; assert d.is_available() and d.is_gloo_available()")
		if check.Run() == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no Python with numpy and torch with gloo (tried %s; Debian: apt-get install python3-torch; or set FANIN_PYTHON)", strings.Join(tried, ", "))
}

// glooRank is what one gloo.py process prints.
type glooRank struct {
	Rank        int       `json:"rank"`
	Steps       int       `json:"steps"`
	ElapsedS    float64   `json:"elapsed_s"`
	StepMs      []float64 `json:"step_ms"`
	Sha256      string    `json:"sha256"`
	SampleIndex []int     `json:"sample_index"`
	Sample      []float64 `json:"sample"`
	TotalSteps  int       `json:"total_steps"`
	Torch       string    `json:"torch"`
}

// glooRun is one run of the N processes.
type glooRun struct {
	stepsPerSec float64
	stepMs      []float64 // latency mode: per step, the slowest rank's time
	torch       string
}

// runGlooOnce runs w.Ranks gloo.py processes (mode "throughput" or "latency") and checks that they
// end with the same parameters, the ones fanin computes up to rounding: -steps * lr * the mean
// gradient, at a few elements.
func runGlooOnce(ctx context.Context, python, script string, w workload, mode string, warmup, steps int) (glooRun, error) {
	port, err := freePort()
	if err != nil {
		return glooRun{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	reps := make([]glooRank, w.Ranks)
	errs := make([]error, w.Ranks)
	var wg sync.WaitGroup
	for r := range w.Ranks {
		cmd := command(ctx, python, script, "--rank", strconv.Itoa(r), "--world", strconv.Itoa(w.Ranks),
			"--port", strconv.Itoa(port), "--elements", strconv.Itoa(w.Elements), "--lr", strconv.FormatFloat(learningRate, 'g', -1, 64),
			"--warmup", strconv.Itoa(warmup), "--steps", strconv.Itoa(steps), "--mode", mode)
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Start(); err != nil {
			cancel()
			wg.Wait()
			return glooRun{}, fmt.Errorf("gloo rank %d: %w", r, err)
		}
		wg.Go(func() {
			if err := cmd.Wait(); err != nil {
				errs[r] = fmt.Errorf("gloo rank %d: %v: %s", r, err, tail(errOut.Bytes(), 1500))
				cancel() // the others would wait for this rank forever
				return
			}
			if err := json.Unmarshal(out.Bytes(), &reps[r]); err != nil {
				errs[r] = fmt.Errorf("gloo rank %d printed %q: %w", r, tail(out.Bytes(), 300), err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return glooRun{}, err
	}
	run := glooRun{torch: reps[0].Torch}
	var slowest float64
	for _, rp := range reps {
		if rp.Sha256 != reps[0].Sha256 {
			return run, fmt.Errorf("gloo rank %d ended with parameters %.12s, rank 0 with %.12s", rp.Rank, rp.Sha256, reps[0].Sha256)
		}
		slowest = max(slowest, rp.ElapsedS)
	}
	if err := checkGlooSample(reps[0], w); err != nil {
		return run, err
	}
	if slowest > 0 {
		run.stepsPerSec = float64(steps) / slowest
	}
	if mode == "latency" {
		run.stepMs = make([]float64, steps)
		for _, rp := range reps {
			if len(rp.StepMs) != steps {
				return run, fmt.Errorf("gloo rank %d timed %d steps, want %d", rp.Rank, len(rp.StepMs), steps)
			}
			for i, v := range rp.StepMs {
				run.stepMs[i] = max(run.stepMs[i], v)
			}
		}
	}
	return run, nil
}

// checkGlooSample checks rank 0's sampled parameters against -total * lr * mean gradient: gloo
// computed the step fanin computes (in another summation order, so not bit for bit).
func checkGlooSample(rp glooRank, w workload) error {
	if len(rp.Sample) == 0 || len(rp.Sample) != len(rp.SampleIndex) {
		return fmt.Errorf("gloo rank 0 reported %d sampled parameters for %d indices", len(rp.Sample), len(rp.SampleIndex))
	}
	for k, i := range rp.SampleIndex {
		if i < 0 || i >= w.Elements {
			return fmt.Errorf("gloo sampled element %d of %d", i, w.Elements)
		}
		var mean, scale float64
		for r := range w.Ranks {
			g := float64(gradientAt(r, i))
			mean += g / float64(w.Ranks)
			scale += math.Abs(g) / float64(w.Ranks)
		}
		want := -float64(rp.TotalSteps) * learningRate * mean
		tol := 1e-4*float64(rp.TotalSteps)*learningRate*scale + 1e-12
		if d := math.Abs(rp.Sample[k] - want); !(d <= tol) {
			return fmt.Errorf("gloo's parameter %d after %d steps is %g, want %g (±%g): it did not compute fanin's step", i, rp.TotalSteps, rp.Sample[k], want, tol)
		}
	}
	return nil
}

// gradientAt is element i of rank's gradient (fillGradient's).
func gradientAt(rank, i int) float32 {
	z := uint64(rank+1)*0x9E3779B97F4A7C15 + uint64(i+1)*0x9E3779B97F4A7C15
	x := (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	x ^= x >> 31
	return float32(int32(uint32(x))) / math.MaxInt32 * 1e-3
}

// gbPerCoreSecond is the service's cost figure: gradient bytes received by the runtimes (ranks x
// model bytes per step) per second of the service's CPU.
func gbPerCoreSecond(w workload, steps int, cpu time.Duration) float64 {
	if cpu <= 0 {
		return 0
	}
	return float64(steps) * float64(w.Ranks) * 4 * float64(w.Elements) / 1e9 / cpu.Seconds()
}

func runGloo(ctx context.Context, rs *runState) ([]Result, error) {
	n, model := rs.e2eElements()
	p := rs.e2ePlan()
	big := workload{Ranks: 8, Elements: n, ShardSize: securedShardSize, Runtimes: e2eRuntimes}
	small := latencyWorkload
	smallSteps := rs.latencySteps()
	python, err := findTorch(ctx)
	if err != nil {
		return []Result{{Scenario: "gloo", Case: big.name(), Metric: "steps/s", Baseline: glooBaseline, Goal: 1, Skipped: err.Error()}}, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	goWorkers := &pythonEnv{fanin: exe}
	dir, err := os.MkdirTemp("", "fanin-bench-gloo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "gloo.py")
	if err := os.WriteFile(script, []byte(glooScript), 0o644); err != nil {
		return nil, err
	}

	// Steps/s at ResNet-50 size, and the service's CPU of each fanin run.
	var fRuns, bRuns, pRuns, dRuns, dpRuns, gRuns, costs []string
	var fBest, bBest, pBest, dBest, dpBest, gBest float64
	var bestCost float64
	var torchVersion string
	// faninRun runs fanin once on w (label names the case, extra are the worker process's flags)
	// and keeps its steps/s in runs and best.
	faninRun := func(label string, w workload, i int, runs *[]string, best *float64, extra ...string) (*WorkersReport, time.Duration, error) {
		rs.printf("   gloo %s fanin%s run %d/%d ...", big.name(), label, i+1, p.reps)
		rep, cpu, err := workerProcess(ctx, rs, goWorkers, "go", w, p.warmup, p.steps, false, extra...)
		if err != nil {
			return nil, 0, fmt.Errorf("fanin %s%s: %w", big.name(), label, err)
		}
		rs.printf("   gloo %s fanin%s: %.3f steps/s", big.name(), label, rep.StepsPerSec)
		*runs = append(*runs, num(rep.StepsPerSec))
		*best = max(*best, rep.StepsPerSec)
		return rep, cpu, nil
	}
	bigP := big
	bigP.ParamDtype = "bf16"
	// The same job with direct gradients (core NATS requests to the runtimes, no stream).
	bigD, bigDP := big, bigP
	bigD.Gradients, bigDP.Gradients = "direct", "direct"
	for i := range p.reps {
		prev := fBest
		rep, cpu, err := faninRun("", big, i, &fRuns, &fBest)
		if err != nil {
			return nil, err
		}
		cost := gbPerCoreSecond(big, p.warmup+p.steps, cpu)
		rs.printf("   gloo %s fanin: service %.2f GB/core-s", big.name(), cost)
		costs = append(costs, fmt.Sprintf("%s (%.1f s CPU for %d steps)", num(cost), cpu.Seconds(), p.warmup+p.steps))
		if rep.StepsPerSec > prev {
			bestCost = cost
		}
		if _, _, err := faninRun(" bf16", big, i, &bRuns, &bBest, "--dtype", "bf16"); err != nil {
			return nil, err
		}
		if _, _, err := faninRun(" bf16 gradients and parameters", bigP, i, &pRuns, &pBest, "--dtype", "bf16"); err != nil {
			return nil, err
		}
		if _, _, err := faninRun(" direct", bigD, i, &dRuns, &dBest); err != nil {
			return nil, err
		}
		if _, _, err := faninRun(" direct, bf16 gradients and parameters", bigDP, i, &dpRuns, &dpBest, "--dtype", "bf16"); err != nil {
			return nil, err
		}
		rs.printf("   gloo %s gloo run %d/%d ...", big.name(), i+1, p.reps)
		g, err := runGlooOnce(ctx, python, script, big, "throughput", p.warmup, p.steps)
		if err != nil {
			return nil, fmt.Errorf("gloo %s: %w", big.name(), err)
		}
		rs.printf("   gloo %s gloo: %.3f steps/s", big.name(), g.stepsPerSec)
		gRuns = append(gRuns, num(g.stepsPerSec))
		gBest, torchVersion = max(gBest, g.stepsPerSec), g.torch
	}
	setup := fmt.Sprintf("%s, %d ranks, sgd; fanin open (no security), %d runtimes, shards of %s, JetStream memory storage, its %d ranks in one Go worker process with a connection each; gloo: %d Python processes (torch %s, one thread each); best of %d runs of %d steps after %d warm-up, fanin (f32, bf16 gradients, bf16 gradients and parameters; f32 and bf16 gradients and parameters again with direct gradients) and gloo alternating",
		model, big.Ranks, big.Runtimes, mib(big.ShardSize), big.Ranks, big.Ranks, torchVersion, p.reps, p.steps, p.warmup)
	// vsGloo is a steps/s row of a fanin case (suffix of the case's name) against gloo's best run.
	vsGloo := func(suffix string, best, goal float64, what string, runs []string) Result {
		return throughput(Result{
			Scenario: "gloo", Case: big.name() + suffix, Metric: "steps/s", Baseline: glooBaseline,
			Fanin: best, Base: gBest, Goal: goal, Setup: setup,
			Notes: fmt.Sprintf("%sruns: fanin %s; gloo %s steps/s", what, strings.Join(runs, ", "), strings.Join(gRuns, ", ")),
		})
	}
	out := []Result{
		vsGloo("", fBest, 1, "", fRuns),
		vsGloo(",bf16 gradients", bBest, 1.8, "fanin's workers publish bfloat16 gradients (sdk.WithGradDtype(wire.BF16): half the bytes, rounded to nearest even, summed in float32), against gloo's float32; ", bRuns),
		vsGloo(",bf16 gradients and parameters", pBest, 1.8, "bfloat16 gradients as above, and a job with param_dtype bf16: after step 0 the workers receive the float32 master parameters rounded to bfloat16 (half the bytes of the fan-out), and each shard writes a float32 checkpoint per step instead; ", pRuns),
		vsGloo(",direct", dBest, 0.6, "float32, a job with gradients: direct (core NATS requests to the runtimes, no gradient stream: PROTOCOL.md); ", dRuns),
		vsGloo(",direct,bf16 gradients and parameters", dpBest, 1, "bfloat16 gradients and parameters, direct gradients; ", dpRuns),
	}
	out = append(out, throughput(Result{
		Scenario: "gloo", Case: "service cost," + big.name(), Metric: "GB of gradient per core-second", Baseline: bytepsBaseline,
		Fanin: bestCost, Base: bytepsGBPerCoreSecond, Setup: setup,
		Notes: fmt.Sprintf("the service is this process (NATS server, gateway, runtimes; not the workers), its CPU from the worker process's start to its exit, warm-up included; a GB is 10^9 bytes of gradient received (ranks x model bytes per step); the figure is the fastest run's; every run: %s", strings.Join(costs, ", ")),
	}))

	// Step latency of 4 ranks on 1 MiB, every run's steps pooled.
	var fLat, gLat []float64
	var smallCost []float64
	for i := range p.reps {
		rs.printf("   gloo %s fanin latency run %d/%d ...", small.name(), i+1, p.reps)
		rep, cpu, err := workerProcess(ctx, rs, goWorkers, "go", small, latencyWarmup, smallSteps, false)
		if err != nil {
			return out, fmt.Errorf("fanin %s: %w", small.name(), err)
		}
		if len(rep.StepMs) != smallSteps {
			return out, fmt.Errorf("fanin %s: the worker process timed %d steps, want %d", small.name(), len(rep.StepMs), smallSteps)
		}
		fLat = append(fLat, rep.StepMs...)
		smallCost = append(smallCost, gbPerCoreSecond(small, latencyWarmup+smallSteps, cpu))
		rs.printf("   gloo %s gloo latency run %d/%d ...", small.name(), i+1, p.reps)
		g, err := runGlooOnce(ctx, python, script, small, "latency", latencyWarmup, smallSteps)
		if err != nil {
			return out, fmt.Errorf("gloo %s: %w", small.name(), err)
		}
		gLat = append(gLat, g.stepMs...)
	}
	lsetup := fmt.Sprintf("1 MiB of parameters in 1 shard, %d ranks, sgd; fanin open, %d runtimes, its ranks in one Go worker process; gloo: %d processes; %d runs of %d timed steps after %d warm-up, alternating, every step of every run pooled; a fanin step is timed from its ranks' first publish to the last rank holding the parameters, a gloo step from a barrier to the slowest rank's new parameters; nearest-rank percentiles",
		small.Ranks, small.Runtimes, small.Ranks, p.reps, smallSteps, latencyWarmup)
	for _, q := range []struct {
		name string
		p    float64
	}{{"p50", 0.5}, {"p99", 0.99}} {
		out = append(out, latencyGoal(Result{
			Scenario: "gloo", Case: small.name() + "," + q.name, Metric: q.name + " step ms", Baseline: glooBaseline,
			Fanin: percentileMs(fLat, q.p), Base: percentileMs(gLat, q.p), Goal: 1, Setup: lsetup,
		}))
	}
	out = append(out, throughput(Result{
		Scenario: "gloo", Case: "service cost," + small.name(), Metric: "GB of gradient per core-second", Baseline: bytepsBaseline,
		Fanin: percentileMs(smallCost, 0.5), Base: bytepsGBPerCoreSecond, Setup: lsetup,
		Notes: fmt.Sprintf("as at ResNet-50 size, for the latency runs (the median run; every run: %s)", nums(smallCost)),
	}))
	return out, nil
}

// percentileMs is the nearest-rank p-quantile of figures (0 with none).
func percentileMs(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// nums lists figures as num prints them.
func nums(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = num(x)
	}
	return strings.Join(parts, ", ")
}
