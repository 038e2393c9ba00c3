package runtime_test

import (
	"bytes"
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/runtime"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// A gradient the stream holds but the shard's consumer never delivered (lost on its way as the
// stream's leader died; the consumer's state on the servers moved past it, and no later message
// shows a gap) is noticed by the idle check and fetched again: the step is applied, bit-exact,
// without a restart. Not parallel: SetConsumerFaults changes every runtime in the process.
func TestShardNoticesALostGradient(t *testing.T) {
	var armed atomic.Bool
	var lost atomic.Int32
	undo := runtime.SetConsumerFaults(20*time.Millisecond, func(m jetstream.Msg) bool {
		if m.Subject() == wire.GradSubject("lost", 0) && armed.CompareAndSwap(true, false) {
			lost.Add(1)
			return true
		}
		return false
	})
	t.Cleanup(undo) // registered before the stack's cleanup: runs once the runtime has stopped
	st := testutil.Stack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	train := oneRankJob(ctx, t, st.URL, st.Gateway, "lost")
	for step := int64(1); step <= 3; step++ {
		armed.Store(step == 2) // shard 0's only gradient of step 2 goes missing
		if err := train(step); err != nil {
			t.Fatalf("step %d (shard 0's gradient lost %d times): %v", step, lost.Load(), err)
		}
	}
	if lost.Load() != 1 {
		t.Fatalf("the fault point dropped %d deliveries, want 1", lost.Load())
	}
}

// A shard whose consumer is gone does not rely on the client library's error reports to say so:
// with them ignored, the consumer deleted on the servers (whose 409 makes the library end the
// consumption) is still found gone, a new one is made, and the next steps are applied bit-exact.
// TestIdleCheck drives the idle check's other ways of finding a loss. Not parallel:
// MuteConsumeErrors changes every runtime in the process.
func TestShardReplacesAConsumerGoneSilently(t *testing.T) {
	undoCheck := runtime.SetConsumerFaults(20*time.Millisecond, nil)
	t.Cleanup(undoCheck)
	st := testutil.Stack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	train := oneRankJob(ctx, t, st.URL, st.Gateway, "silent")
	step := func(s int64) {
		t.Helper()
		if err := train(s); err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
	}
	step(1)

	t.Cleanup(runtime.MuteConsumeErrors())
	_, js := testutil.Connect(t, st.URL)
	grads, err := js.Stream(ctx, wire.GradStream("silent"))
	if err != nil {
		t.Fatal(err)
	}
	var deleted []string
	for name := range grads.ListConsumers(ctx).Info() {
		if err := grads.DeleteConsumer(ctx, name.Name); err != nil {
			t.Fatal(err)
		}
		deleted = append(deleted, name.Name)
	}
	if len(deleted) == 0 {
		t.Fatal("the gradient stream has no consumer to delete")
	}
	step(2)
	step(3)
	for name := range grads.ListConsumers(ctx).Info() {
		if slices.Contains(deleted, name.Name) {
			t.Fatalf("consumer %s was deleted, yet listed", name.Name)
		}
	}
}

// oneRankJob creates job id (sgd, one rank) through gw and returns what trains it one step: a
// gradient from its one worker, the parameters checked bit for bit against the job's reference
// (a mismatch fails the test; an error of the step is returned).
func oneRankJob(ctx context.Context, t *testing.T, url string, gw *gateway.Server, id string) (train func(step int64) error) {
	t.Helper()
	spec := testSpec(id, "sgd", map[string]float64{"lr": 0.1})
	spec.Ranks = 1
	rec, err := gw.CreateJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	c, err := sdk.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	w, err := c.Worker(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, params, err := w.Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 1, rec.Layout.Ranges(), params)
	g := make([]float32, rec.Layout.Elements)
	return func(step int64) error {
		testutil.Gradient(g, params, step, 0)
		ref.Step([][]float32{g}, nil)
		got, err := w.Step(ctx, g)
		if err != nil {
			return err
		}
		params = got
		if !bytes.Equal(f32bytes(params), f32bytes(ref.Params())) {
			t.Fatalf("step %d: the parameters differ from the reference", step)
		}
		return nil
	}
}
