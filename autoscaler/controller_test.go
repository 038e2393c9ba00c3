package autoscaler_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// fakePool is a pool driver that records what it is asked; runtimes are registered by the test.
type fakePool struct {
	mu      sync.Mutex
	size    int
	removed []string
}

func (p *fakePool) Scale(_ context.Context, n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.size = max(p.size, n)
	return nil
}

func (p *fakePool) Remove(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removed = append(p.removed, id)
	p.size--
	return nil
}

func (p *fakePool) Size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.size
}

// ctlEnv is a NATS server with fanin's buckets, a job of 8 shards and registered runtimes.
type ctlEnv struct {
	t   *testing.T
	nc  *nats.Conn
	b   *store.Buckets
	rec job.Record
	// lapses are the lapses runtimes ask for in their registrations (none: the default).
	lapses map[string]time.Duration
}

func newCtlEnv(t *testing.T) *ctlEnv {
	nc, err := nats.Connect(testutil.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	b, err := store.OpenBuckets(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	spec := job.Spec{ID: "j", Tensors: []job.Tensor{{Name: "w", Shape: []int{8 * 1024}}}, Ranks: 2,
		Function: job.Function{Name: "sgd"}, ShardSize: 4096}
	spec.Normalize()
	e := &ctlEnv{t: t, nc: nc, b: b, rec: job.NewRecord(spec, time.Now())}
	if len(e.rec.Layout.Shards) != 8 {
		t.Fatalf("%d shards", len(e.rec.Layout.Shards))
	}
	data, _ := json.Marshal(e.rec)
	if _, err := b.Jobs.Put(context.Background(), "j", data); err != nil {
		t.Fatal(err)
	}
	return e
}

// beat registers runtime id (again), as its heartbeat does.
func (e *ctlEnv) beat(id string) { e.t.Helper(); e.beatStarted(id, time.Now()) }

// beatStarted registers runtime id (again) as a runtime started at started does.
func (e *ctlEnv) beatStarted(id string, started time.Time) {
	e.t.Helper()
	info, _ := json.Marshal(wire.RuntimeInfo{ID: id, Cores: 4, Started: started, Beat: time.Now(), Lapse: e.lapses[id]})
	if _, err := e.b.Runtimes.Put(context.Background(), id, info); err != nil {
		e.t.Fatal(err)
	}
}

// placement reads the placement bucket: shard key -> runtime.
func (e *ctlEnv) placement() map[string]string {
	e.t.Helper()
	out := map[string]string{}
	for _, s := range e.rec.Layout.Shards {
		en, err := e.b.Placement.Get(context.Background(), wire.PlacementKey("j", s.ID))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			e.t.Fatal(err)
		}
		var p wire.Placement
		_ = json.Unmarshal(en.Value(), &p)
		out[en.Key()] = p.Runtime
	}
	return out
}

// controller runs a controller with manual steps until the test ends.
func (e *ctlEnv) controller(drv autoscaler.PoolDriver, opts ...autoscaler.ControllerOption) *autoscaler.Controller {
	e.t.Helper()
	c, err := autoscaler.NewController(e.nc, drv, append([]autoscaler.ControllerOption{autoscaler.WithManualSteps(),
		autoscaler.WithControllerLogger(testutil.Logger()), autoscaler.WithControllerTelemetry(nil, nil)}, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Error(err)
		}
	})
	return c
}

// step steps c until it has placed all 8 shards on live runtimes (the watches catch up first).
func (e *ctlEnv) stepUntil(c *autoscaler.Controller, ok func(map[string]string) error) map[string]string {
	e.t.Helper()
	var got map[string]string
	testutil.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, func() error {
		if _, err := c.Step(context.Background()); err != nil {
			return err
		}
		got = e.placement()
		return ok(got)
	})
	return got
}

// beatSeen registers runtime id (again) and waits until the view of c, which has run a step,
// holds the new registration; it returns the heartbeat's time as the view has it (the NATS
// server's stamp), which the liveness rule reads.
func (e *ctlEnv) beatSeen(c *autoscaler.Controller, id string) time.Time {
	e.t.Helper()
	before := autoscaler.Snapshot(c).Runtimes[id].Beat
	e.beat(id)
	var beat time.Time
	testutil.CheckFor(e.t, 10*time.Second, 5*time.Millisecond, func() error {
		if beat = autoscaler.Snapshot(c).Runtimes[id].Beat; !beat.After(before) {
			return fmt.Errorf("the controller's view has no heartbeat of %s after %v", id, before)
		}
		return nil
	})
	return beat
}

