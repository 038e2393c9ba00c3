package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/internal/demo"
	"github.com/fanin-ml/fanin/internal/devstack"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// The elastic scenario: the demo model (internal/demo) with 4 logical ranks, each rank's gradient
// taking rankCompute as if on a device.
//
//   - absorb: 4 elastic workers; one's connection is dropped without a word (a worker killed), and
//     the time from the last step completed before to the next step completed after is measured,
//     against the lapse that bounds it (wire.WorkerLapse after the last beat).
//   - slow worker: one of 4 workers takes twice its peers' time per step; steps/s and the test
//     accuracy reached after a fixed wall time, under ssp (s = 2) and asp against bsp.
const rankCompute = 10 * time.Millisecond

func (rs *runState) elasticRounds() (kills int, wall time.Duration) {
	// Short walls: the demo model reaches its plateau (test accuracy ~0.92) in about 10 s whatever
	// the mode, and the difference that matters is how far each gets while it is still learning.
	if rs.cfg.Quick {
		return 2, 2 * time.Second
	}
	return 5, 3 * time.Second
}

func runElastic(ctx context.Context, rs *runState) ([]Result, error) {
	kills, wall := rs.elasticRounds()
	absorb, err := benchAbsorb(ctx, rs, kills)
	if err != nil {
		return nil, fmt.Errorf("absorb: %w", err)
	}
	slow, err := benchSlowWorker(ctx, rs, wall)
	if err != nil {
		return nil, fmt.Errorf("slow worker: %w", err)
	}
	return append(absorb, slow...), nil
}

// demoStack starts fanin and creates the demo job (sync mode given), its initial parameters uploaded.
func demoStack(ctx context.Context, rs *runState, id, mode string, staleness int) (*devstack.Stack, *job.Record, *demo.Problem, func(), error) {
	dir, err := os.MkdirTemp("", "fanin-bench-")
	if err != nil {
		return nil, nil, nil, nil, err
	}
	st, err := devstack.Start(ctx, devstack.Config{DataDir: dir, NATSPort: -1, Runtimes: 2, Logger: rs.stackLog})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, nil, nil, err
	}
	done := func() { st.Close(); os.RemoveAll(dir) }
	prob := demo.NewProblem(demo.DefaultConfig())
	spec := job.Spec{ID: id, Ranks: 4, Sync: mode, Staleness: staleness,
		Function: job.Function{Name: "adam", Hyper: map[string]float64{"lr": 0.01}}, Init: job.Init{Kind: "upload"}, ShardSize: 4 << 10}
	for _, t := range prob.Tensors() {
		spec.Tensors = append(spec.Tensors, job.Tensor{Name: t.Name, Shape: t.Shape})
	}
	rec, err := st.Gateway.CreateJob(ctx, spec)
	if err == nil {
		var c *sdk.Client
		if c, err = sdk.Connect(ctx, st.URL); err == nil {
			err = c.UploadParams(ctx, id, prob.InitParams(1))
			c.Close()
		}
	}
	if err != nil {
		done()
		return nil, nil, nil, nil, err
	}
	return st, rec, prob, done, nil
}

// computeFor sleeps what is left of d since began: a rank's gradient on a device.
func computeFor(began time.Time, d time.Duration) { time.Sleep(d - time.Since(began)) }

