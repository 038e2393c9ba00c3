package view_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/internal/view"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// env is an embedded NATS server with fanin's buckets.
type env struct {
	t  *testing.T
	nc *nats.Conn
	js jetstream.JetStream
	b  *store.Buckets
}

func newEnv(t *testing.T) *env {
	t.Helper()
	nc, js := testutil.Connect(t, testutil.NATS(t))
	b, err := store.OpenBuckets(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, nc: nc, js: js, b: b}
}

// open opens a view, closed when the test ends.
func (e *env) open(opts ...view.Option) *view.View {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := view.Open(ctx, e.nc, append([]view.Option{view.WithLogger(testutil.Logger())}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(v.Close)
	return v
}

func (e *env) put(kv jetstream.KeyValue, key string, val any) uint64 {
	e.t.Helper()
	data, _ := json.Marshal(val)
	rev, err := kv.Put(context.Background(), key, data)
	if err != nil {
		e.t.Fatal(err)
	}
	return rev
}

// record is a job of two shards.
func record(id string) job.Record {
	spec := job.Spec{ID: id, Tensors: []job.Tensor{{Name: "w", Shape: []int{2048}}}, Ranks: 2,
		Function: job.Function{Name: "sgd"}, ShardSize: 4096}
	spec.Normalize()
	return job.NewRecord(spec, time.Now())
}

// report publishes a load report and waits until the view has it.
func (e *env) report(v *view.View, rep wire.LoadReport) {
	e.t.Helper()
	rep.At = time.Unix(0, time.Now().UnixNano()).UTC() // tells this report from the last
	data, _ := json.Marshal(rep)
	if err := e.nc.Publish(wire.LoadSubject(rep.Runtime), data); err != nil {
		e.t.Fatal(err)
	}
	testutil.CheckFor(e.t, 5*time.Second, 5*time.Millisecond, func() error {
		if l, ok := v.Load(rep.Runtime); !ok || !l.At.Equal(rep.At) {
			return fmt.Errorf("report of %s not received", rep.Runtime)
		}
		return nil
	})
}

// clock is a fake clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func (c *clock) add(d time.Duration) { c.set(c.now().Add(d)) }

// Open returns with the current values of every bucket in: jobs (a paused one too, marked),
// placement with its revisions, and registrations with the entry's time as heartbeat.
func TestOpenHasTheWholeState(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	running, paused := record("a"), record("b")
	paused.Paused = true
	e.put(e.b.Jobs, "a", running)
	e.put(e.b.Jobs, "b", paused)
	rev := e.put(e.b.Placement, "a.0", wire.Placement{Runtime: "rt-1", Epoch: 1})
	before := time.Now()
	e.put(e.b.Runtimes, "rt-1", wire.RuntimeInfo{ID: "rt-1", Cores: 3, Beat: time.Unix(1, 0)})

	s := e.open().Snapshot()
	if len(s.Jobs) != 2 || s.Jobs["a"].Paused || !s.Jobs["b"].Paused || s.Jobs["a"].Layout.NumShards() != 2 {
		t.Fatalf("jobs %+v", s.Jobs)
	}
	if p := s.Placement["a.0"]; len(s.Placement) != 1 || p.Runtime != "rt-1" || p.Epoch != 1 || p.Revision != rev {
		t.Fatalf("placement %+v, want a.0 on rt-1 at revision %d", s.Placement, rev)
	}
	r, ok := s.Runtimes["rt-1"]
	if !ok || r.Cores != 3 || r.Beat.Before(before.Add(-time.Second)) || !r.Alive(time.Now()) {
		t.Fatalf("runtime %+v: its heartbeat is the entry's time, not the one it wrote", r)
	}
}

// After the placement bucket's stream is deleted and created again, the view re-syncs: keys that
// vanished are deleted, the new values are in.
func TestHealsAfterStreamRecreated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	v := e.open()
	e.put(e.b.Placement, "x.0", wire.Placement{Runtime: "rt-1", Epoch: 1})
	e.put(e.b.Placement, "x.1", wire.Placement{Runtime: "rt-1", Epoch: 1})
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := len(v.Placement()); n != 2 {
			return fmt.Errorf("%d entries", n)
		}
		return nil
	})

	ctx := context.Background()
	if err := e.js.DeleteKeyValue(ctx, wire.PlacementBucket); err != nil {
		t.Fatal(err)
	}
	b, err := store.OpenBuckets(ctx, e.js)
	if err != nil {
		t.Fatal(err)
	}
	e.put(b.Placement, "x.1", wire.Placement{Runtime: "rt-2", Epoch: 2})
	e.put(b.Placement, "x.2", wire.Placement{Runtime: "rt-2", Epoch: 1})
	testutil.CheckFor(t, 15*time.Second, 50*time.Millisecond, func() error {
		got := map[string]string{}
		for k, p := range v.Placement() {
			got[k] = p.Runtime
		}
		if fmt.Sprint(got) != fmt.Sprint(map[string]string{"x.1": "rt-2", "x.2": "rt-2"}) {
			return fmt.Errorf("placement %v after the stream was recreated", got)
		}
		return nil
	})
	if p := v.JobPlacement("x"); len(p) != 2 || len(v.JobPlacement("x.1")) != 0 {
		t.Fatalf("the job's placement %+v", p)
	}
}

