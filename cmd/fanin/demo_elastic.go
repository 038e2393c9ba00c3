package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/lab/demo"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/sdk"
)

// elasticDemoSteps is the length of the elastic demo when --steps is 0: it needs an end to plan
// its comings and goings. Each of its five phases lasts 80 steps, 1-3 s here: long enough for the
// steps/s over the rateWindow to show the phase's own speed after the stall that began it.
const elasticDemoSteps = 400

// elasticDemoCompute is the least time one rank's gradient takes, as if on a device: the demo
// model alone computes in microseconds, and then a worker holding four ranks would be no slower
// than one holding one.
const elasticDemoCompute = 10 * time.Millisecond

// runElasticDemo trains the demo model with cfg.ranks logical ranks on elastic workers that come
// and go: four workers start; at 1/5 of the steps one leaves, at 2/5 one dies (its connection
// dropped without a word), at 3/5 another leaves, at 4/5 two join. Each line shows the recent step
// rate and which worker holds which ranks; at the end the parameters are checked, bit for bit,
// against the same job stepped on fixed ranks in this process.
func runElasticDemo(ctx context.Context, st *devstack.Stack, cfg demoConfig, out io.Writer) error {
	steps := int64(cfg.steps)
	if steps == 0 {
		steps = elasticDemoSteps
	}
	if cfg.ranks < 1 || cfg.every < 1 || steps < 10 {
		return fmt.Errorf("demo: --ranks and --every must be >= 1 and --steps >= 10 (or 0) with --elastic")
	}
	prob := demo.NewProblem(demo.DefaultConfig())
	started, err := startDemoJob(ctx, st, cfg, prob)
	if err != nil {
		return err
	}
	admin, rec, creds, init := started.admin, started.rec, started.creds, started.init
	eval := demo.NewModel(prob)
	fmt.Fprintf(out, "\nelastic demo: job %q, %d logical ranks on elastic workers, %d steps, %s lr=%g\n",
		demoJob, cfg.ranks, steps, cfg.function, cfg.lr)
	fmt.Fprintf(out, "plan: 4 workers; at step %d w3 leaves, at %d w2 dies, at %d w1 leaves, at %d w4 and w5 join\n",
		steps/5, 2*steps/5, 3*steps/5, 4*steps/5)
	fmt.Fprintf(out, "steps/s: over the last %v, a stall included; workers: who holds which logical ranks, (the assignment's epoch)\n", rateWindow)
	fmt.Fprintf(out, "%6s  %10s  %9s  %8s  %s\n", "step", "train loss", "test acc", "steps/s", "workers: ranks (epoch)")

	// The workers run under wctx: whatever ends the demo (the last step, a failure, Ctrl-C) stops
	// them and waits for them.
	wctx, stopWorkers := context.WithCancel(ctx)
	d := &elasticDemo{ctx: wctx, st: st, creds: creds, prob: prob, ranks: cfg.ranks, steps: steps,
		losses: map[int64]map[int]float32{}, done: map[int64]time.Time{}, workers: map[string]*demoWorker{}}
	defer func() { stopWorkers(); d.wg.Wait() }()
	d.start("w0")
	d.start("w1")
	d.start("w2")
	d.start("w3")
	type event struct {
		say string
		act func()
	}
	planned := map[int64]event{
		steps / 5:     {"w3 leaves (Leave: its ranks move at once)", func() { d.leave("w3") }},
		2 * steps / 5: {"w2 dies (its connection dropped without a word: its ranks move once fanin misses its beats, 3 s)", func() { d.kill("w2") }},
		3 * steps / 5: {"w1 leaves", func() { d.leave("w1") }},
		4 * steps / 5: {"w4 and w5 join", func() { d.start("w4"); d.start("w5") }},
	}
	// The ticker wakes await, so that a stall is reported while it lasts.
	tickDone := make(chan struct{})
	var tickWG sync.WaitGroup
	tickWG.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tickDone:
				return
			case <-tick.C:
				d.mu.Lock()
				d.cond.Broadcast()
				d.mu.Unlock()
			}
		}
	})
	defer func() { close(tickDone); tickWG.Wait() }()
	start := time.Now()
	for t := int64(1); t <= steps; t++ {
		err := d.await(t, func(waited time.Duration) {
			fmt.Fprintf(out, "%6s  %-31s  %s\n", "..", fmt.Sprintf("waiting %.0f s for step %d", waited.Seconds(), t), d.assignment(admin))
		})
		if err != nil {
			if ctx.Err() != nil { // Ctrl-C
				fmt.Fprintf(out, "\nelastic demo interrupted after step %d\n", t-1)
				return nil
			}
			return err
		}
		if ev, ok := planned[t]; ok {
			fmt.Fprintf(out, "%6s  after step %d: %s\n", "--", t, ev.say)
			ev.act()
		}
		if t%int64(cfg.every) == 0 || t == steps {
			p := d.paramsOf(t)
			_, acc := eval.Evaluate(p)
			fmt.Fprintf(out, "%6d  %10.4f  %9.3f  %8.1f  %s\n", t, d.loss(t), acc, d.rate(t), d.assignment(admin))
		}
	}
	elapsed := time.Since(start)
	if err := d.wait(); err != nil {
		return err
	}

	// The same job on fixed ranks: every rank's gradient at every step, from the reference's
	// parameters, in this process.
	fn, err := rec.Spec.NewFunc()
	if err != nil {
		return err
	}
	ref := functions.NewReference(fn, cfg.ranks, rec.Layout.Ranges(), init)
	model := demo.NewModel(prob)
	grads := make([][]float32, cfg.ranks)
	for r := range grads {
		grads[r] = make([]float32, len(init))
	}
	for t := int64(1); t <= steps; t++ {
		for r := range grads {
			model.Gradient(ref.Params(), r, cfg.ranks, t, grads[r])
		}
		ref.Step(grads, nil)
	}
	final := d.paramsOf(steps)
	same := bytes.Equal(f32le(final), f32le(ref.Params()))
	_, acc := eval.Evaluate(final)
	fmt.Fprintf(out, "\nelastic demo finished: %d steps in %.2fs on 4, 3, 2, 1, then 3 workers; test accuracy %.3f\n", steps, elapsed.Seconds(), acc)
	if !same {
		return fmt.Errorf("demo: the parameters after step %d DIFFER from the same job on %d fixed ranks", steps, cfg.ranks)
	}
	fmt.Fprintf(out, "the parameters after step %d are bit-identical to the same job on %d fixed ranks\n", steps, cfg.ranks)
	return nil
}

