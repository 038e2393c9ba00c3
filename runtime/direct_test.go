package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// directStack is a stack without an autoscaler (the test places the shards) and with one pool
// runtime, rt-0, for a test that adds crashable runtimes of its own.
func directStack(t *testing.T, spec job.Spec) (*devstack.Stack, placer, *job.Record, []*sdk.Worker) {
	t.Helper()
	spec.Gradients = job.GradientsDirect
	st, _, pl := placeableStackOf(t, 1)
	rec, err := st.Gateway.CreateJob(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return st, pl, rec, rankWorkers(t, rec.Spec.ID, spec.Ranks, func(int) string { return st.URL })
}

// TestDirectGradientsSurviveFaults trains a direct-gradients job (no gradient stream) through a
// migration, a runtime crash (its connection cut: no final snapshot, no handover record, as after
// SIGKILL) and a runtime restarted under the same id, each in the middle of a step: after three
// of the four ranks' gradients reached the shards' owner and were receipted. The workers send
// again what the new owner asks for (its resend notice) or what finds no responder while no one
// serves the shard; every step's parameters equal the reference bit for bit, so no gradient was
// lost or applied twice. sgd's parameters message is its snapshot; adam checkpoints every step.
func TestDirectGradientsSurviveFaults(t *testing.T) {
	t.Parallel()
	for _, fn := range []string{"sgd", "adam"} {
		t.Run(fn, func(t *testing.T) { t.Parallel(); testDirectFaults(t, fn) })
	}
}

func testDirectFaults(t *testing.T, fn string) {
	st, pl, rec, workers := directStack(t, testSpec("direct-"+fn, fn, map[string]float64{"lr": 0.05}))
	ctx := context.Background()
	rts := map[string]*crashableRuntime{"rt-a": startRuntime(t, st.URL, "rt-a"), "rt-b": startRuntime(t, st.URL, "rt-b")}
	owner := map[int]string{}
	placeAll := func(ids []int, rt string) {
		for _, id := range ids {
			pl.place(t, wire.PlacementKey(rec.Spec.ID, id), rt)
			owner[id] = rt
		}
	}
	var all []int
	for _, s := range rec.Layout.Shards {
		all = append(all, s.ID)
	}
	// The resend notices the owners publish, which the steps without a fault are checked against.
	nc, err := nats.Connect(st.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	notices, err := nc.SubscribeSync(wire.ResendWildcard(rec.Spec.ID))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	placeAll(all, "rt-a")
	_, init, err := workers[0].Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(f, 4, rec.Layout.Ranges(), init)
	params := append([]float32(nil), init...)
	grads := make([][]float32, 4)
	for r := range grads {
		grads[r] = make([]float32, len(params))
	}
	bytesOf := func(rt string) int64 { return rts[rt].rt.Stats().BytesIn }
	// faults, by step: each runs once ranks 0-2 of the step were received by rt (the shards' owner).
	faults := map[int64]struct {
		on    string
		fault func()
	}{
		4: {"rt-a", func() { placeAll(all[:len(all)/2], "rt-b") }}, // migration
		8: {"rt-a", func() { // crash: the autoscaler would place its shards elsewhere
			rts["rt-a"].crash()
			var mine []int
			for _, id := range all {
				if owner[id] == "rt-a" {
					mine = append(mine, id)
				}
			}
			placeAll(mine, "rt-b")
		}},
		13: {"rt-b", func() { // restart under the same id: the placement does not change
			rts["rt-b"].crash()
			rts["rt-b"] = startRuntime(t, st.URL, "rt-b")
		}},
		17: {"rt-b", func() { placeAll(all, "rt-0") }},
	}
	const steps = 20
	sent := make([]int64, len(workers))
	resent := make([]sdk.Resends, len(workers))
	for step := int64(1); step <= steps; step++ {
		for r := range workers {
			testutil.Gradient(grads[r], params, step, r)
		}
		results := make([][]float32, 4)
		errs := make([]error, 4)
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		fault, faulty := faults[step]
		var before int64
		if faulty {
			before = bytesOf(fault.on)
		}
		var wg sync.WaitGroup
		for r, w := range workers[:3] {
			wg.Go(func() { results[r], errs[r] = w.Step(sctx, grads[r]) })
		}
		if faulty {
			var share int64 // the gradient bytes of ranks 0-2 for the shards the faulty runtime owns
			for _, s := range rec.Layout.Shards {
				if owner[s.ID] == fault.on {
					share += 3 * int64(s.Bytes())
				}
			}
			testutil.CheckFor(t, 20*time.Second, time.Millisecond, func() error {
				if got := bytesOf(fault.on) - before; got < share {
					return fmt.Errorf("%s received %d of ranks 0-2's %d bytes of step %d", fault.on, got, share, step)
				}
				return nil
			})
			fault.fault()
		}
		wg.Go(func() { results[3], errs[3] = workers[3].Step(sctx, grads[3]) })
		wg.Wait()
		cancel()
		checkStep(t, step, ref, grads, results, errs)
		params = append(params[:0], results[0]...)
		switch step { // steps 2 and 3, served and without a fault: every gradient sent once
		case 1:
			// Step 1 may have met "no responders" while the shards started, and a shard's first
			// notice may have come after it folded a gradient (it asks for it again), as late as
			// step 2 when its handler ran after step 1's parameters came.
			for r, w := range workers {
				sent[r], resent[r] = w.DirectSends(), w.DirectResends()
			}
		case 3:
			for r, w := range workers {
				again := w.DirectResends()
				n := w.DirectSends() - sent[r] - (again.Total() - resent[r].Total())
				if want := 2 * int64(rec.Layout.NumShards()); n != want {
					t.Fatalf("rank %d sent %d gradients of steps 2 and 3 for the first time, want %d", r, n, want)
				}
				if again.NoResponders != resent[r].NoResponders {
					t.Fatalf("rank %d met no responders in steps 2 and 3, when every shard was served", r)
				}
				if again.Notice != resent[r].Notice {
					t.Logf("rank %d: %d gradients sent again in steps 2 and 3 on a start-up notice", r, again.Notice-resent[r].Notice)
				}
				if again.Stall+again.Timeout != resent[r].Stall+resent[r].Timeout {
					t.Logf("rank %d: %d gradients sent again in steps 2 and 3 when a receipt or parameters were late", r,
						again.Stall+again.Timeout-resent[r].Stall-resent[r].Timeout)
				}
			}
			// Re-sends on a notice are only those of the start-up ones: one per shard, from step 1.
			for range all {
				m, err := notices.NextMsg(10 * time.Second)
				if err != nil {
					t.Fatalf("a shard's start-up notice: %v", err)
				}
				if from, err := wire.ParseStep(m.Header); err != nil || from != 1 {
					t.Fatalf("%s asks to send again from step %d (%v), want 1", m.Subject, from, err)
				}
			}
			if m, err := notices.NextMsg(0); err == nil {
				t.Fatalf("a resend notice without a fault: %s from step %s", m.Subject, m.Header.Get(wire.HdrStep))
			}
			_ = notices.Unsubscribe()
		}
	}
	var resentAll int64
	for _, w := range workers {
		resentAll += w.DirectResends().Total()
	}
	if resentAll <= 0 {
		t.Fatalf("the workers sent nothing again across a crash and a restart: the faults missed the steps")
	}
	t.Logf("%s: %d gradient requests sent again", fn, resentAll)
}

// TestDirectDecidesByStepAndRank sends gradients of a direct-gradients job by hand, as a worker in
// another language would: a re-sent gradient, one of an applied step and one held for the step
// after the next are answered with a receipt and applied once; one further ahead, and malformed
// ones, are answered with their rejection.
func TestDirectDecidesByStepAndRank(t *testing.T) {
	t.Parallel()
	spec := job.Spec{ID: "direct-hand", Tensors: []job.Tensor{{Name: "w", Shape: []int{8}}}, Ranks: 2,
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.5}}, ShardSize: 4 << 10}
	st, pl, rec, _ := directStack(t, spec)
	pl.place(t, wire.PlacementKey(rec.Spec.ID, 0), "rt-0")
	nc, err := nats.Connect(st.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	params, err := nc.SubscribeSync(wire.ParamsSubject(rec.Spec.ID, 0))
	if err != nil {
		t.Fatal(err)
	}
	grad := func(step int64, rank int, v float32) []float32 {
		g := make([]float32, 8)
		for i := range g {
			g[i] = v + float32(i) + float32(step)
		}
		return g
	}
	send := func(step int64, rank int, hdr map[string]string, data []byte) *nats.Msg {
		t.Helper()
		m := nats.NewMsg(wire.GradSubject(rec.Spec.ID, 0))
		m.Header.Set(wire.HdrStep, strconv.FormatInt(step, 10))
		m.Header.Set(wire.HdrRank, strconv.Itoa(rank))
		m.Header.Set(wire.HdrDtype, wire.DtypeF32)
		for k, v := range hdr {
			m.Header.Set(k, v)
		}
		m.Data = data
		var reply *nats.Msg
		for { // "no responders" until rt-0 serves the shard
			if reply, err = nc.RequestMsg(m, 5*time.Second); !errors.Is(err, nats.ErrNoResponders) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("step %d rank %d: %v", step, rank, err)
		}
		return reply
	}
	receipt := func(step int64, rank int) {
		t.Helper()
		if r := send(step, rank, nil, f32bytes(grad(step, rank, float32(rank)))); r.Header.Get(wire.HdrReject) != "" || len(r.Data) != 0 {
			t.Fatalf("step %d rank %d: got %q %s, want a receipt", step, rank, r.Header.Get(wire.HdrReject), r.Data)
		}
	}
	refused := func(reason wire.Reason, step int64, rank int, hdr map[string]string, data []byte) {
		t.Helper()
		r := send(step, rank, hdr, data)
		if got := r.Header.Get(wire.HdrReject); got != string(reason) {
			t.Fatalf("step %d rank %d: got %q %s, want %s", step, rank, got, r.Data, reason)
		}
	}
	f, _ := rec.Spec.NewFunc()
	_, init, err := sdkParams(st.URL, rec.Spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	ref := functions.NewReference(f, 2, rec.Layout.Ranges(), init)
	refStep := func(step int64) {
		ref.Step([][]float32{grad(step, 0, 0), grad(step, 1, 1)}, nil)
	}
	awaitParams := func(step int64) {
		t.Helper()
		for {
			m, err := params.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("parameters of step %d: %v", step, err)
			}
			if s, _ := wire.ParseStep(m.Header); s < step {
				continue
			} else if s > step {
				t.Fatalf("parameters of step %d came before those of step %d", s, step)
			}
			if !bytes.Equal(m.Data, f32bytes(ref.Params())) {
				t.Fatalf("parameters of step %d differ from the reference", step)
			}
			return
		}
	}
	receipt(1, 0)
	receipt(1, 0) // a re-send: answered, ignored
	receipt(2, 1) // held: step 2 is the one after the next
	receipt(2, 1) // held already
	refused(wire.ReasonFutureStep, 3, 0, nil, f32bytes(grad(3, 0, 0)))
	receipt(1, 1) // completes step 1, then rank 1's held gradient of step 2 is folded
	refStep(1)
	awaitParams(1)
	receipt(1, 1) // applied: answered, ignored
	refused(wire.ReasonBadDtype, 2, 0, map[string]string{wire.HdrDtype: "f64"}, f32bytes(grad(2, 0, 0)))
	refused(wire.ReasonBadLength, 2, 0, nil, f32bytes(grad(2, 0, 0))[:12])
	nan := grad(2, 0, 0)
	nan[3] = float32(nanValue())
	refused(wire.ReasonNonFinite, 2, 0, nil, f32bytes(nan))
	refused(wire.ReasonRankRange, 2, 2, nil, f32bytes(grad(2, 2, 2)))
	receipt(2, 0)
	refStep(2)
	awaitParams(2)
	receipt(3, 1)
	receipt(3, 0)
	refStep(3)
	awaitParams(3)
	if n := st.AllRuntimes()[0].Stats().Invocations; n != 3 {
		t.Fatalf("the runtime applied %d updates, want 3", n)
	}
}

func nanValue() float64 { var z float64; return z / z }

// sdkParams reads a job's current parameters as a worker does.
func sdkParams(url, id string) (int64, []float32, error) {
	ctx := context.Background()
	c, err := sdk.Connect(ctx, url)
	if err != nil {
		return 0, nil, err
	}
	defer c.Close()
	w, err := c.Worker(ctx, id, 0)
	if err != nil {
		return 0, nil, err
	}
	defer w.Close()
	step, p, err := w.Params(ctx)
	return step, append([]float32(nil), p...), err
}

// TestDirectGradientsSecured: with security on, a direct job's workers are users of the job's own
// account: their requests cross into fanin's account through the job's service import and the
// receipts come back to their inboxes, and a new owner's resend notice reaches them through the
// stream import. A runtime is stopped mid-training (its shards move to the other), and every step
// stays bit-exact.
func TestDirectGradientsSecured(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := devstack.Start(ctx, devstack.Config{DataDir: t.TempDir(), NATSPort: -1, Runtimes: 2, Logger: testutil.Logger(), Auth: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	spec := testSpec("direct-secured", "adam", map[string]float64{"lr": 0.05})
	spec.Gradients = job.GradientsDirect
	created, err := st.Gateway.SubmitJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	rec := &created.Record
	cr := created.Credentials
	workers := rankWorkers(t, rec.Spec.ID, spec.Ranks, func(int) string { return st.URL }, sdk.WithJobCredentials(cr))
	notices := make(chan *nats.Msg, 64)
	nc, err := nats.Connect(st.URL, nats.UserJWTAndSeed(cr.JWT, cr.Seed), nats.CustomInboxPrefix(cr.InboxPrefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := nc.ChanSubscribe(wire.ResendWildcard(rec.Spec.ID), notices); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	_, init, err := workers[0].Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(f, spec.Ranks, rec.Layout.Ranges(), init)
	params := append([]float32(nil), init...)
	for step := int64(1); step <= 8; step++ {
		if step == 4 {
			st.StopRuntime(st.Runtimes()[0].ID())
		}
		params = trainWithWorkers(t, workers, ref, params, step-1, step)
	}
	for { // the first serve of each shard sent one (from step 1); the move, from step 4
		select {
		case m := <-notices:
			if s, err := wire.ParseStep(m.Header); err == nil && s == 4 {
				return
			}
		default:
			t.Fatal("no resend notice from step 4 reached the job's account after its shards moved")
		}
	}
}

// TestDirectRejectionReachesTheWorker: a gradient the runtime refuses (NaN, in a job that does not
// allow it) fails the worker's Step with the rejection, as with stored gradients.
func TestDirectRejectionReachesTheWorker(t *testing.T) {
	t.Parallel()
	_, pl, rec, workers := directStack(t, testSpec("direct-nan", "sgd", map[string]float64{"lr": 0.05}))
	for _, s := range rec.Layout.Shards {
		pl.place(t, wire.PlacementKey(rec.Spec.ID, s.ID), "rt-0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := make([]float32, rec.Layout.Elements)
	g[rec.Layout.Shards[2].Off] = float32(nanValue())
	_, err := workers[0].Step(ctx, g)
	var rej *wire.Reject
	if !errors.As(err, &rej) || rej.Reason != wire.ReasonNonFinite || rej.Shard != rec.Layout.Shards[2].ID || rej.Rank != 0 || rej.Step != 1 {
		t.Fatalf("Step with a NaN: %v, want the non_finite rejection of shard %d, rank 0, step 1", err, rec.Layout.Shards[2].ID)
	}
}
