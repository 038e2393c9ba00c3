package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// testSpec has 7 shards of 4 KiB or less: a split matrix, a small vector alone, a split vector.
func testSpec(id, fn string, hyper map[string]float64) job.Spec {
	return job.Spec{
		ID:        id,
		Tensors:   []job.Tensor{{Name: "w", Shape: []int{64, 40}}, {Name: "b", Shape: []int{40}}, {Name: "v", Shape: []int{3000}}},
		Ranks:     4,
		Function:  job.Function{Name: fn, Hyper: hyper},
		Init:      job.Init{Kind: "normal", Seed: 7, Scale: 0.1},
		ShardSize: 4 << 10,
	}
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	functions.EncodeLE(b, v)
	return b
}

func invocations(st *devstack.Stack) int64 {
	var n int64
	for _, rt := range st.AllRuntimes() {
		n += rt.Stats().Invocations
	}
	return n
}

// TestShuffledResentBitExact: 4 ranks, 3 runtimes, 50 steps, every step's messages published in a
// random order with some sent twice under the same id (JetStream drops them) and some re-sent under
// a new id (the runtime refuses them): the parameters equal the reference byte for byte at every
// step, and the runtimes applied exactly steps x shards updates.
func TestShuffledResentBitExact(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 3)
	ctx := context.Background()
	_, js := testutil.Connect(t, st.URL)

	const steps = 50
	cases := []struct {
		fn    string
		hyper map[string]float64
	}{
		{"sgd", map[string]float64{"lr": 0.1, "weight_decay": 0.01}},
		{"momentum", map[string]float64{"lr": 0.05, "momentum": 0.9}},
		{"adam", map[string]float64{"lr": 0.01}},
	}
	var applied int64
	for ci, c := range cases {
		t.Run(c.fn, func(t *testing.T) {
			rec, err := st.Gateway.CreateJob(ctx, testSpec("shuf-"+c.fn, c.fn, c.hyper))
			if err != nil {
				t.Fatal(err)
			}
			if n := rec.Layout.NumShards(); n != 7 {
				t.Fatalf("layout has %d shards, the test wants 7", n)
			}
			ps, err := js.Stream(ctx, wire.ParamsStream(rec.Spec.ID))
			if err != nil {
				t.Fatal(err)
			}
			params := testutil.ParamsAt(t, ps, rec, 0)
			init := make([]float32, rec.Layout.Elements)
			rec.Spec.InitShard(0, init)
			if !bytes.Equal(f32bytes(params), f32bytes(init)) {
				t.Fatal("published initial parameters differ from the spec's init")
			}
			fn, _ := rec.Spec.NewFunc()
			ref := functions.NewReference(fn, 4, rec.Layout.Ranges(), init)
			rng := rand.New(rand.NewPCG(uint64(ci), 42))
			grads := make([][]float32, 4)
			for r := range grads {
				grads[r] = make([]float32, rec.Layout.Elements)
			}
			for step := int64(1); step <= steps; step++ {
				type out struct {
					shard job.Shard
					rank  int
				}
				var msgs []out
				for r := range 4 {
					testutil.Gradient(grads[r], params, step, r)
					for _, s := range rec.Layout.Shards {
						msgs = append(msgs, out{s, r})
					}
				}
				rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
				for _, o := range msgs {
					m := wire.GradMsg(wire.Grad{Job: rec.Spec.ID, Shard: o.shard.ID, Step: step, Rank: o.rank},
						f32bytes(grads[o.rank][o.shard.Off:o.shard.Off+o.shard.Len]))
					testutil.PublishGrad(t, ctx, js, m)
					switch p := rng.Float64(); {
					case p < 0.15: // a retry with the same id
						ack, err := js.PublishMsg(ctx, m)
						if err != nil || !ack.Duplicate {
							t.Fatalf("re-send with the same id: ack %+v err %v, want a duplicate ack", ack, err)
						}
					case p < 0.20: // a re-send JetStream cannot recognise
						m.Header.Set(wire.HdrMsgID, wire.GradMsgID(rec.Spec.ID, o.shard.ID, step, o.rank)+".again")
						testutil.PublishGrad(t, ctx, js, m)
					}
				}
				ref.Step(grads, nil)
				params = testutil.ParamsAt(t, ps, rec, step)
				if !bytes.Equal(f32bytes(params), f32bytes(ref.Params())) {
					t.Fatalf("step %d: parameters differ from the reference", step)
				}
			}
			applied += steps * int64(rec.Layout.NumShards())
			testutil.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
				if got := invocations(st); got != applied {
					return fmt.Errorf("runtimes applied %d updates, want exactly %d", got, applied)
				}
				return nil
			})
		})
	}
	placed := 0
	for _, rt := range st.Runtimes() {
		if len(rt.Shards()) > 0 {
			placed++
		}
	}
	if placed != 3 {
		t.Errorf("shards were served by %d runtimes, want all 3", placed)
	}
	// The work time (fold and function) holds the function's time.
	var work, fn time.Duration
	for _, rt := range st.AllRuntimes() {
		s := rt.Stats()
		work, fn = work+s.WorkTime, fn+s.FuncTime
	}
	if !(fn > 0 && work >= fn) {
		t.Errorf("work time %v, function time %v: want 0 < function <= work", work, fn)
	}
}