func f32le(v []float32) []byte {
	b := make([]byte, 4*len(v))
	functions.EncodeLE(b, v)
	return b
}

// elasticDemo runs the demo's elastic workers.
type elasticDemo struct {
	ctx   context.Context
	st    *devstack.Stack
	creds []sdk.Option
	prob  *demo.Problem
	ranks int
	steps int64
	wg    sync.WaitGroup

	mu      sync.Mutex
	cond    *sync.Cond
	losses  map[int64]map[int]float32 // step -> rank -> loss
	done    map[int64]time.Time       // steps some worker completed
	params  map[int64][]float32       // parameters of the steps a line shows
	workers map[string]*demoWorker
	err     error
}

type demoWorker struct {
	client *sdk.Client
	e      *sdk.Elastic
	leave  bool // leave after the current step
	killed bool
}

func (d *elasticDemo) start(id string) {
	d.mu.Lock()
	if d.cond == nil {
		d.cond = sync.NewCond(&d.mu)
		d.params = map[int64][]float32{}
	}
	w := &demoWorker{}
	d.workers[id] = w
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := d.run(id, w); err != nil {
			d.mu.Lock()
			if !w.killed && d.err == nil {
				d.err = fmt.Errorf("worker %s: %w", id, err)
			}
			d.cond.Broadcast()
			d.mu.Unlock()
		}
	}()
}