// A runtime's liveness and its reports' freshness follow the view's clock: alive for
// store.RuntimeLapse after its last heartbeat, expired from the bucket after store.RuntimeTTL;
// a deleted registration takes its load report with it.
func TestLivenessLapses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := &clock{t: time.Now()}
	v := e.open(view.WithClock(c.now))
	e.put(e.b.Jobs, "j", record("j"))
	e.put(e.b.Runtimes, "rt-1", wire.RuntimeInfo{ID: "rt-1", Cores: 1})
	var r view.Runtime
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		var ok bool
		if r, ok = v.Runtime("rt-1"); !ok {
			return fmt.Errorf("rt-1 not registered")
		}
		if _, ok := v.Job("j"); !ok { // each bucket has a watch of its own: they arrive in any order
			return fmt.Errorf("no job")
		}
		return nil
	})
	c.set(r.Beat) // the report is received at the heartbeat's time
	e.report(v, wire.LoadReport{Runtime: "rt-1", Cores: 1, Shards: []wire.ShardLoad{
		{Key: "j.0", Job: "j", Step: 4, Period: 100 * time.Millisecond, Pending: 2},
		{Key: "j.1", Job: "j", Step: 4, Period: 100 * time.Millisecond, Pending: 2}}})

	for _, tc := range []struct {
		at                    time.Time
		alive, expired, fresh bool
	}{
		{r.Beat.Add(time.Second), true, false, true},
		{r.Beat.Add(store.RuntimeLapse - time.Millisecond), true, false, true},
		{r.Beat.Add(store.RuntimeLapse), false, false, false},
		{r.Beat.Add(store.RuntimeTTL), false, true, false},
	} {
		c.set(tc.at)
		got, _ := v.Runtime("rt-1")
		if now := v.Now(); got.Alive(now) != tc.alive || got.Expired(now) != tc.expired {
			t.Errorf("%v after the heartbeat: alive %v expired %v, want %v %v", now.Sub(r.Beat), got.Alive(now), got.Expired(now), tc.alive, tc.expired)
		}
		// The report was received at the heartbeat's time: fresh as long.
		sh, ok := v.Shard("j.0")
		if !ok || sh.Fresh != tc.fresh || (sh.Rate > 0) != tc.fresh || (v.JobRate("j") > 0) != tc.fresh {
			t.Errorf("%v after the report: shard %+v, job rate %v, want fresh %v", tc.at.Sub(r.Beat), sh, v.JobRate("j"), tc.fresh)
		}
	}

	if err := e.b.Runtimes.Delete(context.Background(), "rt-1"); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		_, registered := v.Runtime("rt-1")
		_, reported := v.Load("rt-1")
		if registered || reported {
			return fmt.Errorf("rt-1 deregistered, still in the view: registered %v, load %v", registered, reported)
		}
		return nil
	})
}