// trainWithWorkers runs ranks SDK workers from their current step to step `to`.
func trainWithWorkers(t *testing.T, workers []*sdk.Worker, ref *functions.Reference, params []float32, from, to int64) []float32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := len(params)
	grads := make([][]float32, len(workers))
	for r := range grads {
		grads[r] = make([]float32, n)
	}
	for step := from + 1; step <= to; step++ {
		for r := range workers {
			testutil.Gradient(grads[r], params, step, r)
		}
		results := make([][]float32, len(workers))
		errs := make([]error, len(workers))
		var wg sync.WaitGroup
		for r, w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[r], errs[r] = w.Step(ctx, grads[r])
			}()
		}
		wg.Wait()
		checkStep(t, step, ref, grads, results, errs)
		params = append(params[:0], results[0]...)
	}
	return params
}

// TestLateWorkerGetsCurrentParams: four SDK workers train 20 steps; rank 3's worker leaves and a new
// one joins: it fetches the step-20 parameters, and training continues bit-exact to step 30.
func TestLateWorkerGetsCurrentParams(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 3)
	ctx := context.Background()
	rec, err := st.Gateway.CreateJob(ctx, testSpec("late", "adam", map[string]float64{"lr": 0.01}))
	if err != nil {
		t.Fatal(err)
	}
	workers := make([]*sdk.Worker, 4)
	for r := range workers {
		c, err := sdk.Connect(ctx, st.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if workers[r], err = c.Worker(ctx, rec.Spec.ID, r); err != nil {
			t.Fatal(err)
		}
	}
	step, params, err := workers[0].Params(ctx)
	if err != nil || step != 0 {
		t.Fatalf("initial params: step %d err %v", step, err)
	}
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 4, rec.Layout.Ranges(), params)
	params = trainWithWorkers(t, workers, ref, append([]float32(nil), params...), 0, 20)

	workers[3].Close()
	late, err := sdk.Connect(ctx, st.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if workers[3], err = late.Worker(ctx, rec.Spec.ID, 3); err != nil {
		t.Fatal(err)
	}
	// The other workers may hold step 20's parameters a moment before the stream has stored every
	// shard's (the runtimes' publishes reach subscribers as the stream takes them): Params then
	// answers the newest step complete in the stream, 19, and step 20 soon after.
	var got []float32
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if step, got, err = workers[3].Params(ctx); err != nil {
			return err
		}
		if step != 20 {
			return fmt.Errorf("late worker got step %d, want 20", step)
		}
		return nil
	})
	if !bytes.Equal(f32bytes(got), f32bytes(ref.Params())) {
		t.Fatal("late worker's step-20 parameters differ from the reference's")
	}
	trainWithWorkers(t, workers, ref, params, 20, 30)
}

