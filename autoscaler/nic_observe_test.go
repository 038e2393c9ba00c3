package autoscaler

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/internal/store"
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
	snap := twoRuntimes(s, 4, map[string]string{"j.0": "rt-a"},
		wire.LoadReport{Runtime: "rt-a", Cores: 4, Node: "host-1", Server: "n1", NICBytesPerSec: mbit100,
			Shards: []wire.ShardLoad{{Key: "j.0", Job: "j", BytesInPerSec: 1200, BytesOutPerSec: 100}}},
		wire.LoadReport{Runtime: "rt-b", Cores: 4})
	obs := (&Controller{}).observe(snap, t0, -1)
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

// A shard is planned at its work times its runtime's process overhead: what the process spends
// for it, not only its kernels. A report without an overhead (a runtime sharing its process, an
// older one) leaves the work as reported.
func TestObservePlansTheProcessOverhead(t *testing.T) {
	t.Parallel()
	s := job.Spec{ID: "j", Tensors: []job.Tensor{{Name: "w", Shape: []int{2048}}}, Ranks: 2,
		Function: job.Function{Name: "sum"}, ShardSize: 4096}
	snap := twoRuntimes(s, 2, map[string]string{"j.0": "rt-a", "j.1": "rt-b"},
		wire.LoadReport{Runtime: "rt-a", Cores: 2, Overhead: 1.7, Shards: []wire.ShardLoad{{Key: "j.0", Job: "j", Work: 0.01}}},
		wire.LoadReport{Runtime: "rt-b", Cores: 2, Shards: []wire.ShardLoad{{Key: "j.1", Job: "j", Work: 0.01}}})
	obs := (&Controller{}).observe(snap, t0, -1)
	if len(obs.Shards) != 2 {
		t.Fatalf("observed %d shards, want 2", len(obs.Shards))
	}
	work := map[string]float64{}
	for _, sh := range obs.Shards {
		work[sh.Key] = sh.Work
	}
	if math.Abs(work["j.0"]-0.017) > 1e-12 || work["j.1"] != 0.01 {
		t.Errorf("planned work %v, want j.0 0.017 (0.01 x 1.7) and j.1 0.01 (no overhead reported)", work)
	}
}

// twoRuntimes is a snapshot of job s (id "j") on runtimes rt-a and rt-b of cores each, its shards
// placed as placed says (key: runtime), with the runtimes' load reports.
func twoRuntimes(s job.Spec, cores int, placed map[string]string, a, b wire.LoadReport) view.Snapshot {
	snap := view.Snapshot{
		Jobs: map[string]job.Record{"j": job.NewRecord(s, t0)},
		Runtimes: map[string]view.Runtime{
			"rt-a": {RuntimeInfo: wire.RuntimeInfo{ID: "rt-a", Cores: cores}, Beat: t0, Registered: t0},
			"rt-b": {RuntimeInfo: wire.RuntimeInfo{ID: "rt-b", Cores: cores}, Beat: t0, Registered: t0},
		},
		Placement: map[string]view.Placed{},
		Loads:     map[string]view.Load{"rt-a": {LoadReport: a}, "rt-b": {LoadReport: b}},
	}
	for key, rt := range placed {
		snap.Placement[key] = view.Placed{Placement: wire.Placement{Runtime: rt}}
	}
	return snap
}

// A shard that just moved is in both runtimes' reports for up to a report's period: the decider
// plans it by the report of the runtime it is placed on, whichever way the reports are iterated.
func TestObserveTakesAMovedShardFromItsOwner(t *testing.T) {
	t.Parallel()
	s := job.Spec{ID: "j", Tensors: []job.Tensor{{Name: "w", Shape: []int{1024}}}, Ranks: 2,
		Function: job.Function{Name: "sum"}, ShardSize: 4096}
	for _, owner := range []string{"rt-a", "rt-b"} {
		work := map[string]float64{"rt-a": 0.01, "rt-b": 0.03}
		// The old owner's report is of a later step: the placement, not the step, decides.
		step := map[string]int64{"rt-a": 9, "rt-b": 9}
		for id := range step {
			if id != owner {
				step[id] = 10
			}
		}
		snap := twoRuntimes(s, 2, map[string]string{"j.0": owner},
			wire.LoadReport{Runtime: "rt-a", Cores: 2, Shards: []wire.ShardLoad{{Key: "j.0", Job: "j", Step: step["rt-a"], Work: work["rt-a"]}}},
			wire.LoadReport{Runtime: "rt-b", Cores: 2, Shards: []wire.ShardLoad{{Key: "j.0", Job: "j", Step: step["rt-b"], Work: work["rt-b"]}}})
		for range 20 { // map order varies from run to run
			obs := (&Controller{}).observe(snap, t0, -1)
			if len(obs.Shards) != 1 || obs.Shards[0].Work != work[owner] {
				t.Fatalf("placed on %s: observed %+v, want its work %v", owner, obs.Shards, work[owner])
			}
		}
	}
}

