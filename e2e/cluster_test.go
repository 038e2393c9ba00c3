package e2e

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// trainer drives a job with four SDK workers and checks every step against the reference.
type trainer struct {
	t       *testing.T
	workers []*sdk.Worker
	ref     *functions.Reference
	params  []float32
	grads   [][]float32
	dts     []wire.Dtype // per rank, when the workers publish 16-bit gradients (WithGradDtype)
	rounded [][]float32  // the gradients as the runtimes see them: the reference's input
	step    int64
	onStall func() // called when a step fails for good, before the test stops (diagnostics)

	// A job with param_dtype bf16: its workers hold the reference's f32 parameters rounded to
	// paramDt after step 0, and hist keeps the reference's f32 parameters of every step (what
	// the checkpoints must hold).
	paramDt  wire.Dtype
	want     []float32   // the reference's parameters as the workers must hold them
	hist     [][]float32 // hist[step]: the reference's f32 parameters after step (bf16 jobs)
	roundedP int         // steps whose rounded parameters differed from the f32 ones (bf16 jobs)
	// inStep, when set, is called on the test's goroutine while step's gradients are being
	// published (the workers' Step calls run): a fault injected there hits the step mid-way.
	inStep func(step int64)
}

// newTrainer makes the trainer; with dts (one per rank) its workers publish their gradients in
// those dtypes, and the reference is fed the gradients rounded to them.
func newTrainer(t *testing.T, url string, rec *job.Record, dts ...wire.Dtype) *trainer {
	t.Helper()
	return newTrainerWith(t, url, rec, nil, dts...)
}

// newTrainerWith is newTrainer whose workers connect with opts (a secured cluster's credentials).
func newTrainerWith(t *testing.T, url string, rec *job.Record, opts []sdk.Option, dts ...wire.Dtype) *trainer {
	t.Helper()
	ctx := context.Background()
	tr := &trainer{t: t, workers: make([]*sdk.Worker, rec.Spec.Ranks)}
	if len(dts) > 0 {
		tr.dts = dts[:rec.Spec.Ranks]
	}
	for r := range tr.workers {
		c, err := sdk.Connect(ctx, url, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		var wopts []sdk.WorkerOption
		if tr.dts != nil {
			wopts = append(wopts, sdk.WithGradDtype(tr.dts[r]))
			tr.rounded = append(tr.rounded, make([]float32, rec.Layout.Elements))
		}
		if tr.workers[r], err = c.Worker(ctx, rec.Spec.ID, r, wopts...); err != nil {
			t.Fatal(err)
		}
	}
	_, init, err := tr.workers[0].Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fn, _ := rec.Spec.NewFunc()
	tr.ref = functions.NewReference(fn, rec.Spec.Ranks, rec.Layout.Ranges(), init)
	tr.params = slices.Clone(init)
	if tr.paramDt = rec.Spec.ParamsDtype(); tr.paramDt != wire.F32 {
		tr.want = make([]float32, len(init))
		tr.hist = [][]float32{slices.Clone(init)}
	}
	for range tr.workers {
		tr.grads = append(tr.grads, make([]float32, len(init)))
	}
	return tr
}

// run trains until step `to`; a Step that fails (e.g. while NATS restarts) is retried.
func (tr *trainer) run(to int64) {
	t := tr.t
	t.Helper()
	for tr.step < to {
		step := tr.step + 1
		for r := range tr.workers {
			testutil.Gradient(tr.grads[r], tr.params, step, r)
		}
		results := make([][]float32, len(tr.workers))
		var wg sync.WaitGroup
		deadline := time.Now().Add(90 * time.Second)
		for r, w := range tr.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					ctx, cancel := context.WithDeadline(context.Background(), deadline)
					p, err := w.Step(ctx, tr.grads[r])
					cancel()
					if err == nil {
						results[r] = p
						return
					}
					if time.Now().After(deadline) {
						t.Errorf("step %d rank %d: %v", step, r, err)
						return
					}
					time.Sleep(200 * time.Millisecond) // NATS may be restarting: retry the same step
				}
			}()
		}
		if tr.inStep != nil {
			tr.inStep(step)
		}
		wg.Wait()
		if t.Failed() {
			if tr.onStall != nil {
				tr.onStall()
			}
			t.FailNow()
		}
		ref := tr.grads
		if tr.dts != nil {
			for r := range tr.grads {
				wire.Round(tr.rounded[r], tr.grads[r], tr.dts[r])
			}
			ref = tr.rounded
		}
		tr.ref.Step(ref, nil)
		want := tr.ref.Params()
		if tr.paramDt != wire.F32 { // the workers' copy: the f32 master parameters, rounded
			tr.hist = append(tr.hist, slices.Clone(want))
			wire.Round(tr.want, want, tr.paramDt)
			if !bytes.Equal(f32bytes(tr.want), f32bytes(want)) {
				tr.roundedP++
			}
			want = tr.want
		}
		for r := range results {
			if !bytes.Equal(f32bytes(results[r]), f32bytes(want)) {
				t.Fatalf("step %d: rank %d's parameters differ from the reference", step, r)
			}
		}
		tr.params = append(tr.params[:0], results[0]...)
		tr.step = step
	}
}

func clusterSpec(id, fn string) job.Spec {
	return job.Spec{
		ID:        id,
		Tensors:   []job.Tensor{{Name: "w", Shape: []int{96, 64}}, {Name: "b", Shape: []int{64}}},
		Ranks:     4,
		Function:  job.Function{Name: fn, Hyper: map[string]float64{"lr": 0.01}},
		Init:      job.Init{Kind: "uniform", Seed: 11, Scale: 0.1},
		ShardSize: 4 << 10,
		Storage:   "file",
	}
}

// TestRepeatedKills SIGKILLs a runtime process three times during training, each time starting a
// replacement: the survivors recover the dead runtime's shards from their checkpoints and the
// stream, and every step stays bit-exact.
func TestRepeatedKills(t *testing.T) {
	t.Parallel()
	skipShort(t)
	c := startCluster(t, "rt-0", "rt-1", "rt-2")
	rec, err := sdk.NewAdmin(c.api).CreateJob(context.Background(), clusterSpec("kills", "adam"))
	if err != nil {
		t.Fatal(err)
	}
	tr := newTrainer(t, c.url, rec)
	victims := []string{"rt-1", "rt-0", "rt-3"}
	for i, victim := range victims {
		tr.run(int64(8 * (i + 1)))
		c.kill(victim)
		c.addRuntime(t, []string{"rt-3", "rt-4", "rt-5"}[i])
	}
	tr.run(32)
	t.Logf("trained %d steps bit-exact across %d SIGKILLs", tr.step, len(victims))
}

// TestNATSRestart restarts the NATS server (file storage) in the middle of training: clients
// reconnect, runtimes resume from the stored streams, and every step stays bit-exact.
func TestNATSRestart(t *testing.T) {
	skipShort(t)
	c := startCluster(t, "rt-0", "rt-1")
	rec, err := sdk.NewAdmin(c.api).CreateJob(context.Background(), clusterSpec("restart", "momentum"))
	if err != nil {
		t.Fatal(err)
	}
	tr := newTrainer(t, c.url, rec)
	tr.run(10)
	c.restartNATS(t)
	tr.run(25)
	for id, p := range c.runtimes {
		select {
		case <-p.done:
			t.Fatalf("runtime %s exited across the NATS restart:\n%s", id, p.output())
		default:
		}
	}
	t.Logf("trained %d steps bit-exact across a NATS restart", tr.step)
}
