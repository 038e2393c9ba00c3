package runtime_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
)

// TestRecreatedJobIsServedAsItself deletes a job and creates it again under the same id with
// another function and layout, over and over, with a gateway that does not wait for the runtime to
// let the deleted job go (as when the drain times out on a loaded node): every incarnation must be
// served with its own spec and streams, bit-exact to its own reference from its first step, and
// nothing of the incarnation before it (its executor, its pending purges) may touch it. Not
// parallel: it burns every core (burnCPU).
func TestRecreatedJobIsServedAsItself(t *testing.T) {
	st, err := devstack.Start(context.Background(), devstack.Config{
		DataDir: t.TempDir(), NATSPort: -1, HTTPAddr: "127.0.0.1:0", Runtimes: 1, Logger: testutil.Logger(),
		GatewayOptions: []gateway.Option{gateway.WithDrainTimeout(time.Nanosecond)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	burnCPU(t)
	ctx := context.Background()
	fns := []job.Function{
		{Name: "sum"},
		{Name: "sgd", Hyper: map[string]float64{"lr": 0.5}},
		{Name: "momentum", Hyper: map[string]float64{"lr": 0.1, "momentum": 0.9}},
	}
	for i := range 9 {
		spec := job.Spec{
			ID:        "again",
			Tensors:   []job.Tensor{{Name: "w", Shape: []int{1024 + 1536*(i%3)}}},
			Ranks:     1 + i%2,
			Function:  fns[i%3],
			Init:      job.Init{Kind: "normal", Seed: uint64(i + 1), Scale: 0.1},
			ShardSize: 4 << 10,
		}
		rec, err := st.Gateway.CreateJob(ctx, spec)
		if err != nil {
			t.Fatalf("incarnation %d: %v", i, err)
		}
		trainChecked(t, st.URL, rec, 15)
		if err := st.Gateway.DeleteJob(ctx, rec.Spec.ID); err != nil {
			t.Fatalf("incarnation %d: delete: %v", i, err)
		}
	}
}

// trainChecked trains rec for steps steps with one worker per rank and checks every step's
// parameters against the job's own reference, failing on a stall.
func trainChecked(t *testing.T, url string, rec *job.Record, steps int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	workers := make([]*sdk.Worker, rec.Spec.Ranks)
	for r := range workers {
		c, err := sdk.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if workers[r], err = c.Worker(ctx, rec.Spec.ID, r); err != nil {
			t.Fatal(err)
		}
		defer workers[r].Close()
	}
	_, params, err := workers[0].Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ref := testutil.Reference(t, rec)
	if !bytes.Equal(f32bytes(params), f32bytes(ref.Params())) {
		t.Fatalf("job %s (%s): step 0 differs from the reference's", rec.Spec.ID, rec.Spec.Function.Name)
	}
	grads := make([][]float32, len(workers))
	for step := int64(1); step <= steps; step++ {
		results := make(chan error, len(workers))
		outs := make([][]float32, len(workers))
		for r, w := range workers {
			grads[r] = make([]float32, len(params))
			testutil.Gradient(grads[r], params, step, r)
			go func() {
				var err error
				outs[r], err = w.Step(ctx, grads[r])
				results <- err
			}()
		}
		for range workers {
			if err := <-results; err != nil {
				t.Fatalf("job %s (%s), step %d: %v\n%s", rec.Spec.ID, rec.Spec.Function.Name, step, err, jobState(url, rec))
			}
		}
		ref.Step(grads, nil)
		params = outs[0]
		for r := range outs {
			if !bytes.Equal(f32bytes(outs[r]), f32bytes(ref.Params())) {
				t.Fatalf("job %s (%s), step %d: rank %d's parameters differ from the reference's", rec.Spec.ID, rec.Spec.Function.Name, step, r)
			}
		}
	}
}
