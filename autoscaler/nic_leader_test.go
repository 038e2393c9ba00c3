package autoscaler_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/internal/view"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// The control loop learns which server of a NATS cluster leads each job's parameter stream (and
// each of its gradient streams when it has several), asks again only after leaderRefresh, forgets
// jobs that are gone, and asks nothing while no runtime reports its server.
func TestStreamLeadersFromACluster(t *testing.T) {
	t.Parallel()
	cl := testutil.StartCluster(t, 3)
	nc, err := nats.Connect(cl.URLs())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A cluster just formed, on a machine busy with the package's other tests, took more than
	// the 5 s that a request is given by default to create a stream.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := js.CreateStream(cctx, jetstream.StreamConfig{Name: wire.ParamsStream("j"), Subjects: []string{"test.params.j"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	leader := st.CachedInfo().Cluster.Leader
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if cl.Index(leader) < 0 {
		t.Fatalf("stream led by %q, not a node of the cluster", leader)
	}
	c, err := autoscaler.NewController(nc, nil, autoscaler.WithManualSteps())
	if err != nil {
		t.Fatal(err)
	}
	snap := view.Snapshot{Jobs: map[string]job.Record{"j": {}, "gone": {}}, Loads: map[string]view.Load{}}
	if got := autoscaler.StreamLeaders(c, ctx, snap, at); got != nil {
		t.Fatalf("leaders %v asked for while no runtime reports its server", got)
	}
	snap.Loads["rt-a"] = view.Load{LoadReport: wire.LoadReport{Runtime: "rt-a", Server: "n0"}}
	if got := autoscaler.StreamLeaders(c, ctx, snap, at); got[wire.ParamsStream("j")] != leader || got[wire.ParamsStream("gone")] != "" {
		t.Fatalf("leaders %v, want j led by %s and no leader for a job without streams", got, leader)
	}
	// A job with two gradient streams: both leaders are learnt.
	var gradLeaders []string
	for g := range 2 {
		gctx, cancel := context.WithTimeout(ctx, 30*time.Second) // each its own: cctx may be nearly spent
		gs, err := js.CreateStream(gctx, jetstream.StreamConfig{Name: wire.GradGroupStream("g", g), Subjects: []string{wire.GradSubject("g", g)}, Storage: jetstream.MemoryStorage})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		gradLeaders = append(gradLeaders, gs.CachedInfo().Cluster.Leader)
	}
	snap.Jobs["g"] = job.Record{Spec: job.Spec{GradientStreams: 2}}
	got := autoscaler.StreamLeaders(c, ctx, snap, at)
	for g, want := range gradLeaders {
		if got[wire.GradGroupStream("g", g)] != want {
			t.Errorf("leaders %v, want gradient stream %d of g led by %s", got, g, want)
		}
	}
	delete(snap.Jobs, "g")
	if err := js.DeleteStream(ctx, wire.ParamsStream("j")); err != nil {
		t.Fatal(err)
	}
	if got := autoscaler.StreamLeaders(c, ctx, snap, at.Add(autoscaler.LeaderRefresh-time.Millisecond)); got[wire.ParamsStream("j")] != leader {
		t.Errorf("asked again before leaderRefresh: %v", got)
	}
	if got := autoscaler.StreamLeaders(c, ctx, snap, at.Add(autoscaler.LeaderRefresh)); got[wire.ParamsStream("j")] != "" {
		t.Errorf("after leaderRefresh the deleted stream still has leader %q", got[wire.ParamsStream("j")])
	}
	// A job that is gone is forgotten: created again with streams, it is asked about at once.
	delete(snap.Jobs, "gone")
	autoscaler.StreamLeaders(c, ctx, snap, at.Add(autoscaler.LeaderRefresh))
	st, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.ParamsStream("gone"), Subjects: []string{"test.params.gone"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	snap.Jobs["gone"] = job.Record{}
	if got := autoscaler.StreamLeaders(c, ctx, snap, at.Add(autoscaler.LeaderRefresh)); got[wire.ParamsStream("gone")] != st.CachedInfo().Cluster.Leader {
		t.Errorf("a job created again: leader %q, want %q", got[wire.ParamsStream("gone")], st.CachedInfo().Cluster.Leader)
	}
}
