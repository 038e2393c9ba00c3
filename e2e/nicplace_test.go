package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// nicPolicy lets the pool shrink to one runtime within seconds: the job's work needs a fraction of
// one core, so by cores alone every shard would end on one runtime.
const nicPolicy = `
min_runtimes: 1
stable_window: 2s
scale_down_cooldown: 1s
startup_grace: 1s
`

// TestNICBoundJobSpreadsOverNodes: three NATS servers (three nodes), a runtime connected to each
// with a NIC of 500 kbit/s, and a job whose bytes need more than one such NIC. The autoscaler
// spreads the job's shards over the three nodes' runtimes and keeps all three while it trains, bit
// for bit, although its cores would fit on one; each runtime's load reports name its node (its
// server) and NIC, and the bytes per second of its shards.
func TestNICBoundJobSpreadsOverNodes(t *testing.T) {
	skipShort(t) // not parallel: the servers listen on ports FreePort found free
	nn := startNATS(t, 3)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte(nicPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, "gateway", "gateway", "--nats", nn.url(), "--http", "127.0.0.1:0").waitFor(t, httpURL, 30*time.Second)
	start(t, "autoscaler", "autoscaler", "--nats", nn.url(), "--policy", pol, "--interval", "200ms")
	const nic = 500e3 / 8 // bytes per second
	rts := map[string]*proc{}
	for i, port := range nn.ports {
		id := fmt.Sprintf("rt-n%d", i)
		rts[id] = start(t, id, "runtime", "--nats", fmt.Sprintf("nats://127.0.0.1:%d", port), "--id", id,
			"--nic-bandwidth", "500kbit")
	}

	nc, err := nats.Connect(nn.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	reports := map[string]wire.LoadReport{} // the latest of each runtime
	var drained []string                    // runtimes drained by a decision once the job is spread
	spreadOut := false
	sub, err := nc.Subscribe(wire.LoadWildcard, func(m *nats.Msg) {
		var rep wire.LoadReport
		if json.Unmarshal(m.Data, &rep) == nil {
			mu.Lock()
			reports[rep.Runtime] = rep
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	dsub, err := nc.Subscribe(wire.DecisionsSubject, func(m *nats.Msg) { // decisions that change something
		var d wire.Decision
		if json.Unmarshal(m.Data, &d) == nil {
			mu.Lock()
			if spreadOut { // before the job, an empty pool shrinks by the policy
				drained = append(drained, d.Drain...)
			}
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dsub.Unsubscribe() }()
	// Every runtime reports its node, the server it is connected to, and its NIC.
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		for i := range nn.ports {
			id, want := fmt.Sprintf("rt-n%d", i), fmt.Sprintf("n%d", i)
			rep, ok := reports[id]
			if !ok {
				return fmt.Errorf("no load report from %s", id)
			}
			if rep.Node != want || rep.Server != want || rep.NICBytesPerSec != nic {
				return fmt.Errorf("%s reports node %q, server %q, NIC %v; want %s, %s, %v", id, rep.Node, rep.Server, rep.NICBytesPerSec, want, want, nic)
			}
		}
		return nil
	})

	// 7 shards of 4 ranks x 4 KiB a step: 16 KB/s each before any step is measured (over a
	// second), 3 shards to a NIC's 50 KB/s at 80%; measured, far more than one NIC.
	spec := clusterSpec("spread", "sgd")
	rec := createJob(t, nn.url(), spec)
	if n := rec.Layout.NumShards(); n != 7 {
		t.Fatalf("layout of %d shards, the test counts on 7", n)
	}
	tr := newTrainer(t, nn.url(), rec)
	tr.onStall = func() { nn.dumpJob(rec) }
	tr.run(20)

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := store.OpenBuckets(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	spread := func() error {
		clear(per)
		for _, sh := range rec.Layout.Shards {
			e, err := b.Placement.Get(context.Background(), wire.PlacementKey(rec.Spec.ID, sh.ID))
			if err != nil {
				return fmt.Errorf("shard %d: %w", sh.ID, err)
			}
			var p wire.Placement
			if err := json.Unmarshal(e.Value(), &p); err != nil {
				return err
			}
			per[p.Runtime]++
		}
		for id := range rts {
			if per[id] == 0 {
				return fmt.Errorf("shards per runtime %v: none on %s", per, id)
			}
		}
		return nil
	}
	testutil.CheckFor(t, 30*time.Second, 200*time.Millisecond, spread)
	mu.Lock()
	spreadOut = true
	mu.Unlock()
	// It stays so while the job trains on for 5 s: more than twice the stable window plus the
	// scale-down cooldown, in which cores alone would have drained two runtimes.
	for until := time.Now().Add(5 * time.Second); time.Now().Before(until); {
		tr.run(tr.step + 5)
	}
	if err := spread(); err != nil {
		t.Fatalf("after 5 s more: %v", err)
	}
	t.Logf("after %d steps, shards per runtime: %v", tr.step, per)
	for id, p := range rts {
		select {
		case <-p.done:
			t.Errorf("runtime %s stopped: the pool shrank although the bytes need its node", id)
		default:
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(drained) > 0 {
		t.Errorf("decisions drained %v: the bytes need every node", drained)
	}
	for id, rep := range reports {
		for _, s := range rep.Shards {
			if s.BytesInPerSec <= 0 || s.BytesOutPerSec <= 0 {
				t.Errorf("%s reports shard %s with %v bytes/s in and %v out", id, s.Key, s.BytesInPerSec, s.BytesOutPerSec)
			}
			t.Logf("%s on %s: %.0f B/s in, %.0f B/s out", s.Key, id, s.BytesInPerSec, s.BytesOutPerSec)
		}
	}
}
