package sdk

import (
	"testing"
	"time"

	"github.com/fanin-ml/fanin/job"
)

// A step that times out says which shards' parameters it was waiting for: the first ten, then how
// many more.
func TestLackingNamesTheMissingShards(t *testing.T) {
	t.Parallel()
	spec := job.Spec{ID: "lack", Tensors: []job.Tensor{{Name: "w", Shape: []int{16 << 10}}}, Ranks: 1,
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, ShardSize: 4 << 10}
	spec.Normalize()
	rec := job.NewRecord(spec, time.Now())
	n := len(rec.Layout.Shards)
	if n != 16 {
		t.Fatalf("the layout has %d shards, want 16", n)
	}
	w := &Worker{rec: &rec, got: make([]int64, n)}
	for i := range w.got {
		w.got[i] = 5
	}
	w.got[3], w.got[7] = 4, 0
	if got, want := w.lacking(5), "3, 7"; got != want {
		t.Fatalf("lacking(5) = %q, want %q", got, want)
	}
	if got, want := w.lacking(6), "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, and 6 more"; got != want {
		t.Fatalf("lacking(6) = %q, want %q", got, want)
	}
}