// advance moves clock, c's, to t, stepping c at least every second of it as its loop would, so
// that each step renews its lease on the leader lock (store.LeaderTTL) before the clock runs past it.
func (e *ctlEnv) advance(c *autoscaler.Controller, clock *manualClock, t time.Time) {
	e.t.Helper()
	for now := clock.Now(); now.Before(t); now = clock.Now() {
		clock.Add(min(time.Second, t.Sub(now)))
		if _, err := c.Step(context.Background()); err != nil {
			e.t.Fatal(err)
		}
	}
}

func allOn(allowed ...string) func(map[string]string) error {
	return func(p map[string]string) error {
		if len(p) != 8 {
			return fmt.Errorf("%d of 8 shards placed", len(p))
		}
		for k, r := range p {
			ok := false
			for _, a := range allowed {
				ok = ok || r == a
			}
			if !ok {
				return fmt.Errorf("%s on %s, want one of %v", k, r, allowed)
			}
		}
		return nil
	}
}

// A runtime the driver saw die loses its shards in the very next decision (which the controller
// takes at once, without waiting for its tick); its registration is removed, and a late heartbeat
// does not bring it back.
func TestControllerVanishedRuntimeReplacedAtOnce(t *testing.T) {
	t.Parallel()
	e := newCtlEnv(t)
	e.beat("rt-a")
	e.beat("rt-b")
	c := e.controller(&fakePool{size: 2})
	before := e.stepUntil(c, allOn("rt-a", "rt-b"))
	victim, other := before[wire.PlacementKey("j", 0)], "rt-a"
	if victim == "rt-a" {
		other = "rt-b"
	}
	moved := 0
	for _, r := range before {
		if r == victim {
			moved++
		}
	}
	c.Vanished(victim)
	d, err := c.Step(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := allOn(other)(e.placement()); err != nil || len(d.Moves) != moved {
		t.Fatalf("the decision after %s vanished: %v; %d moves for its %d shards", victim, err, len(d.Moves), moved)
	}
	if _, err := e.b.Runtimes.Get(context.Background(), victim); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the vanished runtime is still registered: %v", err)
	}
	e.beatSeen(c, victim) // a heartbeat sent just before it died, delivered late
	if d, err := c.Step(context.Background()); err != nil || len(d.Moves) != 0 {
		t.Fatalf("a decision after recovery: %v, moves %v", err, d.Moves)
	}
}

// A runtime's age is from when it started, not from its last heartbeat: a slow runtime that has
// run for an hour and beats every second is past any startup grace, judged a straggler, emptied and
// removed. (The controller used to give the decider the last heartbeat as the registration time,
// so a runtime that kept beating stayed in its grace for good and was never judged.)
func TestControllerJudgesALongRunningStraggler(t *testing.T) {
	t.Parallel()
	e := newCtlEnv(t)
	started := time.Now().Add(-time.Hour)
	for _, id := range []string{"rt-a", "rt-b", "rt-c"} {
		e.beatStarted(id, started)
	}
	pol := autoscaler.DefaultPolicy()
	pol.StartupGrace = 30 * time.Minute // longer than this test: only the start time can be past it
	pol.StragglerSpeed = 0.6            // off by default (policy.go)
	pool := &fakePool{size: 3}
	c := e.controller(pool, autoscaler.WithPolicy(pol))
	e.stepUntil(c, allOn("rt-a", "rt-b", "rt-c"))
	var reasons []string
	e.stepUntil(c, func(p map[string]string) error {
		for id, nanos := range map[string]float64{"rt-a": 1, "rt-b": 1, "rt-c": 5} { // rt-c at 0.2x
			e.beatStarted(id, started)
			rep, _ := json.Marshal(wire.LoadReport{Runtime: id, Cores: 4, At: time.Now(), NanosPerByte: nanos})
			if err := e.nc.Publish(wire.LoadSubject(id), rep); err != nil {
				return err
			}
		}
		if recent := c.Recent(); len(recent) > 0 {
			reasons = recent[len(recent)-1].Reasons
			for _, m := range recent[len(recent)-1].Moves {
				reasons = append(reasons, m.Reason)
			}
		}
		return allOn("rt-a", "rt-b")(p)
	})
	if !strings.Contains(strings.Join(reasons, "; "), "straggler") {
		t.Errorf("rt-c was emptied, but not as a straggler: %q", reasons)
	}
	pool.mu.Lock()
	defer pool.mu.Unlock()
	if !slices.Contains(pool.removed, "rt-c") {
		t.Errorf("removed %v: the straggler, emptied, is not removed", pool.removed)
	}
}

