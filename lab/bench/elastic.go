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
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/demo"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// The elastic scenario: the demo model (lab/demo) with 4 logical ranks, each rank's gradient
// taking rankCompute as if on a device.
//
//   - absorb (absorb.go): 4 elastic worker processes; one is SIGKILLed, and the time from the last
//     step completed before to the next step completed after is measured and split into the
//     detection (wire.WorkerLapse after the last beat) and the rest.
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
