package runtime

import (
	"context"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/functions/wasmfn"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// A full gradient stream must not stall a job for good. The stream of a 1-rank, 1-shard job holds
// store.StorageWindow gradients; the tests below let the purges lag (as on a loaded machine) until
// the shard has applied, and JetStream stored the snapshots of, every gradient the stream holds:
// the next step's gradient is refused as full, and only a purge can make room, since no step can
// complete to ask for one. Then the one purge that would make room is lost, and must be made anyway.

// fillJob creates a 1-rank, 1-shard job of spec's function and dtype with its step-0 parameters,
// and returns its record, its two streams and the reference at step 0.
func fillJob(t *testing.T, h *shardHarness, spec job.Spec) (job.Record, jetstream.Stream, jetstream.Stream, *functions.Reference) {
	t.Helper()
	spec.Tensors = []job.Tensor{{Name: "w", Shape: []int{256}}}
	spec.Ranks = 1
	spec.Init = job.Init{Kind: "normal", Seed: 7, Scale: 0.1}
	rec, grads, params := h.job(t, spec)
	if rec.Layout.NumShards() != 1 {
		t.Fatalf("%d shards, want 1", rec.Layout.NumShards())
	}
	if err := store.PublishInitial(h.ctx, h.js, &rec); err != nil {
		t.Fatal(err)
	}
	fn, err := rec.Spec.NewFunc()
	if err != nil {
		t.Fatal(err)
	}
	init := make([]float32, rec.Layout.Elements)
	rec.Spec.InitShard(0, init)
	return rec, grads, params, functions.NewReference(fn, 1, rec.Layout.Ranges(), init)
}

// fillGrad is rank 0's gradient of step: small values that differ per step and element.
func fillGrad(step int64, n int) []float32 {
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(math.Sin(float64(step*int64(n)+int64(i)))) * 0.01
	}
	return g
}