// A paused job is placed nowhere: the controller purges its placement, and places it again once
// it is resumed.
func TestControllerPausedJobUnplaced(t *testing.T) {
	t.Parallel()
	e := newCtlEnv(t)
	e.beat("rt-a")
	c := e.controller(&fakePool{size: 1})
	e.stepUntil(c, allOn("rt-a"))
	paused := e.rec
	paused.Paused = true
	for _, rec := range []job.Record{paused, e.rec} {
		data, _ := json.Marshal(rec)
		if _, err := e.b.Jobs.Put(context.Background(), "j", data); err != nil {
			t.Fatal(err)
		}
		want := allOn("rt-a")
		if rec.Paused {
			want = func(p map[string]string) error {
				if len(p) != 0 {
					return fmt.Errorf("the paused job is still placed: %v", p)
				}
				return nil
			}
		}
		e.beat("rt-a")
		e.stepUntil(c, want)
	}
}

// A runtime whose heartbeat lapsed (store.RuntimeLapse) is dead to the controller: its shards move
// in the first decision after the lapse. The controller's clock moves by hand: the lapse takes no
// time. No heartbeat comes meanwhile, so to the controller its view lags (observe): rt-a's age
// counts from rt-b's heartbeat, a moment after its own, less the most lag taken off.
func TestControllerLapsedRuntime(t *testing.T) {
	t.Parallel()
	e := newCtlEnv(t)
	clock := newManualClock()
	c := e.controller(&fakePool{size: 1}, autoscaler.WithClock(clock.Now))
	e.beat("rt-a")
	e.stepUntil(c, allOn("rt-a"))
	a := autoscaler.Snapshot(c).Runtimes["rt-a"].Beat // as the server stamped it
	e.beatSeen(c, "rt-b")                             // rt-a has stopped: rt-b's heartbeat is the later one
	e.advance(c, clock, a.Add(store.RuntimeLapse+autoscaler.MaxViewLag))
	e.stepUntil(c, allOn("rt-b"))
}

// A runtime whose heartbeats were slow asks for a longer lapse (store.LapseFor), and the
// controller gives it that long: rt-a, asking for 9 s, keeps its shards past the default lapse and
// loses them once its own has passed. rt-b asks for the most, so that it is alive throughout.
func TestControllerGivesTheLapseAskedFor(t *testing.T) {
	t.Parallel()
	e := newCtlEnv(t)
	e.lapses = map[string]time.Duration{"rt-a": 9 * time.Second, "rt-b": store.MaxRuntimeLapse}
	clock := newManualClock()
	c := e.controller(&fakePool{size: 1}, autoscaler.WithClock(clock.Now))
	e.beat("rt-a")
	e.stepUntil(c, allOn("rt-a"))
	a := autoscaler.Snapshot(c).Runtimes["rt-a"].Beat // as the server stamped it
	e.beatSeen(c, "rt-b")
	// No heartbeat comes meanwhile: the controller takes its view's lag off, up to MaxViewLag.
	e.advance(c, clock, a.Add(store.RuntimeLapse+2*time.Second+autoscaler.MaxViewLag))
	for range 3 {
		if _, err := c.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := allOn("rt-a")(e.placement()); err != nil {
			t.Fatalf("rt-a asked for a lapse of 9s and was taken for dead after %v: %v", store.RuntimeLapse+2*time.Second, err)
		}
	}
	e.advance(c, clock, a.Add(9*time.Second+autoscaler.MaxViewLag))
	e.stepUntil(c, allOn("rt-b"))
}

