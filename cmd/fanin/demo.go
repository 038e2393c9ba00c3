package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/internal/rate"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/demo"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/sdk/prom"
)

type demoConfig struct {
	steps, ranks, every int
	function            string
	lr                  float64
}

const demoJob = "demo"

// demoStarted is the demo job as startDemoJob made it.
type demoStarted struct {
	admin *sdk.Admin
	rec   *job.Record
	creds []sdk.Option // the job's own NATS credentials, when fanin dev runs with auth
	init  []float32    // the initial parameters, uploaded
}

// startDemoJob replaces the previous demo job, if any, with one of cfg's ranks and function for
// prob's model, and uploads its initial parameters.
func startDemoJob(ctx context.Context, st *devstack.Stack, cfg demoConfig, prob *demo.Problem) (*demoStarted, error) {
	admin := sdk.NewAdmin(st.HTTPURL, sdk.WithToken(st.AdminToken))
	if err := admin.DeleteJob(ctx, demoJob); err != nil && !sdk.IsNotFound(err) {
		return nil, fmt.Errorf("demo: remove the previous demo job: %w", err)
	}
	spec := job.Spec{
		ID: demoJob, Ranks: cfg.ranks,
		Function:  job.Function{Name: cfg.function, Hyper: map[string]float64{"lr": cfg.lr}},
		Init:      job.Init{Kind: "upload"},
		ShardSize: 4 << 10,
	}
	for _, t := range prob.Tensors() {
		spec.Tensors = append(spec.Tensors, job.Tensor{Name: t.Name, Shape: t.Shape})
	}
	created, err := admin.SubmitJob(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("demo: create job: %w", err)
	}
	d := &demoStarted{admin: admin, rec: &created.Record, init: prob.InitParams(1)}
	if created.Credentials != nil {
		d.creds = append(d.creds, sdk.WithJobCredentials(created.Credentials))
	}
	c, err := sdk.Connect(ctx, st.URL, d.creds...)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.UploadParams(ctx, demoJob, d.init); err != nil {
		return nil, err
	}
	return d, nil
}

