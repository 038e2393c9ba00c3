package runtime

import (
	"testing"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// TestSweepLeavesTheNextIncarnationAlone: an executor of a deleted 1-shard job, still stopping
// when the job is created again under its id with 3 shards, must not sweep the new job's
// gradients of shards 1 and 2 as addressed to shards that do not exist; it swept them (rejected
// and purged), and the new job's first step never completed. Its own incarnation's unknown
// shards it still sweeps.
func TestSweepLeavesTheNextIncarnationAlone(t *testing.T) {
	t.Parallel()
	h := newShardHarness(t)
	spec := job.Spec{ID: "again", Tensors: []job.Tensor{{Name: "w", Shape: []int{1024}}}, Ranks: 1,
		Function: job.Function{Name: "sum"}, ShardSize: 4 << 10}
	rec, grads, params := h.job(t, spec)
	if rec.Layout.NumShards() != 1 {
		t.Fatalf("%d shards, want 1", rec.Layout.NumShards())
	}
	x := h.shard(t, h.runtime(t), &rec, grads, params)
	grad := func(shard int) uint64 {
		t.Helper()
		ack, err := h.js.PublishMsg(h.ctx, wire.GradMsg(wire.Grad{Job: spec.ID, Shard: shard, Step: 1, Rank: 0}, make([]byte, 4096)))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	// Its own incarnation: shard 1 does not exist.
	seq := grad(1)
	x.sweepUnknownShards(h.ctx)
	if _, err := grads.GetMsg(h.ctx, seq); err == nil {
		t.Fatal("a gradient to a shard the job does not have was not swept")
	}

	// The job deleted and created again, with 3 shards.
	if err := store.DeleteJobStreams(h.ctx, h.js, spec.ID); err != nil {
		t.Fatal(err)
	}
	spec.Tensors[0].Shape = []int{2560}
	next, nextGrads, _ := h.job(t, spec)
	if next.Layout.NumShards() != 3 {
		t.Fatalf("%d shards, want 3", next.Layout.NumShards())
	}
	seqs := []uint64{grad(1), grad(2)}
	x.sweepUnknownShards(h.ctx)
	for _, seq := range seqs {
		if _, err := nextGrads.GetMsg(h.ctx, seq); err != nil {
			t.Fatalf("the new job's gradient at sequence %d was swept by the old job's executor: %v", seq, err)
		}
	}
}