func fillMsg(rec *job.Record, step int64) *nats.Msg {
	g := fillGrad(step, rec.Layout.Elements)
	data := make([]byte, 4*len(g))
	for i, v := range g {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	return wire.GradMsg(wire.Grad{Job: rec.Spec.ID, Shard: 0, Step: step, Rank: 0}, data)
}

// stepWithoutPurges publishes and applies the steps from..to on x and has JetStream store each
// step's snapshot (the test plays x's acknowledgements), but carries out no purge. The reference
// applies the same steps.
func stepWithoutPurges(t *testing.T, h *shardHarness, x *shardExec, ref *functions.Reference, from, to int64) {
	t.Helper()
	for step := from; step <= to; step++ {
		m := fillMsg(x.ji.rec, step)
		ack, err := h.js.PublishMsg(h.ctx, m)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		x.mu.Lock()
		x.handleSeq(&fakeMsg{data: m.Data, hdr: m.Header}, ack.Sequence)
		x.mu.Unlock()
		for len(x.r.acks.queue) > 0 {
			it := <-x.r.acks.queue
			it.done(x.r.acks.wait(h.ctx, it))
		}
		ref.Step([][]float32{fillGrad(step, x.shard.Len)}, nil)
	}
	if x.step != to {
		t.Fatalf("shard at step %d, want %d", x.step, to)
	}
}

// refusedFull checks that the gradient stream refuses the next step's gradient as full.
func refusedFull(t *testing.T, h *shardHarness, rec *job.Record, step int64) {
	t.Helper()
	_, err := h.js.PublishMsg(h.ctx, fillMsg(rec, step))
	if err == nil || !strings.Contains(err.Error(), "maximum messages exceeded") {
		t.Fatalf("the gradient of step %d was not refused as full: %v", step, err)
	}
}

// applyNext publishes and applies step on x, then checks x's parameters against the reference's.
func applyNext(t *testing.T, h *shardHarness, x *shardExec, ref *functions.Reference, step int64) {
	t.Helper()
	m := fillMsg(x.ji.rec, step)
	ack, err := h.js.PublishMsg(h.ctx, m)
	if err != nil {
		t.Fatalf("step %d, after the purge: %v", step, err)
	}
	x.mu.Lock()
	x.handleSeq(&fakeMsg{data: m.Data, hdr: m.Header}, ack.Sequence)
	x.mu.Unlock()
	ref.Step([][]float32{fillGrad(step, x.shard.Len)}, nil)
	if x.step != step || !slices.Equal(x.params, ref.Params()) {
		t.Fatalf("shard at step %d, want %d; parameters equal to the reference's: %v", x.step, step, slices.Equal(x.params, ref.Params()))
	}
}

// TestFailedPurgeIsTriedAgain: the purge asked for by the last snapshot fails (a request lost as
// the runtime's connection is cut, or not answered in time under load) while the stream is full.
// The purger must try it again: were it dropped as "the next purge covers it", no next purge
// would ever be asked for, and the job would stall for good.
func TestFailedPurgeIsTriedAgain(t *testing.T) {
	t.Parallel()
	h := newShardHarness(t)
	rec, grads, params, ref := fillJob(t, h, job.Spec{ID: "lostpurge", Function: job.Function{Name: "sum"}})
	r := h.runtime(t) // its acker and purger do not run: the test plays them
	x := h.shard(t, r, &rec, grads, params)
	if err := x.restore(h.ctx); err != nil {
		t.Fatal(err)
	}
	window := store.GradWindow(&rec.Spec)
	stepWithoutPurges(t, h, x, ref, 1, window)
	refusedFull(t, h, &rec, window+1)

	lost := true
	r.purger.purge = func(ctx context.Context, k purgeKey, upTo uint64) error {
		if lost {
			lost = false
			return context.DeadlineExceeded // what a purge request lost in a reconnect returns
		}
		return purgeSubject(ctx, k, upTo)
	}
	if r.purger.drain(h.ctx) {
		t.Fatal("the drain whose purge failed reports success: nothing would try the purge again")
	}
	refusedFull(t, h, &rec, window+1)
	if lost {
		t.Fatal("no purge was tried")
	}
	// The purger's retry (run tries again after p.retry).
	if !r.purger.drain(h.ctx) {
		t.Fatal("the second purge failed")
	}
	applyNext(t, h, x, ref, window+1)

	// A purge of a stream that is gone (its job deleted) is dropped, not tried for ever.
	if err := h.js.DeleteStream(h.ctx, wire.GradStream(rec.Spec.ID)); err != nil {
		t.Fatal(err)
	}
	r.purger.schedule(x.ji.streams[0], x.gradSj, x.replayFrom())
	if !r.purger.drain(h.ctx) {
		t.Fatal("the purge of a deleted stream is kept to be tried again")
	}
}

// TestRestorePurgesBehindItsSnapshot: the owner of a shard dies (SIGKILL) after JetStream stored
// its snapshots but before its purger purged the gradients they cover, and they fill the stream.
// The new owner restores the newest snapshot and must purge what it covers: it needs none of those
// gradients, and nothing else would purge them before its first step, whose gradient the full
// stream refuses. For a stateless function the parameters message is the snapshot; for momentum,
// and for parameters published in bf16, the checkpoint is.
func TestRestorePurgesBehindItsSnapshot(t *testing.T) {
	t.Parallel()
	h := newShardHarness(t)
	for _, c := range []struct {
		name string
		fn   job.Function
		dt   string
	}{
		{"sum", job.Function{Name: "sum"}, ""},
		{"momentum", job.Function{Name: "momentum", Hyper: map[string]float64{"lr": 0.1, "momentum": 0.9}}, ""},
		{"sgd-bf16", job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, wire.DtypeBF16},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec, grads, params, ref := fillJob(t, h, job.Spec{ID: "takeover-" + c.name, Function: c.fn, ParamDtype: c.dt})
			dead := h.runtime(t) // its purger never runs: it is killed before it purges anything
			x := h.shard(t, dead, &rec, grads, params)
			if err := x.restore(h.ctx); err != nil {
				t.Fatal(err)
			}
			window := store.GradWindow(&rec.Spec)
			stepWithoutPurges(t, h, x, ref, 1, window)
			refusedFull(t, h, &rec, window+1)

			r := h.runtime(t)
			y := h.shard(t, r, &rec, grads, params)
			if err := y.restore(h.ctx); err != nil {
				t.Fatal(err)
			}
			if y.step < 1 {
				t.Fatalf("restored step %d: the test needs a snapshot beyond step 0", y.step)
			}
			if !r.purger.drain(h.ctx) {
				t.Fatal("a purge failed")
			}
			// The new owner replays what its snapshot does not cover, then takes the next step.
			info, err := grads.Info(h.ctx)
			if err != nil {
				t.Fatal(err)
			}
			for seq := y.seq + 1; seq <= info.State.LastSeq; seq++ {
				m, err := grads.GetMsg(h.ctx, seq)
				if err != nil {
					t.Fatalf("replay from %d: %v", y.seq+1, err)
				}
				y.mu.Lock()
				y.handleSeq(&fakeMsg{data: m.Data, hdr: m.Header}, seq)
				y.mu.Unlock()
			}
			applyNext(t, h, y, ref, window+1)
		})
	}
}

