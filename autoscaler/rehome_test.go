package autoscaler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/internal/view"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// A gradient stream whose server has lost its runtimes for homelessAfter moves, with what it
// holds, to the server with runtimes that holds the fewest of the job's streams; not before, and
// not from a server never seen with a runtime (a cold start). A server whose only runtime is
// draining has none.
func TestGradientStreamMovesToRuntimes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	cl := testutil.StartTaggedCluster(t, "a", "b", "c")
	nc, js := testutil.Connect(t, cl.URLs())
	ctx := t.Context()

	spec := job.Spec{ID: "spread", Tensors: []job.Tensor{{Name: "w", Shape: []int{6 * 1024}}}, Ranks: 2,
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, ShardSize: 4 << 10, GradientStreams: 4}
	spec.Normalize()
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	rec := job.NewRecord(spec, time.Now())
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a cluster just formed, on a busy machine
	err := store.CreateJobStreams(cctx, js, &rec, 1<<20, []string{"a", "b", "a", "c"})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	// Group 3's stream, on node c (server n2), holds a gradient.
	if _, err := js.Publish(ctx, wire.GradSubject(spec.ID, 3), []byte("g3")); err != nil {
		t.Fatal(err)
	}

	c, err := autoscaler.NewController(nc, nil, autoscaler.WithManualSteps(), autoscaler.WithControllerLogger(testutil.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	snap := view.Snapshot{Jobs: map[string]job.Record{spec.ID: rec}, Loads: map[string]view.Load{
		"rt-a": {LoadReport: wire.LoadReport{Runtime: "rt-a", Server: "n0"}},
	}}
	rtA, rtB, rtC := autoscaler.RuntimeObs{ID: "rt-a", Cores: 1, Server: "n0"},
		autoscaler.RuntimeObs{ID: "rt-b", Cores: 1, Server: "n1"}, autoscaler.RuntimeObs{ID: "rt-c", Cores: 1, Server: "n2"}
	obs := autoscaler.Observations{Runtimes: []autoscaler.RuntimeObs{rtA}}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	// info is group g's stream's placement tag, leader, other peers and messages. A stream whose
	// leadership is being handed over by a move answers nothing for a moment: it is asked again.
	info := func(g int) (tag, leader string, others int, msgs uint64) {
		t.Helper()
		var st jetstream.Stream
		testutil.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() (err error) {
			st, err = js.Stream(ctx, wire.GradGroupStream(spec.ID, g))
			return err
		})
		in := st.CachedInfo()
		return in.Config.Placement.Tags[0], in.Cluster.Leader, len(in.Cluster.Replicas), in.State.Msgs
	}
	// step decides at now+d; the move it asks for shows in the stream's placement at once.
	step := func(d time.Duration) {
		now = now.Add(d)
		autoscaler.Rehome(c, ctx, snap, obs, autoscaler.StreamLeaders(c, ctx, snap, now), now)
	}
	placed := func(when string, want ...string) {
		t.Helper()
		for g, node := range want {
			if tag, _, _, _ := info(g); tag != wire.NodeTag(node) {
				t.Fatalf("%s: group %d's stream placed by %s, want %s", when, g, tag, wire.NodeTag(node))
			}
		}
	}
	waitOn := func(g int, server string) {
		t.Helper()
		testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
			if _, leader, others, _ := info(g); leader != server || others != 0 {
				return fmt.Errorf("group %d's stream on %s with %d other peers, want on %s alone", g, leader, others, server)
			}
			return nil
		})
	}

	// A cold start: only rt-a is up for a minute. n1's and n2's runtimes were never seen: their
	// streams stay.
	step(0)
	step(2 * autoscaler.HomelessAfter)
	placed("while n1's and n2's runtimes were not up yet", "a", "b", "a", "c")
	// All three up; then n2's runtime goes: not before homelessAfter does its stream move.
	snap.Loads["rt-b"] = view.Load{LoadReport: wire.LoadReport{Runtime: "rt-b", Server: "n1"}}
	obs.Runtimes = []autoscaler.RuntimeObs{rtA, rtB, rtC}
	step(time.Second)
	obs.Runtimes = []autoscaler.RuntimeObs{rtA, rtB}
	step(autoscaler.HomelessAfter - time.Millisecond)
	placed("before n2 was without runtimes for long", "a", "b", "a", "c")
	// Then group 3 goes to n1, which holds one of the job's streams where n0 holds two, with its
	// gradient.
	step(time.Millisecond)
	placed("once n2 was without runtimes for long", "a", "b", "a", "b")
	waitOn(3, "n1")
	if _, _, _, msgs := info(3); msgs != 1 {
		t.Errorf("group 3's stream holds %d messages after its move, want its 1", msgs)
	}
	// rt-b drains: homelessAfter later, both of n1's streams go to n0.
	obs.Runtimes[1].Draining = true
	step(autoscaler.HomelessAfter - time.Millisecond)
	placed("before n1's runtime was draining for long", "a", "b", "a", "b")
	step(time.Millisecond)
	// Group 1 moves at once. Group 3's last move may not be over yet for JetStream (asked again
	// moveRetry later), and on a loaded machine two moves may not fit one decision (moveBudget):
	// it follows within a few decisions.
	placed("once n1's runtime was draining for long", "a", "a")
	testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if tag, _, _, _ := info(3); tag != wire.NodeTag("a") {
			step(time.Second)
			return fmt.Errorf("group 3's stream placed by %s, want %s", tag, wire.NodeTag("a"))
		}
		return nil
	})
	placed("once n1's runtime was draining for long", "a", "a", "a", "a")
	waitOn(1, "n0")
	waitOn(3, "n0")
}
