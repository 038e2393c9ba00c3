package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// A job with several gradient streams gets one per group of shards (shard mod streams), each on
// the servers of its node (their JetStream tag) and bounded for its own shards; a gradient lands in
// its shard's stream, one for a shard outside the layout finds none; a node no server is tagged
// for leaves the stream where JetStream puts it; a stream moves to another node with what it holds;
// deleting the job deletes them all.
func TestGradientStreamsPlacedOnNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	c := testutil.StartTaggedCluster(t, "a", "b", "c")
	_, js := testutil.Connect(t, c.URLs())
	ctx := t.Context()

	spec := job.Spec{
		ID:              "spread",
		Tensors:         []job.Tensor{{Name: "w", Shape: []int{6 * 1024}}},
		Ranks:           2,
		Function:        job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}},
		ShardSize:       4 << 10,
		GradientStreams: 3,
	}
	spec.Normalize()
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	rec := job.NewRecord(spec, time.Now())
	if n := rec.Layout.NumShards(); n != 6 {
		t.Fatalf("%d shards, want 6", n)
	}
	// Node "x" has no server: group 1's stream goes where JetStream chooses.
	if err := store.CreateJobStreams(ctx, js, &rec, 1<<20, []string{"c", "x", "a"}); err != nil {
		t.Fatal(err)
	}
	wantOn := map[int]string{0: "n2", 2: "n0"} // groups 0 and 2 on nodes c and a
	for g := range 3 {
		st, err := js.Stream(ctx, wire.GradGroupStream(spec.ID, g))
		if err != nil {
			t.Fatalf("group %d: %v", g, err)
		}
		info := st.CachedInfo()
		if want, ok := wantOn[g]; ok && info.Cluster.Leader != want {
			t.Errorf("group %d's stream on %s, want %s (its node's server)", g, info.Cluster.Leader, want)
		}
		if want := wire.GradGroupSubjects(spec.ID, 3, g, 6); !slices.Equal(info.Config.Subjects, want) {
			t.Errorf("group %d's subjects %v, want %v", g, info.Config.Subjects, want)
		}
		if info.Config.MaxMsgs != int64(2*2)*store.GradWindow(&rec.Spec) {
			t.Errorf("group %d holds %d messages, want ranks x its 2 shards x %d steps", g, info.Config.MaxMsgs, store.GradWindow(&rec.Spec))
		}
	}
	if _, err := js.Stream(ctx, wire.GradStream(spec.ID)); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("the one-stream name of the job: %v, want no such stream", err)
	}
	ack, err := js.Publish(ctx, wire.GradSubject(spec.ID, 4), []byte("g"))
	if err != nil || ack.Stream != wire.GradGroupStream(spec.ID, 1) {
		t.Errorf("shard 4's gradient: %+v, %v; want it in group 1's stream", ack, err)
	}
	if _, err := js.Publish(ctx, wire.GradSubject(spec.ID, 6), []byte("g")); !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("a gradient for shard 6 of 6: %v, want no stream to answer", err)
	}
	// Group 0's stream moves from node c to node b, with what it holds.
	if _, err := js.Publish(ctx, wire.GradSubject(spec.ID, 0), []byte("g0")); err != nil {
		t.Fatal(err)
	}
	moved := wire.GradGroupStream(spec.ID, 0)
	if asked, err := store.MoveStream(ctx, js, moved, wire.NodeTag("b")); err != nil || !asked {
		t.Fatalf("moving group 0's stream: asked %v, %v", asked, err)
	}
	testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		st, err := js.Stream(ctx, moved)
		if err != nil {
			return err
		}
		info := st.CachedInfo()
		if info.Cluster.Leader != "n1" || len(info.Cluster.Replicas) > 0 || info.State.Msgs != 1 {
			return fmt.Errorf("group 0's stream led by %s with %d other peers and %d messages; want on n1, alone, with its 1", info.Cluster.Leader, len(info.Cluster.Replicas), info.State.Msgs)
		}
		return nil
	})
	st, err := js.Stream(ctx, moved)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, wire.GradSubject(spec.ID, 0))
	if err != nil || string(m.Data) != "g0" {
		t.Errorf("after the move, shard 0's gradient: %v, %v", m, err)
	}
	// Moving it where it is changes nothing; a stream of three replicas is not moved.
	if asked, err := store.MoveStream(ctx, js, moved, wire.NodeTag("b")); err != nil || asked {
		t.Errorf("moved to where it is: asked %v, %v", asked, err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = js.CreateStream(rctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3"}, Storage: jetstream.MemoryStorage, Replicas: 3})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.MoveStream(ctx, js, "R3", wire.NodeTag("a")); err == nil || !strings.Contains(err.Error(), "3 replicas") {
		t.Errorf("moving a stream of 3 replicas: %v, want a refusal", err)
	}
	if err := js.DeleteStream(ctx, "R3"); err != nil {
		t.Fatal(err)
	}
	if err := store.DeleteJobStreams(ctx, js, spec.ID); err != nil {
		t.Fatal(err)
	}
	// A deletion is answered by the stream's own servers; the cluster's list follows soon after.
	testutil.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		var left []string
		for name := range js.StreamNames(ctx).Name() {
			left = append(left, name)
		}
		if len(left) > 0 {
			return fmt.Errorf("streams %v left after the job was deleted", left)
		}
		return nil
	})
}
