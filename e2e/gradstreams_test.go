package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	nn := startNATSWith(t, 3, t.TempDir(), func(i int) string {
		return fmt.Sprintf("server_tags: [%q]\n", wire.NodeTag("n"+strconv.Itoa(i)))
	})
	gw := start(t, "gateway", "gateway", "--nats", nn.url(), "--http", "127.0.0.1:0")
	f := &faninProcs{t: t, nn: nn, api: gw.waitFor(t, httpURL, 30*time.Second), gw: gw}
	// A pool of three runtimes kept: with the default policy this small job would be packed on one.
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("min_runtimes: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	start(t, "autoscaler", "autoscaler", "--nats", nn.url(), "--interval", "200ms", "--policy", policy)
	// Runtimes named against their servers' order, so that placing shards round-robin by name
	// would not put them on their streams' servers by chance.
	onServer := map[string]string{"n0": "rt-c", "n1": "rt-a", "n2": "rt-b"}
	for i, port := range nn.ports {
		id := onServer["n"+strconv.Itoa(i)]
		start(t, id, "runtime", "--nats", fmt.Sprintf("nats://127.0.0.1:%d", port), "--id", id, "--nic-bandwidth", "0")
	}
	// The gateway places the streams on the nodes of the runtimes it has heard from.
	ctx := context.Background()
	admin := sdk.NewAdmin(f.api)
	testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		pool, err := admin.Pool(ctx)
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

	spec := clusterSpec("groups", "momentum")
	spec.GradientStreams = 3
	// The small tensor first: shard 0 is the smallest, placed last (largest first), so that
	// placement's own order does not put every shard on its stream's server by chance.
	spec.Tensors[0], spec.Tensors[1] = spec.Tensors[1], spec.Tensors[0]
	tt := f.train(spec)
	tt.run(12)
	tt.checkUpdates(nn.url())

	nc, err := nats.Connect(nn.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	leaders := map[int]string{}
	for g := range 3 {
		leaders[g] = nn.leaderOf(wire.GradGroupStream(spec.ID, g))
	}
	if len(map[string]bool{leaders[0]: true, leaders[1]: true, leaders[2]: true}) != 3 {
		t.Errorf("the job's gradient streams are on %v: want one on each server", leaders)
	}
	placement, err := admin.Placement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	served := 0
	for _, p := range placement {
		if p.Job != spec.ID {
			continue
		}
		served++
		want := onServer[leaders[p.Shard%3]]
		if p.Runtime != want {
			t.Errorf("shard %d served by %s, its stream on %s: want %s", p.Shard, p.Runtime, leaders[p.Shard%3], want)
		}
	}
	if served != tt.rec.Layout.NumShards() {
		t.Errorf("%d shards placed, want %d", served, tt.rec.Layout.NumShards())
	}
	if _, err := js.Stream(ctx, wire.GradStream(spec.ID)); err == nil {
		t.Errorf("the job has a stream under the one-stream name too")
	}
}
