package members_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/members"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// natsBuckets starts a NATS server and opens fanin's buckets on a connection closed with the test.
func natsBuckets(t *testing.T, ctx context.Context) (*nats.Conn, *store.Buckets) {
	t.Helper()
	nc, err := nats.Connect(testutil.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	b, err := store.OpenBuckets(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	return nc, b
}

// Two replicas follow the beats; the leader writes. When the leadership moves, the new leader
// carries on from the stored assignment: same owners, same epoch; a worker that stops beating
// loses its ranks to the other after the lapse, and a deleted job's assignment is deleted.
func TestLeaderHandoverKeepsTheAssignment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, b := natsBuckets(t, ctx)
	var jobs atomic.Value
	jobs.Store(map[string]job.Record{"j": {Spec: job.Spec{ID: "j", Ranks: 4}}})
	list := func() map[string]job.Record { return jobs.Load().(map[string]job.Record) }
	var leaderA, leaderB atomic.Bool
	leaderA.Store(true)
	a := members.New(nc, b.Assign, list, leaderA.Load, testutil.Logger())
	bb := members.New(nc, b.Assign, list, leaderB.Load, testutil.Logger())
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	for _, x := range []*members.Assigner{a, bb} {
		go func() { _ = x.Run(rctx); done <- struct{}{} }()
	}
	defer func() { stop(); <-done; <-done }()

	var w1Beats atomic.Bool
	w1Beats.Store(true)
	go func() {
		for rctx.Err() == nil {
			for _, id := range []string{"w0", "w1"} {
				if id == "w1" && !w1Beats.Load() {
					continue
				}
				data, _ := json.Marshal(wire.WorkerBeat{ID: id})
				_ = nc.Publish(wire.WorkersSubject("j"), data)
				time.Sleep(10 * time.Millisecond) // w0 joins first
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	read := func() (wire.Assignment, uint64) {
		e, err := b.Assign.Get(ctx, "j")
		if err != nil {
			return wire.Assignment{}, 0
		}
		var as wire.Assignment
		_ = json.Unmarshal(e.Value(), &as)
		return as, e.Revision()
	}
	expect := func(want string, epoch uint64) wire.Assignment {
		t.Helper()
		var as wire.Assignment
		testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			as, _ = read()
			got := map[string][]int{}
			for _, w := range as.Workers {
				got[w.ID] = w.Ranks
			}
			if fmt.Sprint(got) != want || as.Epoch != epoch {
				return fmt.Errorf("assignment %v epoch %d, want %s epoch %d", got, as.Epoch, want, epoch)
			}
			return nil
		})
		return as
	}
	// Who joined first depends on which beat the replicas heard first (they may subscribe after w0's
	// first beat): wait for two workers of two ranks each, whichever holds which.
	var first wire.Assignment
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		first, _ = read()
		if len(first.Workers) != 2 || len(first.Workers[0].Ranks) != 2 || len(first.Workers[1].Ranks) != 2 {
			return fmt.Errorf("assignment %+v", first.Workers)
		}
		return nil
	})
	owners := map[string][]int{}
	for _, w := range first.Workers {
		owners[w.ID] = w.Ranks
	}

	leaderA.Store(false)
	leaderB.Store(true)
	// The new leader refreshes the stored value (Refresh) without changing owners or epoch.
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if as, _ := read(); !as.Updated.After(first.Updated.Add(members.Refresh)) {
			return fmt.Errorf("not refreshed by the new leader yet")
		}
		return nil
	})
	expect(fmt.Sprint(owners), first.Epoch)

	w1Beats.Store(false)
	expect("map[w0:[0 1 2 3]]", first.Epoch+1)

	jobs.Store(map[string]job.Record{})
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if _, rev := read(); rev != 0 {
			return fmt.Errorf("the deleted job's assignment is still there")
		}
		return nil
	})
}

// A replica that has just become the leader keeps the stored assignment's workers it has not heard
// from yet (they may be alive), but not one that said goodbye: its ranks move at once. The clock is
// frozen at the start, so the grace never ends and nothing lapses.
func TestNewLeaderLetsALeaverGo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, b := natsBuckets(t, ctx)
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	stored := wire.Assignment{Job: "j", Epoch: 3, Workers: []wire.AssignedWorker{
		{ID: "w0", Ranks: []int{0, 1}, Joined: now.Add(-time.Minute), LastBeat: now},
		{ID: "w1", Ranks: []int{2, 3}, Joined: now.Add(-time.Minute), LastBeat: now},
		{ID: "w2", Ranks: []int{}, Joined: now.Add(-time.Minute), LastBeat: now, Standby: true},
	}}
	data, _ := json.Marshal(stored)
	if _, err := b.Assign.Put(ctx, "j", data); err != nil {
		t.Fatal(err)
	}
	jobs := func() map[string]job.Record {
		return map[string]job.Record{"j": {Spec: job.Spec{ID: "j", Ranks: 4}, Workers: 2}}
	}
	a := members.New(nc, b.Assign, jobs, func() bool { return true }, testutil.Logger()).WithClock(func() time.Time { return now })
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = a.Run(rctx); close(done) }()
	defer func() { stop(); <-done }()
	beat := func(b wire.WorkerBeat) {
		data, _ := json.Marshal(b)
		a.Observe(wire.WorkersSubject("j"), data)
	}
	beat(wire.WorkerBeat{ID: "w0"})
	beat(wire.WorkerBeat{ID: "w1", Leaving: true})
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		e, err := b.Assign.Get(ctx, "j")
		if err != nil {
			return err
		}
		var as wire.Assignment
		_ = json.Unmarshal(e.Value(), &as)
		got := map[string][]int{}
		for _, w := range as.Workers {
			got[w.ID] = w.Ranks
		}
		// w2, unheard, is kept and now holds ranks (target 2); w1, gone, is not.
		if fmt.Sprint(got) != "map[w0:[0 1] w2:[2 3]]" || as.Epoch != 4 {
			return fmt.Errorf("assignment %v epoch %d", got, as.Epoch)
		}
		return nil
	})
}