// TestLogicalRanksOverChangingWorkers trains a job of 4 logical ranks on 4 worker connections of
// one rank each, then 2 of two ranks, then 1 holding all four, then 3 ({0}, {1, 2}, {3}): at each
// change the old workers close and the new ones resume from the stream (Params). Every step's
// parameters are byte-identical to the reference's, as on 4 fixed workers (who publishes which
// rank changes nothing), and the runtimes applied exactly one update per shard and step.
func TestLogicalRanksOverChangingWorkers(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rec, err := st.Gateway.CreateJob(ctx, testSpec("elastic", "adam", map[string]float64{"lr": 0.01}))
	if err != nil {
		t.Fatal(err)
	}
	var ref *functions.Reference
	var params []float32
	step := int64(0)
	grads := make([][]float32, rec.Spec.Ranks)
	for _, phase := range []struct {
		groups [][]int
		steps  int64
	}{
		{[][]int{{0}, {1}, {2}, {3}}, 5},
		{[][]int{{0, 1}, {2, 3}}, 5},
		{[][]int{{3, 1, 0, 2}}, 5}, // any order: each gradient is published as its rank
		{[][]int{{0}, {1, 2}, {3}}, 5},
	} {
		workers := make([]*sdk.Worker, len(phase.groups))
		for i, ranks := range phase.groups {
			c, err := sdk.Connect(ctx, st.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if workers[i], err = c.WorkerRanks(ctx, rec.Spec.ID, ranks); err != nil {
				t.Fatal(err)
			}
			// The old workers saw step `step` as the runtimes published it, which may be a moment
			// before the stream stored every shard's: Params answers the newest step complete in
			// the stream, so it may give step-1 first (as for the late worker above).
			var p []float32
			testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
				var got int64
				if got, p, err = workers[i].Params(ctx); err != nil {
					return err
				}
				if got != step {
					return fmt.Errorf("ranks %v joining at step %d: Params gave step %d", ranks, step, got)
				}
				return nil
			})
			if ref == nil {
				fn, _ := rec.Spec.NewFunc()
				ref = functions.NewReference(fn, rec.Spec.Ranks, rec.Layout.Ranges(), p)
				params = append([]float32(nil), p...)
				for r := range grads {
					grads[r] = make([]float32, len(p))
				}
			}
		}
		for range phase.steps {
			step++
			for r := range grads {
				testutil.Gradient(grads[r], params, step, r)
			}
			results := make([][]float32, len(workers))
			errs := make([]error, len(workers))
			var wg sync.WaitGroup
			for i, w := range workers {
				mine := make([][]float32, len(phase.groups[i]))
				for j, r := range phase.groups[i] {
					mine[j] = grads[r]
				}
				wg.Go(func() { results[i], errs[i] = w.StepRanks(ctx, mine) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("ranks %v, step %d: %v", phase.groups, step, err)
			}
			ref.Step(grads, nil)
			for i := range workers {
				if !bytes.Equal(f32bytes(results[i]), f32bytes(ref.Params())) {
					t.Fatalf("ranks %v, step %d: the worker of ranks %v received parameters that differ from the reference", phase.groups, step, phase.groups[i])
				}
			}
			params = append(params[:0], results[0]...)
		}
		for _, w := range workers {
			w.Close()
		}
	}
	want := step * int64(rec.Layout.NumShards())
	testutil.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if got := invocations(st); got != want {
			return fmt.Errorf("runtimes applied %d updates, want exactly %d", got, want)
		}
		return nil
	})
}

// checkStep checks one step of SDK workers against the reference: no worker failed, and every
// rank received the reference's parameters after the step, bit for bit. It advances ref.
func checkStep(t *testing.T, step int64, ref *functions.Reference, grads, results [][]float32, errs []error) {
	t.Helper()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("step %d: %v", step, err)
	}
	ref.Step(grads, nil)
	for r := range results {
		if !bytes.Equal(f32bytes(results[r]), f32bytes(ref.Params())) {
			t.Fatalf("step %d: rank %d's parameters differ from the reference", step, r)
		}
	}
}

// rankWorkers connects one SDK worker per rank of job id, rank r's to url(r), with opts; they and
// their connections close when the test ends.
func rankWorkers(tb testing.TB, id string, ranks int, url func(rank int) string, opts ...sdk.Option) []*sdk.Worker {
	tb.Helper()
	ctx := context.Background()
	workers := make([]*sdk.Worker, ranks)
	for r := range workers {
		c, err := sdk.Connect(ctx, url(r), opts...)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(c.Close)
		if workers[r], err = c.Worker(ctx, id, r); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = workers[r].Close() })
	}
	return workers
}