// runDemo trains the demo MLP with cfg.ranks workers, each a separate fanin client, through the
// stack: the job is created over HTTP, initial parameters are uploaded, and every step's gradients
// go through JetStream and the runtimes like any user's.
func runDemo(ctx context.Context, st *devstack.Stack, cfg demoConfig, out io.Writer) error {
	if cfg.ranks < 1 || cfg.every < 1 || cfg.steps < 0 {
		return fmt.Errorf("demo: --ranks and --every must be >= 1 and --steps >= 0")
	}
	prob := demo.NewProblem(demo.DefaultConfig())
	started, err := startDemoJob(ctx, st, cfg, prob)
	if err != nil {
		return err
	}
	rec, creds, init := started.rec, started.creds, started.init
	var shapes []string
	for _, t := range prob.Tensors() {
		shapes = append(shapes, fmt.Sprintf("%s%v", t.Name, t.Shape))
	}
	eval := demo.NewModel(prob)
	loss0, acc0 := eval.Evaluate(init)
	fmt.Fprintf(out, "\ndemo: job %q, MLP %s, %d parameters in %d shards, %d workers, %s lr=%g\n",
		demoJob, strings.Join(shapes, " "), rec.Layout.Elements, rec.Layout.NumShards(), cfg.ranks, cfg.function, cfg.lr)
	fmt.Fprintf(out, "%6s  %10s  %9s  %9s  %8s\n", "step", "train loss", "test loss", "test acc", "steps/s")
	fmt.Fprintf(out, "%6d  %10s  %9.4f  %9.3f  %8s\n", 0, "-", loss0, acc0, "-")

	// Each worker sends its loss per step; rank 0 also its parameters when a line is due.
	type report struct {
		rank   int
		step   int64
		loss   float32
		params []float32
	}
	reports := make(chan report, 4*cfg.ranks)
	g, gctx := errgroup.WithContext(ctx)
	for r := range cfg.ranks {
		g.Go(func() error {
			// The workers' metrics join fanin's at the dev stack's /metrics (fanin_worker_*).
			wc, err := sdk.Connect(gctx, st.URL, append(creds[:len(creds):len(creds)], prom.WithMetrics(metrics.Default().Registry()))...)
			if err != nil {
				return err
			}
			defer wc.Close()
			w, err := wc.Worker(gctx, demoJob, r)
			if err != nil {
				return err
			}
			defer w.Close()
			step, params, err := w.Params(gctx)
			if err != nil {
				return err
			}
			model := demo.NewModel(prob)
			grad := make([]float32, len(params))
			for cfg.steps == 0 || step < int64(cfg.steps) {
				loss := model.Gradient(params, r, cfg.ranks, step+1, grad)
				if params, err = w.Step(gctx, grad); err != nil {
					return fmt.Errorf("rank %d step %d: %w", r, step+1, err)
				}
				step++
				rep := report{rank: r, step: step, loss: loss}
				if r == 0 && (step%int64(cfg.every) == 0 || step == int64(cfg.steps)) {
					rep.params = append([]float32(nil), params...)
				}
				select {
				case reports <- rep:
				case <-gctx.Done():
					return gctx.Err()
				}
			}
			return nil
		})
	}
	go func() { _ = g.Wait(); close(reports) }()

	start := time.Now()
	// steps/s of a line is recent (over rate.Window, fanin's one estimator, as view.JobRate uses it
	// for the dashboard, top and a job's status), not the mean since the start: a change of speed
	// shows. Until it spans half a second, the mean since the start stands in.
	var recent rate.Steps
	recent.Add(start, 0)
	losses := map[int64][]float32{}
	var last []float32
	var firstLoss, lastLoss float32
	var done int64
	pending := map[int64][]float32{} // rank 0's parameters, waiting for the other ranks' losses
	for rep := range reports {
		losses[rep.step] = append(losses[rep.step], rep.loss)
		if rep.params != nil {
			pending[rep.step] = rep.params
		}
		if len(losses[rep.step]) < cfg.ranks {
			continue
		}
		var sum float32
		for _, l := range losses[rep.step] {
			sum += l
		}
		mean := sum / float32(cfg.ranks)
		delete(losses, rep.step)
		if rep.step == 1 {
			firstLoss = mean
		}
		lastLoss, done = mean, max(done, rep.step)
		now := time.Now()
		recent.Add(now, done)
		if p, ok := pending[rep.step]; ok {
			delete(pending, rep.step)
			last = p
			tl, acc := eval.Evaluate(p)
			speed := recent.Rate()
			if speed == 0 {
				speed = float64(done) / now.Sub(start).Seconds()
			}
			fmt.Fprintf(out, "%6d  %10.4f  %9.4f  %9.3f  %8.1f\n", rep.step, mean, tl, acc, speed)
		}
	}
	err = g.Wait()
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		err = nil // Ctrl-C
	}
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	elapsed := time.Since(start)
	var inv, bytesIn, rejects int64
	for _, rt := range st.AllRuntimes() {
		s := rt.Stats()
		inv += s.Invocations
		bytesIn += s.BytesIn
		for _, n := range s.Rejects {
			rejects += n
		}
	}
	_, acc := eval.Evaluate(last)
	if last == nil {
		acc = acc0
	}
	fmt.Fprintf(out, "\ndemo finished: %d steps in %.2fs (%.1f steps/s); train loss %.4f -> %.4f; test accuracy %.3f -> %.3f\n",
		done, elapsed.Seconds(), float64(done)/elapsed.Seconds(), firstLoss, lastLoss, acc0, acc)
	fmt.Fprintf(out, "fanin applied %d shard updates over %d runtimes, aggregating %.1f MB of gradients; %d inputs rejected\n",
		inv, len(st.AllRuntimes()), float64(bytesIn)/1e6, rejects)
	return nil
}
