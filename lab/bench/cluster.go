package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/fanin-ml/fanin/job"
)

// workload is a BSP training job as every system under test runs it: Ranks workers, a model of
// Elements float32 in one tensor cut into shards of ShardSize bytes (fanin's layout, used by the
// baselines too), the sgd function, and for fanin Runtimes runtimes and JetStream memory storage.
type workload struct {
	Ranks      int
	Elements   int
	ShardSize  int
	Runtimes   int
	ParamDtype string // the job's param_dtype: "" (f32) or bf16
	Gradients  string // the job's gradients: "" (stored) or direct
}

// learningRate of the sgd every system applies.
const learningRate = 0.01

func (w workload) spec(id string) job.Spec {
	s := job.Spec{
		ID:        id,
		Tensors:   []job.Tensor{{Name: "params", Shape: []int{w.Elements}}},
		Ranks:     w.Ranks,
		Function:  job.Function{Name: "sgd", Hyper: map[string]float64{"lr": learningRate}},
		ShardSize: job.ByteSize(w.ShardSize),
		Storage:   "memory",
	}
	s.ParamDtype = w.ParamDtype
	s.Gradients = w.Gradients
	s.Normalize()
	return s
}

func (w workload) layout() job.Layout {
	s := w.spec("layout")
	return s.Layout()
}

// name is the benchmark-style name of the workload: N=8,Shard=4MiB.
// The runtime count is named when it is not the scenarios' e2eRuntimes.
func (w workload) name() string {
	s := fmt.Sprintf("N=%d,Shard=%s", w.Ranks, mib(w.ShardSize))
	if w.Runtimes != e2eRuntimes {
		s += fmt.Sprintf(",Runtimes=%d", w.Runtimes)
	}
	if w.Gradients != "" {
		s += ",Gradients=" + w.Gradients
	}
	return s
}

// ranker is one worker of a system: it sends its gradients for the next step and returns the
// parameters after it. sdk.Worker is one.
type ranker interface {
	Step(ctx context.Context, grads []float32) ([]float32, error)
}

// system is a running aggregation system with its workers connected.
type system struct {
	ranks    []ranker
	extraCPU func() time.Duration // CPU of other processes doing the system's work (redis-server)
	funcTime func() time.Duration // time fanin's runtimes spent in the function
	check    func() error         // the run was valid: nothing dropped, nothing failed
	observe  func() string        // what happened during the run that explains the figure
	close    func()
	notes    string
}

// cluster drives the ranks of a system in BSP lockstep.
type cluster struct {
	sys   *system
	grads [][]float32
	last  [][]float32 // per rank: the parameters the last step returned
	errs  []error
	steps int64
}

func newCluster(sys *system, grads [][]float32) *cluster {
	return &cluster{sys: sys, grads: grads, last: make([][]float32, len(sys.ranks)), errs: make([]error, len(sys.ranks))}
}

// stepTimeout bounds one step: a system that lost a message fails the measurement instead of
// hanging it.
const stepTimeout = 2 * time.Minute

// step runs one step: every rank publishes and waits for the parameters, concurrently. If a rank
// fails, the step cannot complete (BSP), so the others are cancelled.
func (c *cluster) step(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, r := range c.sys.ranks {
		wg.Go(func() {
			c.last[i], c.errs[i] = r.Step(ctx, c.grads[i])
			if c.errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	c.steps++
	if err := errors.Join(c.errs...); err != nil {
		return fmt.Errorf("step %d: %w", c.steps, err)
	}
	return nil
}

// agree returns the checksum of the parameters every rank holds, or an error if two ranks differ.
func (c *cluster) agree() (uint32, error) {
	var sum uint32
	for i, p := range c.last {
		s := checksum(p)
		if i > 0 && s != sum {
			return 0, fmt.Errorf("rank %d holds parameters different from rank 0's after step %d", i, c.steps)
		}
		sum = s
	}
	return sum, nil
}

// e2eFigure is one measurement of a system.
type e2eFigure struct {
	stepsPerSec float64
	cpu         time.Duration // process CPU (and extraCPU) per step
	funcTime    time.Duration // runtime function time per step
	sum         uint32        // checksum of the parameters after warmup+steps steps
	notes       string        // the system's setup
	observed    string        // what happened during the run that explains the figure
	runs        []float64     // steps/s of every run this figure is the best of
	events      []string      // per run: what was observed, "" when nothing
}

// measure runs warmup steps, then times steps steps.
func measure(ctx context.Context, sys *system, grads [][]float32, warmup, steps int) (e2eFigure, error) {
	c := newCluster(sys, grads)
	for range warmup {
		if err := c.step(ctx); err != nil {
			return e2eFigure{}, err
		}
	}
	extra := func() time.Duration {
		if sys.extraCPU == nil {
			return 0
		}
		return sys.extraCPU()
	}
	fnTime := func() time.Duration {
		if sys.funcTime == nil {
			return 0
		}
		return sys.funcTime()
	}
	cpu0, x0, f0 := processCPU(), extra(), fnTime()
	start := time.Now()
	for range steps {
		if err := c.step(ctx); err != nil {
			return e2eFigure{}, err
		}
	}
	el := time.Since(start)
	f := e2eFigure{
		stepsPerSec: float64(steps) / el.Seconds(),
		cpu:         (processCPU() - cpu0 + extra() - x0) / time.Duration(steps),
		funcTime:    (fnTime() - f0) / time.Duration(steps),
		notes:       sys.notes,
	}
	var err error
	if f.sum, err = c.agree(); err != nil {
		return f, err
	}
	if sys.check != nil {
		if err := sys.check(); err != nil {
			return f, fmt.Errorf("invalid run: %w", err)
		}
	}
	if sys.observe != nil {
		f.observed = sys.observe()
	}
	return f, nil
}

// starter brings a system up for a workload, in dir.
type starter func(ctx context.Context, rs *runState, w workload, dir string) (*system, error)

// measureFresh measures a system started afresh for this measurement only, and brings it down.
func measureFresh(ctx context.Context, rs *runState, start starter, w workload, warmup, steps int) (e2eFigure, error) {
	dir, err := os.MkdirTemp("", "fanin-bench-")
	if err != nil {
		return e2eFigure{}, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	sys, err := start(ctx, rs, w, dir)
	if err != nil {
		return e2eFigure{}, err
	}
	defer sys.close()
	return measure(ctx, sys, rs.gradients(w), warmup, steps)
}

// gradients returns the ranks' gradients for a workload's model size, made once per run.
func (rs *runState) gradients(w workload) [][]float32 {
	g := rs.grads[w.Elements]
	for len(g) < w.Ranks {
		v := make([]float32, w.Elements)
		fillGradient(v, len(g))
		g = append(g, v)
	}
	rs.grads[w.Elements] = g
	return g[:w.Ranks]
}