func (d *elasticDemo) run(id string, w *demoWorker) error {
	c, err := sdk.Connect(d.ctx, d.st.URL, d.creds...)
	if err != nil {
		return err
	}
	defer c.Close()
	e, err := c.Elastic(d.ctx, demoJob, sdk.WithWorkerID(id))
	if err != nil {
		return err
	}
	d.mu.Lock()
	w.client, w.e = c, e
	d.mu.Unlock()
	model := demo.NewModel(d.prob)
	grad := func(_ context.Context, rank int, step int64, params, g []float32) error {
		began := time.Now()
		loss := model.Gradient(params, rank, d.ranks, step, g)
		time.Sleep(elasticDemoCompute - time.Since(began))
		d.mu.Lock()
		if d.losses[step] == nil {
			d.losses[step] = map[int]float32{}
		}
		d.losses[step][rank] = loss
		d.mu.Unlock()
		return nil
	}
	for e.StepCount() < d.steps {
		p, err := e.Step(d.ctx, grad)
		if err != nil {
			return err
		}
		t := e.StepCount()
		d.mu.Lock()
		if _, ok := d.done[t]; !ok {
			d.done[t] = time.Now()
			d.params[t] = slices.Clone(p)
			d.cond.Broadcast()
		}
		leave := w.leave
		d.mu.Unlock()
		if leave {
			break
		}
	}
	return e.Leave(d.ctx)
}

// await waits until some worker completed step t. While it waits, every stallEvery, it calls
// onStall (without the lock) with the time waited: a stall shows while it lasts.
func (d *elasticDemo) await(t int64, onStall func(waited time.Duration)) error {
	began := time.Now()
	next := stallEvery
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		if _, ok := d.done[t]; ok {
			return nil
		}
		if d.err != nil {
			return d.err
		}
		if err := d.ctx.Err(); err != nil {
			return err
		}
		if waited := time.Since(began); waited >= next {
			next += stallEvery
			d.mu.Unlock()
			onStall(waited)
			d.mu.Lock()
			continue
		}
		d.cond.Wait() // woken by a step, a failure, or the demo's ticker
	}
}

// stallEvery is how often a line says that the job waits for a step.
const stallEvery = time.Second

func (d *elasticDemo) paramsOf(t int64) []float32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	for old := range d.params { // keep the recent ones only
		if old < t-10 {
			delete(d.params, old)
		}
	}
	return d.params[t]
}

func (d *elasticDemo) loss(t int64) float32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var sum float32
	for _, l := range d.losses[t] {
		sum += l
	}
	n := len(d.losses[t])
	for old := range d.losses {
		if old < t-10 {
			delete(d.losses, old)
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float32(n)
}

// rateWindow is how far back the demo's steps/s looks: short, so that a change shows at once.
const rateWindow = time.Second

// rate is the steps/s over the rateWindow before step t was completed.
func (d *elasticDemo) rate(t int64) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return recentRate(d.done, t, rateWindow)
}

// recentRate is the steps/s up to step t from done (when each step completed), over at least
// window: from the newest step completed window or more before t (or the
// oldest known) to t. A stall within the window lowers it: it counts the time, not only the steps.
func recentRate(done map[int64]time.Time, t int64, window time.Duration) float64 {
	end, ok := done[t]
	if !ok {
		return 0
	}
	from := t
	for s := t - 1; ; s-- {
		at, ok := done[s]
		if !ok {
			break
		}
		from = s
		if end.Sub(at) >= window {
			break
		}
	}
	if from == t {
		return 0
	}
	return float64(t-from) / end.Sub(done[from]).Seconds()
}

func (d *elasticDemo) leave(id string) {
	d.mu.Lock()
	d.workers[id].leave = true
	d.mu.Unlock()
}

// kill drops a worker's connection without a word, as a process killed would: its ranks move once
// the autoscaler misses its beats.
func (d *elasticDemo) kill(id string) {
	d.mu.Lock()
	w := d.workers[id]
	w.killed = true
	c := w.client
	d.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

func (d *elasticDemo) wait() error {
	d.wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	if errors.Is(d.err, context.Canceled) && d.ctx.Err() != nil {
		return nil
	}
	return d.err
}

// assignment is the job's workers and their ranks as the gateway shows them.
func (d *elasticDemo) assignment(admin *sdk.Admin) string {
	ctx, cancel := context.WithTimeout(d.ctx, 2*time.Second)
	defer cancel()
	ws, err := admin.Workers(ctx, demoJob)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	var parts []string
	for _, w := range ws.Workers {
		parts = append(parts, fmt.Sprintf("%s%v", w.ID, w.Ranks))
	}
	if len(parts) == 0 {
		parts = append(parts, "none")
	}
	return fmt.Sprintf("%s (%d)", strings.Join(parts, " "), ws.Epoch)
}