func benchAbsorb(ctx context.Context, rs *runState, kills int) ([]Result, error) {
	st, _, prob, done, err := demoStack(ctx, rs, "absorb", "bsp", 0)
	if err != nil {
		return nil, err
	}
	defer done()
	var mu sync.Mutex
	completed := map[int64]time.Time{}
	clients := map[string]*sdk.Client{}
	var wg sync.WaitGroup
	wctx, stop := context.WithCancel(ctx)
	defer func() { stop(); wg.Wait() }()
	start := func(id string) error {
		c, err := sdk.Connect(wctx, st.URL)
		if err != nil {
			return err
		}
		e, err := c.Elastic(wctx, "absorb", sdk.WithWorkerID(id))
		if err != nil {
			c.Close()
			return err
		}
		mu.Lock()
		clients[id] = c
		mu.Unlock()
		model := demo.NewModel(prob)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			grad := func(_ context.Context, rank int, step int64, p, g []float32) error {
				began := time.Now()
				model.Gradient(p, rank, 4, step, g)
				computeFor(began, rankCompute)
				return nil
			}
			for wctx.Err() == nil {
				if _, err := e.Step(wctx, grad); err != nil {
					return // killed, or the bench is over
				}
				mu.Lock()
				if _, ok := completed[e.StepCount()]; !ok {
					completed[e.StepCount()] = time.Now()
				}
				mu.Unlock()
			}
		}()
		return nil
	}
	newest := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		var n int64
		for s := range completed {
			n = max(n, s)
		}
		return n
	}
	waitStep := func(s int64) error {
		for newest() < s {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	}
	for i := range 4 {
		if err := start(fmt.Sprint("w", i)); err != nil {
			return nil, err
		}
	}
	var gaps, steps []time.Duration
	next := 4
	for k := range kills {
		if err := waitStep(newest() + 30); err != nil {
			return nil, err
		}
		mu.Lock()
		victim := fmt.Sprint("w", k) // the oldest workers go first
		c := clients[victim]
		before := int64(0)
		for s := range completed {
			before = max(before, s)
		}
		steps = append(steps, completed[before].Sub(completed[before-10])/10)
		mu.Unlock()
		killed := time.Now()
		c.Close()
		if err := waitStep(before + 2); err != nil {
			return nil, err
		}
		mu.Lock()
		var last, first time.Time
		for _, at := range completed {
			if at.Before(killed) && at.After(last) {
				last = at
			}
			if at.After(killed) && (first.IsZero() || at.Before(first)) {
				first = at
			}
		}
		mu.Unlock()
		gaps = append(gaps, first.Sub(last))
		rs.printf("  elastic absorb: kill %d: %v from the last step before to the first after", k+1, first.Sub(last).Round(time.Millisecond))
		if err := start(fmt.Sprint("w", next)); err != nil { // a replacement: four again
			return nil, err
		}
		next++
	}
	slices.Sort(gaps)
	slices.Sort(steps)
	med := gaps[len(gaps)/2]
	r := latency(Result{
		Scenario: "elastic", Case: "absorb a lost worker", Metric: "s from the last step before a worker's death to the next",
		Baseline: "the lapse after which a silent worker is dead (3 s after its last beat)",
		Fanin:    med.Seconds(), Base: wire.WorkerLapse.Seconds(),
		Setup: fmt.Sprintf("the demo model, 4 logical ranks on 4 elastic workers (each rank's gradient %v), adam; %d kills (a connection dropped without a word), a replacement joining after each", rankCompute, kills),
		Notes: fmt.Sprintf("median of %d; max %v; a step took %v before each kill (median): the death costs about lapse - (time since the last beat) + one step",
			len(gaps), gaps[len(gaps)-1].Round(time.Millisecond), steps[len(steps)/2].Round(time.Millisecond)),
	})
	return []Result{r}, nil
}

