package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// A job with a gradient stream per node, on a cluster of three servers tagged with their nodes and
// a runtime process on each: every group's stream is on a server of a runtime's node, every shard
// is served by the runtime connected to its stream's server (so its gradients reach the runtime
// without a second hop), and the job trains bit-exact, every stored update counted.
func TestGradientStreamsOnTheirNodes(t *testing.T) {
	skipShort(t)
	g := startGroups(t)
	f, nn, admin, ctx := g.f, g.nn, g.admin, context.Background()

	spec := clusterSpec("groups", "momentum")
	spec.GradientStreams = 3
	// The small tensor first: shard 0 is the smallest, placed last (largest first), so that
	// placement's own order does not put every shard on its stream's server by chance.
	spec.Tensors[0], spec.Tensors[1] = spec.Tensors[1], spec.Tensors[0]
	tt := f.train(spec)
	tt.run(12)
	tt.checkUpdates(nn.url())

	_, js := testutil.Connect(t, nn.url())
	leaders := g.leaders(spec.ID, 3)
	if len(map[string]bool{leaders[0]: true, leaders[1]: true, leaders[2]: true}) != 3 {
		t.Errorf("the job's gradient streams are on %v: want one on each server", leaders)
	}
	// Every shard at home: at once, or within a few decisions when a question to JetStream about a
	// stream's leader failed on a loaded machine (asked again at the next decision).
	testutil.CheckFor(t, 30*time.Second, 200*time.Millisecond, func() error {
		away, err := g.awayFromHome(tt.rec, leaders)
		if err == nil && len(away) > 0 {
			err = fmt.Errorf("%d shards away from their stream's server: %v", len(away), away)
		}
		return err
	})
	placement, err := admin.Placement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	served := 0
	for _, p := range placement {
		if p.Job == spec.ID {
			served++
		}
	}
	if served != tt.rec.Layout.NumShards() {
		t.Errorf("%d shards placed, want %d", served, tt.rec.Layout.NumShards())
	}
	if _, err := js.Stream(ctx, wire.GradStream(spec.ID)); err == nil {
		t.Errorf("the job has a stream under the one-stream name too")
	}
	// The gateway tells the operator where the streams went.
	if out := f.gw.output(); !strings.Contains(out, "gradient streams placed") || !strings.Contains(out, "job=groups") {
		t.Errorf("the gateway did not log where the job's gradient streams are:\n%s", out)
	}
}

// groupsCluster is a cluster of three nats-server processes tagged with their nodes (n0..n2), the
// gateway and an autoscaler keeping three runtimes, and a runtime process on each server, named
// against the servers' order; every runtime has reported its node.
type groupsCluster struct {
	f        *faninProcs
	nn       *natsNodes
	admin    *sdk.Admin
	onServer map[string]string // server -> the runtime connected to it
	rts      map[string]*proc  // runtime id -> its process
	as       *proc             // the autoscaler
}

func startGroups(t *testing.T) *groupsCluster {
	t.Helper()
	nn := startNATSWith(t, 3, t.TempDir(), func(i int) string {
		return fmt.Sprintf("server_tags: [%q]\n", wire.NodeTag("n"+strconv.Itoa(i)))
	})
	gw := start(t, "gateway", "gateway", "--nats", nn.url(), "--http", "127.0.0.1:0")
	g := &groupsCluster{nn: nn, f: &faninProcs{t: t, nn: nn, api: gw.waitFor(t, httpURL, 30*time.Second), gw: gw},
		onServer: map[string]string{"n0": "rt-c", "n1": "rt-a", "n2": "rt-b"}, rts: map[string]*proc{}}
	g.admin = sdk.NewAdmin(g.f.api)
	// A pool of three runtimes kept: with the default policy a small job would be packed on one.
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("min_runtimes: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g.as = start(t, "autoscaler", "autoscaler", "--nats", nn.url(), "--interval", "200ms", "--policy", policy)
	for i := range nn.ports {
		g.startRuntime(i)
	}
	// The gateway places the streams on the nodes of the runtimes it has heard from.
	testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		pool, err := g.admin.Pool(context.Background())
		if err != nil {
			return err
		}
		reported := 0
		for _, rt := range pool.Runtimes {
			if rt.Reported != nil && rt.Node != "" {
				reported++
			}
		}
		if reported < 3 {
			return fmt.Errorf("%d of 3 runtimes reported their node", reported)
		}
		return nil
	})
	return g
}

// startRuntime starts the runtime of server i, connected to that server only.
func (g *groupsCluster) startRuntime(i int) {
	id := g.onServer["n"+strconv.Itoa(i)]
	g.rts[id] = start(g.f.t, id, "runtime", "--nats", fmt.Sprintf("nats://127.0.0.1:%d", g.nn.ports[i]), "--id", id, "--nic-bandwidth", "0")
}