// A runtime that asks for a longer lapse (its heartbeats were slow) is alive that long; one that
// asks for more than store.MaxRuntimeLapse, or less than store.RuntimeLapse, gets the bound.
func TestLivenessLapseAskedFor(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := &clock{t: time.Now()}
	v := e.open(view.WithClock(c.now))
	asks := map[string]time.Duration{"slow": 8 * time.Second, "greedy": time.Hour, "modest": time.Second}
	for id, l := range asks {
		e.put(e.b.Runtimes, id, wire.RuntimeInfo{ID: id, Cores: 1, Lapse: l})
	}
	got := map[string]view.Runtime{}
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		for id := range asks {
			r, ok := v.Runtime(id)
			if !ok {
				return fmt.Errorf("%s not registered", id)
			}
			got[id] = r
		}
		return nil
	})
	for _, tc := range []struct {
		id    string
		after time.Duration
		alive bool
	}{
		{"slow", 8*time.Second - time.Millisecond, true},
		{"slow", 8 * time.Second, false},
		{"greedy", store.MaxRuntimeLapse - time.Millisecond, true},
		{"greedy", store.MaxRuntimeLapse, false},
		{"modest", store.RuntimeLapse - time.Millisecond, true},
		{"modest", store.RuntimeLapse, false},
	} {
		r := got[tc.id]
		if a := r.Alive(r.Beat.Add(tc.after)); a != tc.alive {
			t.Errorf("%s, asking for %v: alive %v after %v, want %v", tc.id, asks[tc.id], a, tc.after, tc.alive)
		}
	}
}

// A registration without a heartbeat for view.ForgetRuntime leaves the view with its load report
// (the bucket's TTL expiry is not delivered to watchers) when the next registration or report
// arrives; a heartbeat brings a runtime back. (The server stamps the entries' times, so both
// registrations here are as old by the view's fake clock.)
func TestForgetsLongExpiredRuntimes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := &clock{t: time.Now()}
	v := e.open(view.WithClock(c.now))
	registered := func(id string) bool { _, ok := v.Runtime(id); return ok }
	reported := func(id string) bool { _, ok := v.Load(id); return ok }
	for _, id := range []string{"rt-dead", "rt-live"} {
		e.put(e.b.Runtimes, id, wire.RuntimeInfo{ID: id, Cores: 1})
		testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			if !registered(id) {
				return fmt.Errorf("%s not registered", id)
			}
			return nil
		})
	}
	dead, _ := v.Runtime("rt-dead")
	c.set(dead.Beat)
	e.report(v, wire.LoadReport{Runtime: "rt-dead", Cores: 1})

	// Within ForgetRuntime of the heartbeats: kept, however many arrivals prune.
	c.set(dead.Beat.Add(view.ForgetRuntime))
	e.report(v, wire.LoadReport{Runtime: "rt-live", Cores: 1})
	if !registered("rt-dead") || !reported("rt-dead") {
		t.Fatal("rt-dead forgotten before view.ForgetRuntime")
	}

	// Past it: the next arrival prunes both registrations and their reports.
	c.add(2 * time.Second)
	if err := e.nc.Publish(wire.LoadSubject("rt-live"), []byte(`{"runtime":"rt-live"}`)); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if registered("rt-dead") || reported("rt-dead") || registered("rt-live") {
			return fmt.Errorf("%v without a heartbeat: rt-dead registered %v, load %v; rt-live registered %v; want none",
				view.ForgetRuntime+2*time.Second, registered("rt-dead"), reported("rt-dead"), registered("rt-live"))
		}
		return nil
	})

	// A heartbeat of rt-live brings it back (the fake clock stands still: no prune runs within a
	// second of the last); rt-dead stays gone.
	e.put(e.b.Runtimes, "rt-live", wire.RuntimeInfo{ID: "rt-live", Cores: 1})
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if !registered("rt-live") {
			return fmt.Errorf("rt-live's heartbeat did not bring it back")
		}
		return nil
	})
	if registered("rt-dead") {
		t.Error("rt-dead came back without a heartbeat")
	}
}

