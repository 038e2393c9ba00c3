package autoscaler

import (
	"testing"

	"github.com/fanin-ml/fanin/internal/view"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// The control loop reads the runtimes' nodes, servers and NICs from their load reports, and each
// shard's bytes: in as measured, out times the job's ranks (every rank's worker receives the
// parameters). A report without them leaves them zero.
func TestObserveReadsNodesAndBytes(t *testing.T) {
	t.Parallel()
	s := job.Spec{ID: "j", Tensors: []job.Tensor{{Name: "w", Shape: []int{1024}}}, Ranks: 3,
		Function: job.Function{Name: "sum"}, ShardSize: 4096}
	snap := view.Snapshot{
		Jobs: map[string]job.Record{"j": job.NewRecord(s, t0)},
		Runtimes: map[string]view.Runtime{
			"rt-a": {RuntimeInfo: wire.RuntimeInfo{ID: "rt-a", Cores: 4}, Beat: t0, Registered: t0},
			"rt-b": {RuntimeInfo: wire.RuntimeInfo{ID: "rt-b", Cores: 4}, Beat: t0, Registered: t0},
		},
		Placement: map[string]view.Placed{"j.0": {Placement: wire.Placement{Runtime: "rt-a"}}},
		Loads: map[string]view.Load{
			"rt-a": {LoadReport: wire.LoadReport{Runtime: "rt-a", Cores: 4, Node: "host-1", Server: "n1", NICBytesPerSec: mbit100,
				Shards: []wire.ShardLoad{{Key: "j.0", Job: "j", BytesInPerSec: 1200, BytesOutPerSec: 100}}}},
			"rt-b": {LoadReport: wire.LoadReport{Runtime: "rt-b", Cores: 4}},
		},
	}
	obs := (&Controller{}).observe(snap, t0, false)
	if len(obs.Runtimes) != 2 || len(obs.Shards) != 1 {
		t.Fatalf("observed %d runtimes and %d shards, want 2 and 1", len(obs.Runtimes), len(obs.Shards))
	}
	a, b := obs.Runtimes[0], obs.Runtimes[1]
	if a.Node != "host-1" || a.Server != "n1" || a.NIC != mbit100 {
		t.Errorf("rt-a: node %q server %q NIC %v", a.Node, a.Server, a.NIC)
	}
	if b.Node != "" || b.Server != "" || b.NIC != 0 {
		t.Errorf("rt-b, whose report has no node: node %q server %q NIC %v", b.Node, b.Server, b.NIC)
	}
	if sh := obs.Shards[0]; sh.BytesIn != 1200 || sh.BytesOut != 300 {
		t.Errorf("shard bytes in %v out %v, want 1200 and 3 x 100", sh.BytesIn, sh.BytesOut)
	}
}