// train starts job id, updated by function fn, with a gradient stream per server and its small
// tensor first (as TestGradientStreamsOnTheirNodes), runs it to step 5 and returns it with its
// streams' leaders.
func (g *groupsCluster) train(id, fn string) (*timedTrainer, map[int]string) {
	spec := clusterSpec(id, fn)
	spec.GradientStreams = 3
	spec.Tensors[0], spec.Tensors[1] = spec.Tensors[1], spec.Tensors[0]
	tt := g.f.train(spec)
	tt.run(5)
	return tt, g.leaders(spec.ID, 3)
}

// leaders are the servers leading job id's n gradient streams, by group.
func (g *groupsCluster) leaders(id string, n int) map[int]string {
	leaders := map[int]string{}
	for i := range n {
		leaders[i] = g.nn.leaderOf(wire.GradGroupStream(id, i))
	}
	return leaders
}

// awayFromHome lists the shards of job rec served by a runtime other than their stream's server's.
func (g *groupsCluster) awayFromHome(rec *job.Record, leaders map[int]string) ([]string, error) {
	placement, err := g.admin.Placement(context.Background())
	if err != nil {
		return nil, err
	}
	n := rec.Spec.GradStreams()
	var away []string
	for _, p := range placement {
		if p.Job == rec.Spec.ID && p.Runtime != g.onServer[leaders[p.Shard%n]] {
			away = append(away, fmt.Sprintf("shard %d on %s, its stream on %s", p.Shard, p.Runtime, leaders[p.Shard%n]))
		}
	}
	return away, nil
}

// A job with a gradient stream per node, on a machine kept busy by two other processes, through
// faults: the SIGKILL of a runtime (its shards are served on the other nodes, then go back home
// once a runtime of their node is up again) and the SIGKILL of a node's NATS server holding a
// stream (file storage: it restarts with its gradients). Every step stays bit-exact and every
// stored update is counted.
func TestFaultsGradientStreams(t *testing.T) {
	skipShort(t)
	burnCores(t, 2)
	g := startGroups(t)
	tt, leaders := g.train("faults", "adam")
	spec := tt.rec.Spec

	// The runtime of n1's stream dies: its shards go elsewhere, and training goes on.
	victim := g.onServer[leaders[1]]
	g.rts[victim].stop(syscall.SIGKILL)
	killed := time.Now()
	tt.run(10)
	// Started again, its node's shards come back to it, and its stream stays: it was back well
	// within the 30 s after which the stream would have moved to another runtime's server
	// (TestGradientStreamLeavesANodeWithoutRuntimes).
	g.startRuntime(g.nn.index(leaders[1]))
	back := time.Since(killed)
	testutil.CheckFor(t, 60*time.Second, 200*time.Millisecond, func() error {
		tt.run(tt.step + 1)
		if now := g.leaders(spec.ID, 3); now[1] != leaders[1] {
			t.Fatalf("group 1's stream moved from %s to %s; its runtime was restarted %v after its SIGKILL", leaders[1], now[1], back.Round(time.Second))
		}
		away, err := g.awayFromHome(tt.rec, leaders)
		if err == nil && len(away) > 0 {
			err = fmt.Errorf("%d shards away from home: %v", len(away), away)
		}
		return err
	})

	// The server holding group 2's stream dies and comes back with its file store.
	down := g.nn.index(leaders[2])
	g.nn.kill(down)
	at := tt.step
	g.nn.restart(down)
	tt.run(at + 5)
	tt.checkUpdates(g.nn.url())
	t.Logf("%d steps bit-exact through a runtime's and a stream server's SIGKILL", tt.step)
}

// A job with a gradient stream per node whose node loses its runtime for good while its NATS
// server runs on: after the autoscaler's grace period (30 s) the stream moves, with what it holds,
// to a server that has a runtime, its shards are served there, and the job trains on bit-exact.
func TestGradientStreamLeavesANodeWithoutRuntimes(t *testing.T) {
	skipShort(t)
	g := startGroups(t)
	tt, leaders := g.train("leaves", "momentum")
	spec := tt.rec.Spec
	left := leaders[2]
	g.rts[g.onServer[left]].stop(syscall.SIGKILL)
	testutil.CheckFor(t, 120*time.Second, 200*time.Millisecond, func() error {
		tt.run(tt.step + 1)
		if now := g.nn.leaderOf(wire.GradGroupStream(spec.ID, 2)); now == left || now == "" {
			return fmt.Errorf("group 2's stream still on %q, whose runtime is gone", now)
		}
		return nil
	})
	moved := tt.step
	testutil.CheckFor(t, 60*time.Second, 200*time.Millisecond, func() error {
		tt.run(tt.step + 1)
		away, err := g.awayFromHome(tt.rec, g.leaders(spec.ID, 3))
		if err == nil && len(away) > 0 {
			err = fmt.Errorf("%d shards away from their stream's server: %v", len(away), away)
		}
		return err
	})
	tt.run(tt.step + 5)
	tt.checkUpdates(g.nn.url())
	if out := g.as.output(); !strings.Contains(out, "moving a gradient stream") {
		t.Errorf("the autoscaler did not log the move:\n%s", out)
	}
	t.Logf("group 2's stream moved off %s by step %d; %d steps bit-exact", left, moved, tt.step)
}