// A view that has heard no runtime for a while (its watch held up behind data) does not take them
// all for dead: their ages count from the newest heartbeat of any, less a period, up to
// maxViewLag. One runtime silent while another beats is dead after its lapse as before.
func TestObserveDiscountsTheViewsLag(t *testing.T) {
	t.Parallel()
	s := job.Spec{ID: "j", Tensors: []job.Tensor{{Name: "w", Shape: []int{1024}}}, Ranks: 2,
		Function: job.Function{Name: "sum"}, ShardSize: 4096}
	live := func(beatA, beatB, now time.Time) []string {
		snap := twoRuntimes(s, 1, nil, wire.LoadReport{Runtime: "rt-a", Cores: 1}, wire.LoadReport{Runtime: "rt-b", Cores: 1})
		a, b := snap.Runtimes["rt-a"], snap.Runtimes["rt-b"]
		a.Beat, b.Beat = beatA, beatB
		snap.Runtimes["rt-a"], snap.Runtimes["rt-b"] = a, b
		var ids []string
		for _, r := range (&Controller{}).observe(snap, now, time.Hour).Runtimes {
			ids = append(ids, r.ID)
		}
		return ids
	}
	sec := time.Second
	for _, c := range []struct {
		name         string
		beatA, beatB time.Time
		now          time.Time
		want         string
	}{
		{"both heard 7 s ago: the view lags", t0, t0, t0.Add(7 * sec), "[rt-a rt-b]"},
		{"rt-b silent 6 s, rt-a heard now", t0.Add(6 * sec), t0, t0.Add(6 * sec), "[rt-a]"},
		{"both silent past the lapse and the most lag", t0, t0, t0.Add(store.RuntimeLapse + maxViewLag + store.RuntimeHeartbeat), "[]"},
	} {
		if got := fmt.Sprint(live(c.beatA, c.beatB, c.now)); got != c.want {
			t.Errorf("%s: live %s, want %s", c.name, got, c.want)
		}
	}
}

// A runtime taken for dead stays dead until it is heard again: not when the view's lag changes
// because the runtime heard last leaves (deregistered, reported dead by the driver), nor when the
// registry's health does.
func TestObserveLapsedStaysDead(t *testing.T) {
	t.Parallel()
	s := job.Spec{ID: "j", Tensors: []job.Tensor{{Name: "w", Shape: []int{1024}}}, Ranks: 2,
		Function: job.Function{Name: "sum"}, ShardSize: 4096}
	c := &Controller{}
	live := func(now time.Time, writable time.Duration, beats map[string]time.Time) string {
		snap := twoRuntimes(s, 1, nil, wire.LoadReport{Runtime: "rt-a", Cores: 1}, wire.LoadReport{Runtime: "rt-b", Cores: 1})
		for id, rt := range snap.Runtimes {
			b, ok := beats[id]
			if !ok {
				delete(snap.Runtimes, id)
				delete(snap.Loads, id)
				continue
			}
			rt.Beat = b
			snap.Runtimes[id] = rt
		}
		var ids []string
		for _, r := range c.observe(snap, now, writable).Runtimes {
			ids = append(ids, r.ID)
		}
		return fmt.Sprint(ids)
	}
	sec := time.Second
	if got := live(t0.Add(6*sec), time.Hour, map[string]time.Time{"rt-a": t0.Add(6 * sec), "rt-b": t0}); got != "[rt-a]" {
		t.Fatalf("rt-b silent 6 s beside rt-a: live %s, want [rt-a]", got)
	}
	if got := live(t0.Add(6500*time.Millisecond), time.Hour, map[string]time.Time{"rt-b": t0}); got != "[]" {
		t.Fatalf("rt-a gone, rt-b still silent: live %s, want []", got)
	}
	if got := live(t0.Add(6600*time.Millisecond), -1, map[string]time.Time{"rt-b": t0}); got != "[]" {
		t.Fatalf("the registry unhealthy, rt-b still silent: live %s, want []", got)
	}
	if got := live(t0.Add(7200*time.Millisecond), time.Hour, map[string]time.Time{"rt-b": t0.Add(7 * sec)}); got != "[rt-b]" {
		t.Fatalf("rt-b heard again: live %s, want [rt-b]", got)
	}
}
