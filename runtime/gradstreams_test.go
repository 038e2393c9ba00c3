package runtime_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// TestGradientStreamsBitExact: a job whose gradients are kept in three streams (shard mod 3)
// trains bit-exact on three runtimes, through a runtime's stop in the middle (its shards, with
// optimizer state, restore and replay from their own group's stream on another runtime); every
// group's stream took its shards' gradients, the checkpoints are in node streams, and the job has
// no stream under the one-stream name.
func TestGradientStreamsBitExact(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 3)
	ctx := context.Background()
	spec := testSpec("groups", "adam", map[string]float64{"lr": 0.01})
	spec.GradientStreams = 3
	rec, err := st.Gateway.CreateJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	shards := rec.Layout.NumShards()
	if shards < 6 {
		t.Fatalf("%d shards: want two or more per stream", shards)
	}
	workers := rankWorkers(t, rec.Spec.ID, rec.Spec.Ranks, func(int) string { return st.URL })
	_, init, err := workers[0].Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(f, rec.Spec.Ranks, rec.Layout.Ranges(), init)
	params := append([]float32(nil), init...)
	params = trainWithWorkers(t, workers, ref, params, 0, 6)
	st.StopRuntime(st.Runtimes()[0].ID())
	trainWithWorkers(t, workers, ref, params, 6, 12)

	_, js := testutil.Connect(t, st.URL)
	for g := range 3 {
		s, err := js.Stream(ctx, wire.GradGroupStream(rec.Spec.ID, g))
		if err != nil {
			t.Fatalf("gradient stream %d: %v", g, err)
		}
		// Every gradient of the group's shards went through it: its last sequence counts them from
		// the incarnation's first (the runtimes purge what they applied).
		info := s.CachedInfo()
		groupShards := len(wire.GradGroupSubjects(rec.Spec.ID, 3, g, shards))
		if got, want := info.State.LastSeq-info.Config.FirstSeq+1, uint64(12*rec.Spec.Ranks*groupShards); got < want {
			t.Errorf("gradient stream %d stored %d messages, want at least %d (12 steps x %d ranks x %d shards)", g, got, want, rec.Spec.Ranks, groupShards)
		}
	}
	// The shards' checkpoints (adam's state, every step) are kept on their runtimes' node, as a
	// direct job's are.
	ckpts := 0
	for range js.StreamNames(ctx, jetstream.WithStreamListSubject(wire.NodeCkptFilter(rec.Spec.ID))).Name() {
		ckpts++
	}
	if ckpts == 0 {
		t.Errorf("no node checkpoint stream: the checkpoints went to the parameter stream")
	}
	if _, err := js.Stream(ctx, wire.GradStream(rec.Spec.ID)); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("the one-stream name: %v, want no such stream", err)
	}
}
