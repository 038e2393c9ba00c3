package sdk_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// TestGradDtypeBitExact trains an adam job through the SDK with 16-bit gradients: one worker
// holds ranks 0 and 1 and publishes bf16, another holds rank 2 and publishes f16. The parameters
// equal, byte for byte at every step, the reference fed the gradients rounded to each rank's
// dtype; and differ from the reference fed the float32 gradients (the rounding happened).
func TestGradDtypeBitExact(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := spec("d16", "adam", 3)
	s.Function.Hyper = map[string]float64{"lr": 0.01}
	rec, err := st.Gateway.CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := sdk.Connect(ctx, st.URL)
	defer c.Close()
	wa, err := c.WorkerRanks(ctx, rec.Spec.ID, []int{0, 1}, sdk.WithGradDtype(wire.BF16))
	if err != nil {
		t.Fatal(err)
	}
	wb, err := c.Worker(ctx, rec.Spec.ID, 2, sdk.WithGradDtype(wire.F16))
	if err != nil {
		t.Fatal(err)
	}
	_, init, _ := wa.Params(ctx)
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 3, rec.Layout.Ranges(), init)
	fn2, _ := rec.Spec.NewFunc()
	unrounded := functions.NewReference(fn2, 3, rec.Layout.Ranges(), init)
	dts := []wire.Dtype{wire.BF16, wire.BF16, wire.F16}
	params := append([]float32(nil), init...)
	grads, rounded := make([][]float32, 3), make([][]float32, 3)
	for r := range grads {
		grads[r], rounded[r] = make([]float32, len(params)), make([]float32, len(params))
	}
	for step := int64(1); step <= 6; step++ {
		for r := range grads {
			testutil.Gradient(grads[r], params, step, r)
			wire.Round(rounded[r], grads[r], dts[r])
		}
		var outA, outB []float32
		var errA, errB error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); outA, errA = wa.StepRanks(ctx, grads[:2]) }()
		go func() { defer wg.Done(); outB, errB = wb.Step(ctx, grads[2]) }()
		wg.Wait()
		if err := errors.Join(errA, errB); err != nil {
			t.Fatal(err)
		}
		ref.Step(rounded, nil)
		unrounded.Step(grads, nil)
		if !bytes.Equal(bits(outA), bits(ref.Params())) || !bytes.Equal(bits(outB), bits(ref.Params())) {
			t.Fatalf("step %d: parameters differ from the reference fed the bf16/f16-rounded gradients", step)
		}
		if bytes.Equal(bits(outA), bits(unrounded.Params())) {
			t.Fatalf("step %d: parameters equal the float32 reference: the gradients were not rounded", step)
		}
		params = append(params[:0], outA...)
	}
}

// A gradient that overflows f16 (70000 > 65504) is Inf on the wire: a job that forbids NaN and
// Inf refuses it (non_finite), and the step succeeds once the gradient is in range. An unknown
// dtype is refused when the worker is made.
func TestGradDtypeRejections(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec, err := st.Gateway.CreateJob(ctx, spec("d16rej", "sum", 1))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := sdk.Connect(ctx, st.URL)
	defer c.Close()
	if _, err := c.Worker(ctx, rec.Spec.ID, 0, sdk.WithGradDtype(wire.Dtype(9))); !errors.Is(err, wire.ErrReason(wire.ReasonBadDtype)) {
		t.Fatalf("an unknown dtype: %v, want bad_dtype", err)
	}
	w, err := c.Worker(ctx, rec.Spec.ID, 0, sdk.WithGradDtype(wire.F16))
	if err != nil {
		t.Fatal(err)
	}
	g := make([]float32, rec.Layout.Elements)
	g[17] = 70000
	if _, err := w.Step(ctx, g); !errors.Is(err, wire.ErrReason(wire.ReasonNonFinite)) {
		t.Fatalf("an f16 overflow: %v, want non_finite", err)
	}
	g[17] = 65504
	out, err := w.Step(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	if out[17] != 65504 || out[16] != 0 {
		t.Fatalf("sum of one rank: element 17 is %v, 16 is %v", out[17], out[16])
	}
}

// An elastic worker publishing bf16 (WithElasticGradDtype) holds both ranks of a job: every step
// is the reference's for the rounded gradients.
func TestElasticGradDtype(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := spec("d16el", "sgd", 2)
	s.Function.Hyper = map[string]float64{"lr": 0.1}
	rec, err := sdk.NewAdmin(st.HTTPURL).CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := sdk.Connect(ctx, st.URL)
	defer c.Close()
	e, err := c.Elastic(ctx, rec.Spec.ID, sdk.WithElasticGradDtype(wire.BF16))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Leave(ctx)
	ref := testutil.Reference(t, rec)
	n := rec.Layout.Elements
	grads := [][]float32{make([]float32, n), make([]float32, n)}
	for step := int64(1); step <= 4; step++ {
		p, err := e.Step(ctx, func(_ context.Context, rank int, step int64, params, g []float32) error {
			testutil.Gradient(g, params, step, rank)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for r := range grads {
			testutil.Gradient(grads[r], ref.Params(), step, r)
			wire.Round(grads[r], grads[r], wire.BF16)
		}
		ref.Step(grads, nil)
		if e.StepCount() != step || !bytes.Equal(bits(p), bits(ref.Params())) {
			t.Fatalf("step %d (worker at %d): parameters differ from the reference fed bf16-rounded gradients", step, e.StepCount())
		}
	}
}
