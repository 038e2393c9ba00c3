package members_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
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

// testClock is a clock that moves only when the test moves it, read by the Assigners' goroutines.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Two replicas follow the beats; the leader writes. When the leadership moves, the new leader
// carries on from the stored assignment: same owners, same epoch; a worker that stops beating
// loses its ranks to the other after the lapse, and a deleted job's assignment is deleted. The
// replicas' clock is the test's: each time the test looks, half a beat interval has passed and
// the beating workers beat.
func TestLeaderHandoverKeepsTheAssignment(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, b := natsBuckets(t, ctx)
	var jobs atomic.Value
	jobs.Store(map[string]job.Record{"j": {Spec: job.Spec{ID: "j", Ranks: 4}}})
	list := func() map[string]job.Record { return jobs.Load().(map[string]job.Record) }
	clock := &testClock{now: time.Now()} // not before the stamps of the bucket's entries, which a new leader reads
	var leaderA, leaderB atomic.Bool
	leaderA.Store(true)
	a := members.New(nc, b.Assign, list, leaderA.Load, testutil.Logger()).WithClock(clock.Now)
	bb := members.New(nc, b.Assign, list, leaderB.Load, testutil.Logger()).WithClock(clock.Now)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	for _, x := range []*members.Assigner{a, bb} {
		go func() { _ = x.Run(rctx); done <- struct{}{} }()
	}
	defer func() { stop(); <-done; <-done }()
	// Both replicas follow the beats before the first one is sent, so that none is lost: each has
	// refused a malformed beat.
	testutil.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if err := nc.Publish(wire.WorkersSubject("j"), []byte("not a beat")); err != nil {
			return err
		}
		for i, x := range []*members.Assigner{a, bb} {
			if len(x.Refused("j")) == 0 {
				return fmt.Errorf("replica %d does not follow the beats yet", i)
			}
		}
		return nil
	})

	var w1Beats atomic.Bool
	w1Beats.Store(true)
	later := func() { // half a beat interval passes, and the workers that beat, beat
		t.Helper()
		clock.Add(wire.BeatInterval / 2)
		now := clock.Now()
		var beating []string
		for _, id := range []string{"w0", "w1"} {
			if id == "w1" && !w1Beats.Load() {
				continue
			}
			beating = append(beating, id)
			data, _ := json.Marshal(wire.WorkerBeat{ID: id})
			if err := nc.Publish(wire.WorkersSubject("j"), data); err != nil {
				t.Fatal(err)
			}
		}
		// Both replicas take the beats before the clock moves on.
		testutil.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
			for i, x := range []*members.Assigner{a, bb} {
				for _, id := range beating {
					if !slices.ContainsFunc(x.Live("j"), func(m members.Member) bool { return m.Beat.ID == id && !m.Last.Before(now) }) {
						return fmt.Errorf("replica %d has not taken %s's beat at %v", i, id, now)
					}
				}
			}
			return nil
		})
	}
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
			later()
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
		later()
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
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		later()
		if as, _ := read(); !as.Updated.After(first.Updated.Add(members.Refresh)) {
			return fmt.Errorf("not refreshed by the new leader yet")
		}
		return nil
	})
	expect(fmt.Sprint(owners), first.Epoch)

	w1Beats.Store(false)
	expect("map[w0:[0 1 2 3]]", first.Epoch+1)

	jobs.Store(map[string]job.Record{})
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
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
	t.Parallel()
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
