package runtime

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// TestRestoreFromOlderParametersKeepsHeldGradients: an ssp shard of a param_dtype bf16 job that
// restores from an f32 parameters message of a runtime of before param_dtype (rolling upgrade)
// writes its first checkpoint at once, before it replays. That parameters message says replay
// starts below its own sequence (Fanin-Replay-From: a gradient of a later step, accepted and held,
// came before the one that completed the step). The checkpoint must say the same and purge
// nothing at or above it: it said Fanin-Seq+1 (the held gathers are empty until the replay) and
// purged the held gradient, which no restore could then apply.
func TestRestoreFromOlderParametersKeepsHeldGradients(t *testing.T) {
	t.Parallel()
	h := newShardHarness(t)
	ctx, js := h.ctx, h.js

	spec := job.Spec{ID: "sspup", Tensors: []job.Tensor{{Name: "w", Shape: []int{1000}}}, Ranks: 2, Sync: "ssp", Staleness: 1,
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, ParamDtype: wire.DtypeBF16}
	rec, grads, params := h.job(t, spec)
	old := rec // the job as a runtime of before param_dtype reads it: f32 parameters
	oldSpec := rec.Spec
	oldSpec.ParamDtype = ""
	old.Spec = oldSpec
	if err := store.PublishParams(ctx, js, spec.ID, "", 0, 0, 0, make([]byte, 4000)); err != nil {
		t.Fatal(err)
	}
	// The old runtime: steps 1 and 2, rank 0 sending step 3 (from version 1) before rank 1's step 2.
	r0 := h.runtime(t) // its acker and purger do not run: the test plays them
	x0 := h.shard(t, r0, &old, grads, params)
	if !x0.paramsSnap {
		t.Fatal("the old runtime's view: paramsSnap false")
	}
	if err := x0.restore(ctx); err != nil {
		t.Fatal(err)
	}
	var heldSeq uint64
	for _, g := range []struct{ step, rank, version int }{{1, 0, 0}, {1, 1, 0}, {2, 0, 1}, {3, 0, 1}, {2, 1, 1}} {
		m := nats.NewMsg(wire.GradSubject(spec.ID, 0))
		m.Header.Set(wire.HdrStep, strconv.Itoa(g.step))
		m.Header.Set(wire.HdrRank, strconv.Itoa(g.rank))
		m.Header.Set(wire.HdrVersion, strconv.Itoa(g.version))
		m.Header.Set(wire.HdrDtype, wire.DtypeF32)
		m.Data = make([]byte, 4000)
		for i := range 1000 {
			m.Data[4*i+3] = byte(0x3c + g.step) // a small positive gradient, different per step
		}
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		if g.step == 3 {
			heldSeq = ack.Sequence
		}
		x0.mu.Lock()
		x0.handleSeq(&fakeMsg{data: m.Data, hdr: m.Header}, ack.Sequence)
		x0.mu.Unlock()
	}
	for len(r0.acks.queue) > 0 {
		it := <-r0.acks.queue
		it.done(r0.acks.wait(ctx, it))
	}
	r0.purger.drain(ctx)
	pm, err := params.GetLastMsgForSubject(ctx, wire.ParamsSubject(spec.ID, 0))
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := wire.ParseStep(pm.Header); s != 2 || pm.Header.Get(wire.HdrReplayFrom) != strconv.FormatUint(heldSeq, 10) {
		t.Fatalf("the old runtime's parameters: step %d, %s %q; want step 2 replaying from %d (the held gradient)", s, wire.HdrReplayFrom, pm.Header.Get(wire.HdrReplayFrom), heldSeq)
	}

	// The new runtime takes the shard over.
	r1 := h.runtime(t)
	x1, err := newShardExec(r1, newJobInfo(&rec, []jetstream.Stream{grads}, params, nil), 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	x1.cancel = func() {}
	if err := x1.restore(ctx); err != nil {
		t.Fatalf("restore: %v", err)
	}
	ck, err := params.GetLastMsgForSubject(ctx, wire.CkptSubject(spec.ID, 0))
	if err != nil {
		t.Fatalf("no checkpoint after the restore: %v", err)
	}
	if got := ck.Header.Get(wire.HdrReplayFrom); got != strconv.FormatUint(heldSeq, 10) {
		t.Errorf("first checkpoint: %s %q, want %d (the held step-3 gradient of rank 0)", wire.HdrReplayFrom, got, heldSeq)
	}
	r1.purger.drain(ctx)
	if _, err := grads.GetMsg(ctx, heldSeq); err != nil {
		t.Fatalf("the held gradient at sequence %d, accepted and never applied, is gone: %v", heldSeq, err)
	}
}