// While the runtime registry cannot take heartbeats (its stream has no leader: a server restarts,
// a node was lost), a runtime whose heartbeat lapses is not taken for dead; once the registry has
// been back for a whole lapse, it is. The controller's clock moves by hand, but the heartbeats are
// stamped by the NATS server's: rt-b can beat a lapse after rt-a only once that much real time has
// passed (about 5 s).
func TestControllerLapseWaitsForTheRegistry(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits for a heartbeat to lapse")
	}
	e := newCtlEnv(t)
	clock := newManualClock()
	c := e.controller(&fakePool{size: 1}, autoscaler.WithClock(clock.Now))
	e.beat("rt-a")
	e.stepUntil(c, allOn("rt-a"))
	a := autoscaler.Snapshot(c).Runtimes["rt-a"].Beat // as the server stamped it
	var healthy atomic.Bool
	autoscaler.SetRegistryCheck(c, func(context.Context) bool { return healthy.Load() })
	e.beatSeen(c, "rt-b") // rt-a has stopped
	e.advance(c, clock, a.Add(store.RuntimeLapse))
	for range 3 {
		if _, err := c.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := allOn("rt-a")(e.placement()); err != nil {
			t.Fatalf("rt-a's heartbeat lapsed while the registry was down, and it was taken for dead: %v", err)
		}
	}
	healthy.Store(true)
	if _, err := c.Step(context.Background()); err != nil { // the registry is back from now
		t.Fatal(err)
	}
	back := clock.Now()
	// rt-b beats on, so that it is alive a lapse from now, when rt-a is judged: a beat stamped
	// after a.Add(RuntimeLapse) by the server's clock. The controller steps meanwhile, as its loop
	// would, renewing its lock before the server's TTL ends it.
	testutil.CheckFor(t, 2*store.RuntimeLapse, store.RuntimeHeartbeat/5, func() error {
		if _, err := c.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		if b := e.beatSeen(c, "rt-b"); !b.After(a.Add(store.RuntimeLapse)) {
			return fmt.Errorf("rt-b's heartbeat at %v, not a lapse after rt-a's at %v", b, a)
		}
		return nil
	})
	e.advance(c, clock, back.Add(store.RuntimeLapse))
	e.stepUntil(c, allOn("rt-b"))
}

// Two controllers: one leads and decides, the other refuses to; when the leader stops renewing
// the lock (it died), the other takes over within the lock's TTL and keeps the placement as it was.
func TestControllerTakesOverFromDeadLeader(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits for the leader lock's TTL")
	}
	e := newCtlEnv(t)
	e.beat("rt-a")
	e.beat("rt-b")
	a, b := e.controller(&fakePool{size: 2}), e.controller(&fakePool{size: 2})
	before := e.stepUntil(a, allOn("rt-a", "rt-b"))
	if _, err := b.Step(context.Background()); !errors.Is(err, autoscaler.ErrNotLeader) {
		t.Fatalf("second controller stepped while the first leads: %v", err)
	}
	died := time.Now()
	var took time.Duration
	testutil.CheckFor(t, 3*store.LeaderTTL, 50*time.Millisecond, func() error {
		e.beat("rt-a")
		e.beat("rt-b")
		if _, err := b.Step(context.Background()); err != nil {
			return err
		}
		took = time.Since(died)
		return nil
	})
	t.Logf("took over after %v (lock TTL %v)", took.Round(time.Millisecond), store.LeaderTTL)
	if after := e.placement(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the new leader moved shards: %v -> %v", before, after)
	}
	if _, err := a.Step(context.Background()); !errors.Is(err, autoscaler.ErrNotLeader) {
		t.Fatalf("the old leader, back, decided alongside the new one: %v", err)
	}
}

// The decision interval must leave the leader time to renew its lock.
func TestControllerIntervalWithinLockTTL(t *testing.T) {
	t.Parallel()
	nc, err := nats.Connect(testutil.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, d := range []time.Duration{0, store.LeaderTTL, store.LeaderTTL/2 + time.Millisecond} {
		if _, err := autoscaler.NewController(nc, nil, autoscaler.WithInterval(d)); err == nil {
			t.Errorf("interval %v accepted with a %v lock TTL", d, store.LeaderTTL)
		}
	}
	if _, err := autoscaler.NewController(nc, nil, autoscaler.WithInterval(store.LeaderTTL/2)); err != nil {
		t.Error(err)
	}
}