// A job's steps/s is its slowest shard's, each from the steps of the reports as received; a
// shard not measured yet counts one step per period while it has gradients pending.
func TestJobRateIsTheSlowestShards(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := &clock{t: time.Now()}
	v := e.open(view.WithClock(c.now))
	e.put(e.b.Jobs, "j", record("j"))
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if _, ok := v.Job("j"); !ok {
			return fmt.Errorf("no job")
		}
		return nil
	})
	shards := func(s0, s1 int64, pending uint64) []wire.ShardLoad {
		return []wire.ShardLoad{{Key: "j.0", Job: "j", Step: s0, Period: 250 * time.Millisecond, Pending: pending},
			{Key: "j.1", Job: "j", Step: s1, Period: 250 * time.Millisecond, Pending: pending}}
	}
	e.report(v, wire.LoadReport{Runtime: "rt-1", Shards: shards(0, 0, 3)})
	if r := v.JobRate("j"); r != 4 {
		t.Fatalf("one report, 3 pending, period 250ms: %v steps/s, want 4 (one per period)", r)
	}
	for i := int64(1); i <= 5; i++ {
		c.add(time.Second)
		e.report(v, wire.LoadReport{Runtime: "rt-1", Shards: shards(10*i, 5*i, 0)})
	}
	if r, sh := v.JobRate("j"), mustShard(t, v, "j.0"); math.Abs(r-5) > 1e-9 || math.Abs(sh.Rate-10) > 1e-9 {
		t.Fatalf("shards at 10 and 5 steps/s: job %v, shard 0 %v", r, sh.Rate)
	}
	if r := v.JobRate("other"); r != 0 {
		t.Fatalf("a job the view does not know: %v steps/s", r)
	}
}

func mustShard(t *testing.T, v *view.View, key string) view.Shard {
	t.Helper()
	s, ok := v.Shard(key)
	if !ok {
		t.Fatalf("no report names %s", key)
	}
	return s
}

// A placement write remembered before the watch delivers it is kept: older revisions of the key,
// puts or deletes, delivered after it do not replace it; a newer one does.
func TestRememberKeepsTheNewestRevision(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	v := e.open()
	ctx := context.Background()
	kv := e.b.Placement
	data := func(rt string, epoch uint64) []byte {
		b, _ := json.Marshal(wire.Placement{Runtime: rt, Epoch: epoch})
		return b
	}
	rev1, err := kv.Create(ctx, "k.0", data("rt-1", 1))
	if err != nil {
		t.Fatal(err)
	}
	rev2, err := kv.Update(ctx, "k.0", data("rt-2", 2), rev1)
	if err != nil {
		t.Fatal(err)
	}
	v.Remember("k.0", wire.Placement{Runtime: "rt-2", Epoch: 2}, rev2) // at once, as the autoscaler does
	if p := v.Placement()["k.0"]; p.Runtime != "rt-2" || p.Revision != rev2 {
		t.Fatalf("remembered write not in the view: %+v", p)
	}
	v.Remember("k.0", wire.Placement{Runtime: "rt-1", Epoch: 1}, rev1)
	// A write the watch has not delivered yet, two revisions ahead: the delete below takes the
	// next revision, the first marker the one after.
	ahead := rev2 + 2
	v.Remember("k.0", wire.Placement{Runtime: "rt-3", Epoch: 3}, ahead)
	if err := kv.Delete(ctx, "k.0"); err != nil {
		t.Fatal(err)
	}
	awaitMarker := func(key string) {
		t.Helper()
		if _, err := kv.Put(ctx, key, data("rt-m", 1)); err != nil {
			t.Fatal(err)
		}
		testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			if _, ok := v.Placement()[key]; !ok {
				return fmt.Errorf("marker %s not delivered", key)
			}
			return nil
		})
	}
	awaitMarker("m.0") // the watch has delivered everything before it
	if p := v.Placement()["k.0"]; p.Runtime != "rt-3" || p.Revision != ahead {
		t.Fatalf("older revisions delivered after the remembered one replaced it: %+v", p)
	}
	rev, err := kv.Put(ctx, "k.0", data("rt-4", 4))
	if err != nil || rev <= ahead {
		t.Fatalf("put at revision %d (remembered %d): %v", rev, ahead, err)
	}
	awaitMarker("m.1")
	if p := v.Placement()["k.0"]; p.Runtime != "rt-4" || p.Revision != rev {
		t.Fatalf("a newer revision did not replace the remembered one: %+v", p)
	}
}

