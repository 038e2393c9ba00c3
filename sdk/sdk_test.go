package sdk_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/internal/testutil"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

func spec(id, fn string, ranks int) job.Spec {
	return job.Spec{
		ID: id, Ranks: ranks, ShardSize: 4 << 10,
		Tensors:  []job.Tensor{{Name: "w", Shape: []int{3000}}},
		Function: job.Function{Name: fn, Hyper: map[string]float64{}},
		Init:     job.Init{Kind: "uniform", Seed: 5, Scale: 1},
	}
}

func bits(v []float32) []byte {
	b := make([]byte, 4*len(v))
	functions.EncodeLE(b, v)
	return b
}

// A rank's non-finite gradient fails its Step with the runtime's reason; a corrected retry of the
// same step then succeeds and the result is the reference's. The worker metrics count it all.
func TestStepReportsRejectionThenRetrySucceeds(t *testing.T) {
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := spec("nan", "sgd", 2)
	s.Function.Hyper["lr"] = 0.1
	rec, err := sdk.NewAdmin(st.HTTPURL).CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	c, err := sdk.Connect(ctx, st.URL, sdk.WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w0, _ := c.Worker(ctx, rec.Spec.ID, 0)
	w1, _ := c.Worker(ctx, rec.Spec.ID, 1)
	_, init, err := w0.Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 2, rec.Layout.Ranges(), init)

	g0, g1 := make([]float32, len(init)), make([]float32, len(init))
	testutil.Gradient(g0, init, 1, 0)
	testutil.Gradient(g1, init, 1, 1)
	bad := append([]float32(nil), g1...)
	bad[1500] = float32(math.Inf(1))

	var wg sync.WaitGroup
	var p0 []float32
	var err0 error
	wg.Add(1)
	go func() { defer wg.Done(); p0, err0 = w0.Step(ctx, g0) }()
	_, err = w1.Step(ctx, bad)
	if !errors.Is(err, wire.ErrReason(wire.ReasonNonFinite)) {
		t.Fatalf("Step with Inf: %v, want a non_finite rejection", err)
	}
	p1, err := w1.Step(ctx, g1) // the same step again, corrected
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	wg.Wait()
	if err0 != nil {
		t.Fatal(err0)
	}
	ref.Step([][]float32{g0, g1}, nil)
	if !bytes.Equal(bits(p0), bits(ref.Params())) || !bytes.Equal(bits(p1), bits(ref.Params())) {
		t.Fatal("parameters after the retried step differ from the reference")
	}

	grad := float64(4 * len(init))
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{sdk.WorkerSteps, map[string]string{"fanin_job": "nan", "rank": "0"}, 1},
		{sdk.WorkerSteps, map[string]string{"fanin_job": "nan", "rank": "1"}, 1},
		{sdk.WorkerStepErrors, map[string]string{"fanin_job": "nan", "rank": "1", "reason": "non_finite"}, 1},
		{sdk.WorkerGradientBytes, map[string]string{"fanin_job": "nan", "rank": "1"}, 2 * grad}, // the bad one and its retry
		{sdk.WorkerGradientBytes, map[string]string{"fanin_job": "nan", "rank": "0"}, grad},
		{sdk.WorkerStepSeconds, map[string]string{"fanin_job": "nan", "rank": "1"}, 1}, // observations
		{sdk.WorkerPublishSeconds, map[string]string{"fanin_job": "nan", "rank": "1"}, 2},
	} {
		if got := gathered(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// gathered is the value of the series name{labels} in reg: a counter's value, a histogram's count.
func gathered(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// FedAvg weights each rank by its WithWeight; the result equals the weighted reference.
func TestFedAvgWeights(t *testing.T) {
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec, err := st.Gateway.CreateJob(ctx, spec("fed", "fedavg", 3))
	if err != nil {
		t.Fatal(err)
	}
	weights := []float64{100, 250, 50}
	c, _ := sdk.Connect(ctx, st.URL)
	defer c.Close()
	ws := make([]*sdk.Worker, 3)
	for r := range ws {
		if ws[r], err = c.Worker(ctx, rec.Spec.ID, r, sdk.WithWeight(weights[r])); err != nil {
			t.Fatal(err)
		}
	}
	_, init, _ := ws[0].Params(ctx)
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 3, rec.Layout.Ranges(), init)
	params := append([]float32(nil), init...)
	for step := int64(1); step <= 5; step++ {
		models := make([][]float32, 3)
		out := make([][]float32, 3)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for r := range ws {
			models[r] = make([]float32, len(params))
			testutil.Gradient(models[r], params, step, r) // a rank's local model
			wg.Add(1)
			go func() { defer wg.Done(); out[r], errs[r] = ws[r].Step(ctx, models[r]) }()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		ref.Step(models, weights)
		if !bytes.Equal(bits(out[0]), bits(ref.Params())) {
			t.Fatalf("step %d: fedavg differs from the weighted reference", step)
		}
		params = append(params[:0], out[0]...)
	}
}

func TestWorkerErrors(t *testing.T) {
	st := testutil.Stack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _ := sdk.Connect(ctx, st.URL)
	defer c.Close()
	if _, err := c.Worker(ctx, "nope", 0); !errors.Is(err, sdk.ErrUnknownJob) {
		t.Fatalf("unknown job: %v", err)
	}
	s := spec("gone", "sum", 1)
	rec, err := st.Gateway.CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Worker(ctx, rec.Spec.ID, 1); !errors.Is(err, wire.ErrReason(wire.ReasonRankRange)) {
		t.Fatalf("rank 1 of a 1-rank job: %v", err)
	}
	w, _ := c.Worker(ctx, rec.Spec.ID, 0)
	if _, err := w.Step(ctx, make([]float32, 10)); err == nil {
		t.Fatal("Step with 10 gradients for 3000 parameters succeeded")
	}
	if _, _, err := w.Params(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Gateway.DeleteJob(ctx, rec.Spec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Step(ctx, make([]float32, 3000)); !errors.Is(err, sdk.ErrUnknownJob) {
		t.Fatalf("Step after the job was deleted: %v, want unknown_job", err)
	}
}
