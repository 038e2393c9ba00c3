package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// A direct-gradients job whose shards checkpoint every step (adam) on a cluster of
// three servers, each tagged with its node: every runtime writes the checkpoints of the shards it
// serves to the job's stream on its own node, none to the parameter stream; a shard migrated to
// another node, and a runtime crashed, restore the newest of them, and every step's parameters
// equal the reference bit for bit. Deleting the job deletes the node streams.
func TestCheckpointsStayOnTheServingNode(t *testing.T) {
	t.Parallel()
	opts := testutil.ClusterOptions(t, 3)
	for i, o := range opts {
		o.Tags = jwt.TagList{wire.NodeTag(fmt.Sprintf("n%d", i))}
	}
	cl := testutil.StartClusterOf(t, opts)
	ctx := context.Background()
	nc, err := nats.Connect(cl.URLs())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	gw, err := gateway.New(ctx, nc, gateway.WithLogger(testutil.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := store.OpenBuckets(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	pl := placer{b.Placement}
	url := func(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", opts[i].Port) }
	rts := make([]*crashableRuntime, 3)
	for i := range rts {
		rts[i] = startRuntime(t, url(i), "rt-"+strconv.Itoa(i))
	}
	spec := testSpec("home", "adam", map[string]float64{"lr": 0.05})
	spec.Ranks, spec.Gradients = 2, job.GradientsDirect
	rec, err := gw.CreateJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	n := rec.Layout.NumShards()
	node := map[int]int{} // shard -> the node (and runtime) serving it
	for s := range n {
		node[s] = s % 3
		pl.place(t, wire.PlacementKey(rec.Spec.ID, s), "rt-"+strconv.Itoa(s%3))
	}
	workers := rankWorkers(t, rec.Spec.ID, spec.Ranks, url)
	_, init, err := workers[0].Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(f, spec.Ranks, rec.Layout.Ranges(), init)
	params := append([]float32(nil), init...)
	// ckptStep is shard s's checkpoint step in node i's stream (-1 none), and where says on which
	// server that stream is.
	ckptStep := func(s, i int) (int64, string) {
		name := wire.NodeCkptStream(rec.Spec.ID, fmt.Sprintf("n%d", i))
		st, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return -1, ""
		}
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.GetLastMsgForSubject(ctx, wire.NodeCkptSubject(rec.Spec.ID, fmt.Sprintf("n%d", i), s))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return -1, st.CachedInfo().Cluster.Leader
		}
		if err != nil {
			t.Fatal(err)
		}
		v, _ := strconv.ParseInt(m.Header.Get(wire.HdrStep), 10, 64)
		return v, st.CachedInfo().Cluster.Leader
	}
	// movedAt is the step at whose start a shard was moved to a live runtime: the old owner may still
	// serve that step (and checkpoint it on its own node) while the handover completes, so the new
	// node's stream is checked from the next step on. (A runtime that crashed serves nothing more.)
	movedAt := map[int]int64{}
	check := func(step int64) {
		t.Helper()
		for s := range n {
			if movedAt[s] == step {
				continue
			}
			testutil.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
				got, on := ckptStep(s, node[s])
				if got < step-1 || on != fmt.Sprintf("n%d", node[s]) {
					return fmt.Errorf("after step %d, shard %d's checkpoint in node n%d's stream is of step %d, the stream on %q", step, s, node[s], got, on)
				}
				return nil
			})
		}
		params, err := js.Stream(ctx, wire.ParamsStream(rec.Spec.ID))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := params.GetLastMsgForSubject(ctx, wire.CkptWildcard(rec.Spec.ID)); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("a checkpoint in the parameter stream (%v)", err)
		}
	}
	const steps = 9
	for step := int64(1); step <= steps; step++ {
		switch step {
		case 4: // shard 0 moves from n0 to n1
			pl.place(t, wire.PlacementKey(rec.Spec.ID, 0), "rt-1")
			node[0], movedAt[0] = 1, step
		case 7: // rt-2 dies: its shards go to rt-0
			rts[2].crash()
			for s := range n {
				if node[s] == 2 {
					pl.place(t, wire.PlacementKey(rec.Spec.ID, s), "rt-0")
					node[s] = 0
				}
			}
		}
		params = trainWithWorkers(t, workers, ref, params, step-1, step)
		check(step)
	}
	if err := store.DeleteJobStreams(ctx, js, rec.Spec.ID); err != nil {
		t.Fatal(err)
	}
	// On a loaded machine the cluster's stream list can still name a stream just after its delete
	// was answered (once in 14 runs with the cores kept busy; not found 3 s later): none may
	// remain once the list has caught up.
	testutil.CheckFor(t, 15*time.Second, 50*time.Millisecond, func() error {
		names := js.StreamNames(ctx, jetstream.WithStreamListSubject(wire.NodeCkptFilter(rec.Spec.ID)))
		var left []string
		for name := range names.Name() {
			left = append(left, name)
		}
		if len(left) > 0 {
			return fmt.Errorf("streams %v left after the job's streams were deleted", left)
		}
		return nil
	})
}
