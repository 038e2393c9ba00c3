package sdk_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// Pushes that are late are not fetched as well: a "runtime" that publishes each step's
// parameters well after WithFetchAfter, shard by shard, sees the worker fetch from the stream in
// its first step only (when it cannot know better); from then on every byte of parameters reaches
// the worker once, by push. The delays are the runtime's (this test emulates a slow aggregation);
// the fetch count, not the time, is what is checked.
func TestLatePushesAreNotFetched(t *testing.T) {
	t.Parallel()
	f := newFakeJob(t, spec("late", "sum", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, shards := f.rec.Spec.ID, f.rec.Layout.Shards
	if len(shards) < 3 {
		t.Fatalf("%d shards: the test needs pushes spread over several", len(shards))
	}
	var gets atomic.Int64 // direct gets of the parameters stream: the worker's fetches
	sub, err := f.nc.Subscribe(wire.DirectGetLast(wire.ParamsStream(id), ">"), func(*nats.Msg) { gets.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const after = 150 * time.Millisecond
	p, _, w := f.startAtStepZero(ctx, sdk.WithFetchAfter(after))
	if _, _, err := w.Params(ctx); err != nil {
		t.Fatal(err)
	}
	g := make([]float32, len(p))
	fetched := make([]int64, 0, 6)
	for t0 := int64(1); t0 <= 6; t0++ {
		before := gets.Load()
		want := next(p, t0)
		done := make(chan error, 1)
		var got []float32
		go func() {
			var err error
			got, err = w.Step(ctx, g)
			done <- err
		}()
		f.waitGrads(ctx, t0)
		time.Sleep(3 * after) // the aggregation is slow: the first push comes late
		for i, s := range shards {
			if i > 0 {
				time.Sleep(after / 5) // and the pushes trickle in, each well within WithFetchAfter
			}
			f.publishParams(i, t0, wire.F32, want[s.Off:s.Off+s.Len], nil)
		}
		if err := <-done; err != nil {
			t.Fatalf("step %d: %v", t0, err)
		}
		if !bytes.Equal(bits(got), bits(want)) {
			t.Fatalf("step %d: wrong parameters", t0)
		}
		fetched = append(fetched, gets.Load()-before)
		p = want
	}
	if fetched[0] == 0 {
		t.Errorf("fetches per step %v: none in the first step, whose pushes came %v after WithFetchAfter: the test shows nothing", fetched, 2*after)
	}
	for i, n := range fetched[1:] {
		if n != 0 {
			t.Errorf("step %d: %d fetches of parameters that were on their way (fetches per step %v)", i+2, n, fetched)
		}
	}
}

// A worker that looks for a step still being aggregated (the stream has the step before) fetches
// one shard, not every missing one, each time it looks: it stops at the first whose stream has an
// earlier step, for the others' pushes are most likely to come as well. The "runtime" publishes
// the step only once the worker has looked twice, so the test sees two looks whatever the load.
func TestFetchStopsAtAStepUnderWay(t *testing.T) {
	t.Parallel()
	s := spec("underway", "sum", 1)
	s.Tensors = []job.Tensor{{Name: "w", Shape: []int{8000}}}
	f := newFakeJob(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, shards := f.rec.Spec.ID, f.rec.Layout.Shards
	if len(shards) < 4 {
		t.Fatalf("%d shards: the test needs several", len(shards))
	}
	// The worker's direct gets, as this connection sees them: in order, each delivered before the
	// server answers it.
	sub, err := f.nc.SubscribeSync(wire.DirectGetLast(wire.ParamsStream(id), ">"))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	p, _, w := f.startAtStepZero(ctx, sdk.WithFetchAfter(20*time.Millisecond))
	if _, _, err := w.Params(ctx); err != nil {
		t.Fatal(err)
	}
	// The start's fetches of step 0 are all in this connection's queue once a ping comes back.
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	n, _, err := sub.Pending()
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if _, err := sub.NextMsg(time.Second); err != nil {
			t.Fatal(err)
		}
	}
	want := next(p, 1)
	done := make(chan error, 1)
	var got []float32
	go func() {
		var err error
		got, err = w.Step(ctx, make([]float32, len(p)))
		done <- err
	}()
	f.waitGrads(ctx, 1)
	var looked []string
	for range 2 {
		m, err := sub.NextMsg(20 * time.Second)
		if err != nil {
			t.Fatalf("the worker's look %d at the step under way: %v", len(looked)+1, err)
		}
		looked = append(looked, m.Subject)
	}
	f.publishAll(1, wire.F32, want)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bits(got), bits(want)) {
		t.Fatal("wrong parameters")
	}
	first := wire.DirectGetLast(wire.ParamsStream(id), wire.ParamsSubject(id, shards[0].ID))
	for i, subj := range looked {
		if subj != first {
			t.Errorf("fetch %d of the step under way: %s, want %s again (one shard per look): %v", i+1, subj, first, looked)
		}
	}
}
