package sdk

import (
	"fmt"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/internal/natstest"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// BenchmarkDirectKeep measures the one copy a worker of a direct-gradients job makes on its hot
// path: each step's float32 gradient into the buffer that keeps it until the next step's
// parameters arrive (a 16-bit gradient is encoded into it instead, the copy the stored path makes
// too), with the headers of every shard's request.
func BenchmarkDirectKeep(b *testing.B) {
	for _, dt := range []wire.Dtype{wire.F32, wire.BF16} {
		b.Run(fmt.Sprintf("Dtype=%s,Elements=4M,Shard=4MiB", dt), func(b *testing.B) {
			spec := job.Spec{ID: "keep", Tensors: []job.Tensor{{Name: "w", Shape: []int{4 << 20}}}, Ranks: 1,
				Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, ShardSize: 4 << 20, Gradients: job.GradientsDirect}
			spec.Normalize()
			rec := job.NewRecord(spec, time.Now())
			w := &Worker{rec: &rec, ranks: []int{0}, dtype: dt}
			d := &directSender{w: w, resend: map[int]int64{}}
			g := [][]float32{make([]float32, 4<<20)}
			for i := range g[0] {
				g[0][i] = float32(i)
			}
			b.SetBytes(4 << 22)
			b.ReportAllocs()
			t := int64(1)
			for b.Loop() {
				d.keep(t, g)
				t++
			}
		})
	}
}

// TestDirectKeepHoldsTwoSteps: step t's gradients stay kept while step t+1's are sent, and a
// request's bytes are the gradient of its rank and shard in the wire's dtype, whatever the caller
// writes into its own buffer after Step.
func TestDirectKeepHoldsTwoSteps(t *testing.T) {
	t.Parallel()
	spec := job.Spec{ID: "keep", Tensors: []job.Tensor{{Name: "w", Shape: []int{3000}}}, Ranks: 2,
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, ShardSize: 4 << 10, Gradients: job.GradientsDirect}
	spec.Normalize()
	rec := job.NewRecord(spec, time.Now())
	w := &Worker{rec: &rec, ranks: []int{1, 0}, dtype: wire.F32}
	d := &directSender{w: w, resend: map[int]int64{}}
	grads := func(step int64) [][]float32 {
		g := [][]float32{make([]float32, 3000), make([]float32, 3000)}
		for j := range g {
			for i := range g[j] {
				g[j][i] = float32(step)*1000 + float32(j)*100 + float32(i)
			}
		}
		return g
	}
	check := func(step int64) {
		t.Helper()
		k := d.kept[step%2]
		if k.step != step {
			t.Fatalf("slot of step %d holds step %d", step, k.step)
		}
		want := grads(step)
		n := rec.Layout.NumShards()
		for j := range w.ranks {
			for i, s := range rec.Layout.Shards {
				r := k.reqs[j*n+i]
				got := make([]float32, s.Len)
				wire.Decode(got, r.msg.Data, wire.F32)
				for e := range got {
					if got[e] != want[j][s.Off+e] {
						t.Fatalf("step %d rank %d shard %d element %d: %v, want %v", step, w.ranks[j], s.ID, e, got[e], want[j][s.Off+e])
					}
				}
				if st, _ := wire.ParseStep(r.msg.Header); st != step || r.msg.Header.Get(wire.HdrRank) != fmt.Sprint(w.ranks[j]) || r.state != reqDue {
					t.Fatalf("step %d rank %d shard %d: headers %v, state %v", step, w.ranks[j], s.ID, r.msg.Header, r.state)
				}
			}
		}
	}
	g1 := grads(1)
	d.keep(1, g1)
	clear(g1[0]) // the caller reuses its buffer
	d.keep(2, grads(2))
	check(1)
	check(2)
	d.keep(3, grads(3)) // step 1's slot
	check(2)
	check(3)
}

// Receipts slower than receiptTimeout (a runtime across a full link, behind megabytes of other
// gradients) make a worker send its gradients again once, not every step: the timer backs off
// after the first timeout and then follows the receipts' round trips (internal/rto). With the
// fixed timeout every request of every step was sent twice, the copy behind the first on the
// same link.
func TestDirectReceiptTimerFollowsRoundTrips(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t)
	spec := job.Spec{ID: "late", Tensors: []job.Tensor{{Name: "w", Shape: []int{3000}}}, Ranks: 1,
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, ShardSize: 4 << 10, Gradients: job.GradientsDirect}
	spec.Normalize()
	rec := job.NewRecord(spec, time.Now())
	n := rec.Layout.NumShards()
	copies := natstest.SlowReplies(t, nc, wire.GradWildcard(spec.ID), receiptTimeout+time.Second, nil)
	w := &Worker{c: &Client{nc: nc}, rec: &rec, ranks: []int{0}, dtype: wire.F32, got: make([]int64, n)}
	d, err := newDirectSender(w)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	var perStep []int32
	for step := int64(1); step <= 3; step++ {
		before := copies.Load()
		d.keep(step, [][]float32{make([]float32, 3000)})
		deadline := time.Now().Add(time.Minute)
		for !d.receipted(step) {
			if time.Now().After(deadline) {
				t.Fatalf("step %d: no receipt for every shard in a minute", step)
			}
			if err := d.sendDue(step, time.Now()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(directPoll)
		}
		perStep = append(perStep, copies.Load()-before)
	}
	// Step 1 meets the floor: each request is sent twice. Later steps wait as long as receipts
	// take: each is sent once.
	if perStep[1] != int32(n) || perStep[2] != int32(n) {
		t.Fatalf("requests sent per step %v for %d shards: want %d in steps 2 and 3", perStep, n, n)
	}
}

// receipted reports whether every request of step t has its receipt.
func (d *directSender) receipted(t int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.kept[t%2]
	for _, r := range k.reqs {
		if k.step != t || r.state != reqReceipted {
			return false
		}
	}
	return true
}