// benchSlowWorker runs 4 plain workers, rank 3 at twice the others' compute, for wall under each
// sync mode, and reports steps/s and the test accuracy at the end against bsp's.
func benchSlowWorker(ctx context.Context, rs *runState, wall time.Duration) ([]Result, error) {
	type outcome struct {
		rate, acc float64
	}
	// compute is how long rank r takes at step t: rank 3 twice the others (slow), or every rank a
	// draw in [5, 35) ms at every step (jitter: different ranks are the straggler at different steps).
	slowRank := func(r int, _ int64) time.Duration {
		if r == 3 {
			return 2 * rankCompute
		}
		return rankCompute
	}
	jitter := func(r int, t int64) time.Duration {
		z := uint64(t)*0x9E3779B97F4A7C15 ^ uint64(r+1)*0xBF58476D1CE4E5B9
		z = (z ^ (z >> 31)) * 0xD6E8FEB86659FD93
		z ^= z >> 32
		return 5*time.Millisecond + time.Duration(z%30000)*time.Microsecond
	}
	run := func(mode string, s int, compute func(int, int64) time.Duration) (outcome, error) {
		st, rec, prob, done, err := demoStack(ctx, rs, "slow-"+mode, mode, s)
		if err != nil {
			return outcome{}, err
		}
		defer done()
		wctx, stop := context.WithTimeout(ctx, wall)
		defer stop()
		var wg sync.WaitGroup
		own := make([]int64, 4)
		errs := make(chan error, 4)
		for r := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := sdk.Connect(ctx, st.URL)
				if err != nil {
					errs <- err
					return
				}
				defer c.Close()
				w, err := c.Worker(ctx, rec.Spec.ID, r)
				if err != nil {
					errs <- err
					return
				}
				defer w.Close()
				_, p, err := w.Params(ctx)
				if err != nil {
					errs <- err
					return
				}
				model := demo.NewModel(prob)
				g := make([]float32, len(p))
				for step := int64(1); wctx.Err() == nil; step++ {
					began := time.Now()
					model.Gradient(p, r, 4, step, g)
					computeFor(began, compute(r, step))
					if p, err = w.Step(wctx, g); err != nil {
						break // the wall time is over (or a failure: reported below if before it)
					}
					own[r] = step
				}
				if wctx.Err() == nil {
					errs <- fmt.Errorf("rank %d: %w", r, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			return outcome{}, err
		}
		// The job's parameters at the end, as the stream holds them (each shard's newest).
		nc, err := nats.Connect(st.URL)
		if err != nil {
			return outcome{}, err
		}
		defer nc.Close()
		p := make([]float32, rec.Layout.Elements)
		var versions []int64
		for _, sh := range rec.Layout.Shards {
			m, err := nc.RequestWithContext(ctx, wire.DirectGetLast(wire.ParamsStream(rec.Spec.ID), wire.ParamsSubject(rec.Spec.ID, sh.ID)), nil)
			if err != nil {
				return outcome{}, err
			}
			v, err := wire.ParseStep(m.Header)
			if err != nil || len(m.Data) != sh.Bytes() {
				return outcome{}, fmt.Errorf("parameters of shard %d: %v (%d bytes)", sh.ID, err, len(m.Data))
			}
			versions = append(versions, v)
			functions.CopyLE(p[sh.Off:sh.Off+sh.Len], m.Data)
		}
		_, acc := demo.NewModel(prob).Evaluate(p)
		// Steps of the job: bsp and ssp, the shards' (slowest) version; asp, a version is one
		// rank's update, so versions / ranks.
		steps := float64(slices.Min(versions))
		if mode == "asp" {
			steps /= 4
		}
		rs.printf("  elastic: %s: %.0f steps in %v (ranks' own steps %v), test accuracy %.3f", mode, steps, wall, own, acc)
		return outcome{rate: steps / wall.Seconds(), acc: float64(acc)}, nil
	}
	var out []Result
	setup := fmt.Sprintf("the demo model, 4 ranks on 4 workers, adam, %v of training each; slow worker: ranks 0-2 compute %v per step, rank 3 %v; jitter: every rank a draw in [5, 35) ms per step", wall, rankCompute, 2*rankCompute)
	for _, load := range []struct {
		name    string
		compute func(int, int64) time.Duration
	}{{"slow worker", slowRank}, {"jitter", jitter}} {
		rs.printf("  elastic: %s", load.name)
		bsp, err := run("bsp", 0, load.compute)
		if err != nil {
			return nil, err
		}
		for _, m := range []struct {
			mode, name string
			s          int
		}{{"ssp", "ssp s=2", 2}, {"asp", "asp", 0}} {
			o, err := run(m.mode, m.s, load.compute)
			if err != nil {
				return nil, err
			}
			out = append(out,
				throughput(Result{Scenario: "elastic", Case: load.name + " " + m.name, Metric: "steps/s", Baseline: "bsp, the same workers",
					Fanin: o.rate, Base: bsp.rate, Setup: setup, Notes: "asp: a step is four updates, one per rank"}),
				throughput(Result{Scenario: "elastic", Case: load.name + " " + m.name, Metric: fmt.Sprintf("test accuracy after %v", wall), Baseline: "bsp, the same workers",
					Fanin: o.acc, Base: bsp.acc, Setup: setup}))
		}
	}
	return out, nil
}
