package bench

import (
	"math"
	"strings"
	"testing"
)

// TestClusterTheory: the bytes the cluster scenario compares with are BytePS's analysis, and its
// claims hold: a parameter service spread over the worker nodes moves a ring all-reduce's bytes in
// float32 and half of them in bfloat16; on a node of its own, S per worker each way and n S on the
// service's link.
func TestClusterTheory(t *testing.T) {
	t.Parallel()
	w := workload{Ranks: 4, Elements: 1000}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*b }
	ring := ringTheory(w)
	if want := 2 * 3.0 / 4 * 4000; !near(ring, want) {
		t.Fatalf("ring: %v bytes each way, want 2(n-1)/n S = %v", ring, want)
	}
	spread := clusterTheory(clusterCase{layout: spreadOverWorkers}, w)
	if !near(spread.workerIn, ring) || !near(spread.workerOut, ring) {
		t.Errorf("spread, f32: %+v, want a ring's %v each way", spread, ring)
	}
	half := clusterTheory(clusterCase{layout: spreadOverWorkers, bf16: true}, w)
	if !near(half.workerIn, ring/2) || !near(half.workerOut, ring/2) {
		t.Errorf("spread, bf16: %+v, want half a ring's %v each way", half, ring)
	}
	svc := clusterTheory(clusterCase{layout: onServiceNode, link: 4}, w)
	if !near(svc.workerIn, 4000) || !near(svc.workerOut, 4000) || !strings.Contains(svc.serviceNote, "service node 0.0/0.0 MB") {
		t.Errorf("service node, f32: %+v, want S = 4000 bytes each way per worker", svc)
	}
	w.Elements = 1_000_000
	if svc := clusterTheory(clusterCase{layout: onServiceNode}, w); !strings.Contains(svc.serviceNote, "service node 16.0/16.0 MB") {
		t.Errorf("service node of 4 workers of 4 MB: %q, want n S = 16 MB each way", svc.serviceNote)
	}
}

// TestClusterCases: every case names a layout the scenario knows, a service node's link is a
// positive multiple, and names are unique (they are the report's rows).
func TestClusterCases(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, c := range clusterCases {
		if seen[c.name] {
			t.Errorf("case %q twice", c.name)
		}
		seen[c.name] = true
		switch c.layout {
		case onServiceNode:
			if c.link < 1 {
				t.Errorf("case %q: the service node's link is %dx a worker's", c.name, c.link)
			}
		case spreadOverWorkers:
		default:
			t.Errorf("case %q: layout %d", c.name, c.layout)
		}
	}
}