// Close stops every goroutine the view started (its watches and its load reader) before it
// returns, and the view keeps answering with its last state. Not parallel: it counts the
// process's goroutines, which a view of a test beside it would add to.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	e := newEnv(t)
	e.put(e.b.Jobs, "j", record("j"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := view.Open(ctx, e.nc, view.WithLogger(testutil.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	if n := ours(); n == 0 {
		t.Fatal("no goroutine of the view's found while it runs: the check below would prove nothing")
	}
	v.Close()
	v.Close() // a second Close is harmless
	testutil.CheckFor(t, time.Second, 10*time.Millisecond, func() error {
		if n := ours(); n > 0 {
			return fmt.Errorf("%d goroutines of the view's left after Close", n)
		}
		return nil
	})
	if _, ok := v.Job("j"); !ok {
		t.Fatal("the closed view forgot its state")
	}
}

// ours counts the goroutines running the view's or the store's code.
func ours() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "fanin/internal/view.") || strings.Contains(g, "fanin/internal/store.") {
			if !strings.Contains(g, "view_test.ours") {
				n++
			}
		}
	}
	return n
}

// Open gives up when its context ends before the current values are in, and leaves nothing
// running. Not parallel, as above.
func TestOpenBoundedByItsContext(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := view.Open(ctx, e.nc, view.WithBuckets(e.b), view.WithLogger(testutil.Logger())); err == nil {
		t.Fatal("Open with a cancelled context succeeded")
	}
	testutil.CheckFor(t, time.Second, 10*time.Millisecond, func() error {
		if n := ours(); n > 0 {
			return fmt.Errorf("%d goroutines of the view's left after a failed Open", n)
		}
		return nil
	})
}

// The elastic workers' assignments follow their bucket: the current ones are in at Open, later
// writes and deletes follow, and what Assignment returns is the caller's to change.
func TestAssignmentsFollowTheBucket(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	at := time.Now().UTC().Truncate(time.Millisecond)
	e.put(e.b.Assign, "a", wire.Assignment{Job: "a", Epoch: 3, Updated: at,
		Workers: []wire.AssignedWorker{{ID: "w1", Host: "h1", Ranks: []int{0, 1}, Step: 7, LastBeat: at}}})
	v := e.open()
	s := v.Snapshot()
	if a := s.Assignments["a"]; len(s.Assignments) != 1 || a.Epoch != 3 || len(a.Workers) != 1 ||
		a.Workers[0].ID != "w1" || fmt.Sprint(a.Workers[0].Ranks) != "[0 1]" || !a.Workers[0].LastBeat.Equal(at) {
		t.Fatalf("assignments at Open: %+v", s.Assignments)
	}
	a, ok := v.Assignment("a")
	if !ok {
		t.Fatal("no assignment of a")
	}
	a.Workers[0].Ranks[0] = 99
	if b, _ := v.Assignment("a"); b.Workers[0].Ranks[0] != 0 {
		t.Fatalf("changing a returned assignment changed the view's: %+v", b)
	}

	e.put(e.b.Assign, "a", wire.Assignment{Job: "a", Epoch: 4, Target: 1, Unassigned: []int{1},
		Workers: []wire.AssignedWorker{{ID: "w1", Ranks: []int{0}}, {ID: "w2", Standby: true}}})
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if a, ok := v.Assignment("a"); !ok || a.Epoch != 4 || len(a.Workers) != 2 || !a.Workers[1].Standby || a.Target != 1 {
			return fmt.Errorf("assignment %+v, want epoch 4", a)
		}
		return nil
	})
	if err := e.b.Assign.Delete(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if _, ok := v.Assignment("a"); ok {
			return fmt.Errorf("the deleted assignment is still in the view")
		}
		return nil
	})
	if _, ok := v.Assignment("nope"); ok {
		t.Fatal("an assignment of a job that has none")
	}
}