// TestCheckpointsComeWithinTheWindow: for every function a job may have (built-in, or a user
// function with up to wasmfn.MaxSlots state vectors) and any number of ranks, a shard writes its
// next checkpoint while the gradients it needs, k+3 steps at most (checkpointEvery), still fit the
// stream's window; an interval beyond it stalls the job for good.
func TestCheckpointsComeWithinTheWindow(t *testing.T) {
	t.Parallel()
	for slots := range wasmfn.MaxSlots + 1 {
		for ranks := 1; ranks <= 64; ranks++ {
			k := checkpointEvery(slots, ranks)
			if k < 1 || k+3 > store.StorageWindow {
				t.Fatalf("%d state vectors, %d ranks: a checkpoint every %d steps, the gradient window is %d steps", slots, ranks, k, store.StorageWindow)
			}
		}
	}
	if k := checkpointEvery(2, 1); k != 3 { // adam, 1 rank: as before
		t.Fatalf("adam with 1 rank checkpoints every %d steps, want 3", k)
	}
}

// TestPurgeOfAReplacedStreamTakesNothing: a purge checks that its stream is still the incarnation
// it was scheduled for, then asks for it; between the two, on a loaded node, the job can be deleted
// and created again under the same id (the gateway does not wait for a slow drain). The purge's
// bound then lands on the new incarnation's stream, and must take none of its gradients: a lost
// gradient stalls the new job at its first step.
func TestPurgeOfAReplacedStreamTakesNothing(t *testing.T) {
	t.Parallel()
	h := newShardHarness(t)
	spec := job.Spec{ID: "replaced", Function: job.Function{Name: "sum"}}
	rec, grads, params, ref := fillJob(t, h, spec)
	r := h.runtime(t)
	x := h.shard(t, r, &rec, grads, params)
	if err := x.restore(h.ctx); err != nil {
		t.Fatal(err)
	}
	stepWithoutPurges(t, h, x, ref, 1, 4)
	r.purger.schedule(x.ji.streams[0], x.gradSj, x.replayFrom())

	var again job.Record
	r.purger.purge = func(ctx context.Context, k purgeKey, upTo uint64) error {
		// The check passed; the job is deleted and created again before the purge arrives, and
		// the new incarnation's worker publishes its first gradient.
		for _, name := range []string{wire.GradStream(spec.ID), wire.ParamsStream(spec.ID)} {
			if err := h.js.DeleteStream(ctx, name); err != nil {
				t.Fatal(err)
			}
		}
		again, _, _ = h.job(t, spec)
		if _, err := h.js.PublishMsg(ctx, fillMsg(&again, 1)); err != nil {
			t.Fatal(err)
		}
		return purgeSubject(ctx, k, upTo)
	}
	r.purger.drain(h.ctx)
	if again.Spec.ID == "" {
		t.Fatal("no purge was tried")
	}
	info, err := grads.Info(h.ctx) // the new incarnation's stream, by its name
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("the new incarnation's stream holds %d gradients after the old incarnation's purge, want its 1 (first seq %d, last %d, the purge's bound %d)",
			info.State.Msgs, info.State.FirstSeq, info.State.LastSeq, x.replayFrom())
	}
}
