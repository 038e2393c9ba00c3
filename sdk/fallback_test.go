package sdk_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