// A writer of the jobs bucket can wait for the view to hold its change (the gateway does, so that
// what it answers from the view next includes its own write): once WaitSeen returns, the record
// is there, changed or gone.
func TestWaitSeenJobs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	v := e.open()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 20 {
		rec := record(fmt.Sprintf("j%d", i))
		rec.Workers = 1
		rev := e.put(e.b.Jobs, rec.Spec.ID, rec)
		if err := v.WaitSeen(ctx, wire.JobsBucket, rev); err != nil {
			t.Fatal(err)
		}
		if got, ok := v.Job(rec.Spec.ID); !ok || got.Workers != 1 {
			t.Fatalf("after WaitSeen of revision %d: job %s %+v (%v)", rev, rec.Spec.ID, got, ok)
		}
		rec.Paused = true
		rev = e.put(e.b.Jobs, rec.Spec.ID, rec)
		if err := v.WaitSeen(ctx, wire.JobsBucket, rev); err != nil {
			t.Fatal(err)
		}
		if got, _ := v.Job(rec.Spec.ID); !got.Paused {
			t.Fatalf("after WaitSeen of revision %d: job %s not paused", rev, rec.Spec.ID)
		}
	}
	if s := v.Seen(wire.JobsBucket); s != 40 {
		t.Fatalf("Seen(jobs) = %d after 40 writes", s)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if err := v.WaitSeen(short, wire.JobsBucket, 41); err == nil {
		t.Fatal("WaitSeen of a revision not written yet returned")
	}
}

// A registration's Registered is when its runtime started, on the server's clock, however many
// heartbeats later and whatever the runtime's own clock says; one without Started (written by an
// older runtime) counts from the first write the view saw, not from its last heartbeat.
func TestRegisteredIsWhenTheRuntimeStarted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	v := e.open()
	skew := 10 * time.Minute // the runtime's clock is ahead of the server's
	started := time.Now().Add(-time.Hour)
	e.put(e.b.Runtimes, "rt-new", wire.RuntimeInfo{ID: "rt-new", Cores: 1})
	var firstOld time.Time // when rt-old's first registration was written, by the server
	// Two heartbeats each.
	for i := range 2 {
		e.put(e.b.Runtimes, "rt-1", wire.RuntimeInfo{ID: "rt-1", Cores: 1, Started: started.Add(skew), Beat: time.Now().Add(skew)})
		e.put(e.b.Runtimes, "rt-old", wire.RuntimeInfo{ID: "rt-old", Cores: 1})
		if i == 0 {
			en, err := e.b.Runtimes.Get(context.Background(), "rt-old")
			if err != nil {
				t.Fatal(err)
			}
			firstOld = en.Created()
			// The bucket keeps one value per key: a write replaced before the watch delivered it
			// is never seen. The view must have seen this one for it to count from it.
			testutil.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
				if _, ok := v.Runtime("rt-old"); !ok {
					return fmt.Errorf("rt-old's first registration not in the view")
				}
				return nil
			})
		}
	}
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		r, ok := v.Runtime("rt-old")
		if _, ok1 := v.Runtime("rt-1"); !ok || !ok1 || !r.Beat.After(firstOld) {
			return fmt.Errorf("heartbeats not in yet")
		}
		return nil
	})
	r1, _ := v.Runtime("rt-1")
	if d := r1.Registered.Sub(started); d < -time.Second || d > time.Second {
		t.Errorf("rt-1 started at %v, registered %v (heartbeat %v): off by %v", started, r1.Registered, r1.Beat, d)
	}
	if old, _ := v.Runtime("rt-old"); !old.Registered.Equal(firstOld) {
		t.Errorf("rt-old registered %v, last heartbeat %v: want its first write, %v", old.Registered, old.Beat, firstOld)
	}
	if r, _ := v.Runtime("rt-new"); !r.Registered.Equal(r.Beat) {
		t.Errorf("rt-new, written once without Started: registered %v, want its entry's time %v", r.Registered, r.Beat)
	}
}
