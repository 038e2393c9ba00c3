package autoscaler_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// manualClock is a clock that moves only when the test moves it.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func newManualClock() *manualClock { return &manualClock{t: time.Now()} }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// putJob stores a job like e's under id.
func (e *ctlEnv) putJob(id string) job.Record {
	e.t.Helper()
	spec := e.rec.Spec
	spec.ID = id
	rec := job.NewRecord(spec, time.Now())
	data, _ := json.Marshal(rec)
	if _, err := e.b.Jobs.Put(context.Background(), id, data); err != nil {
		e.t.Fatal(err)
	}
	return rec
}

// placementOf reads the placement entries of job id: key -> entry.
func (e *ctlEnv) placementOf(rec job.Record) map[string]wire.Placement {
	e.t.Helper()
	out := map[string]wire.Placement{}
	for _, s := range rec.Layout.Shards {
		en, err := e.b.Placement.Get(context.Background(), wire.PlacementKey(rec.Spec.ID, s.ID))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			e.t.Fatal(err)
		}
		var p wire.Placement
		_ = json.Unmarshal(en.Value(), &p)
		out[en.Key()] = p
	}
	return out
}

// Two controllers believe they lead: a's lock expired at the server while it was deciding (its
// renewal was slow, its clock had not told it yet), and b took over. a's writes are refused by the
// server, the placement is written only by b's term, and a steps down at its next step. Without
// the fence, a's compare-and-set on keys b had not touched went through: a second writer.
func TestControllerDeposedLeaderWritesAreRefused(t *testing.T) {
	t.Parallel()
	e := newCtlEnv(t)
	e.beat("rt-a")
	e.beat("rt-b")
	clock := newManualClock() // a's lease never runs out by its own clock
	a := e.controller(&fakePool{size: 2}, autoscaler.WithClock(clock.Now))
	b := e.controller(&fakePool{size: 2})
	e.stepUntil(a, allOn("rt-a", "rt-b"))
	termA := autoscaler.Term(a)

	var k job.Record
	var took sync.Once
	autoscaler.SetRegistryCheck(a, func(ctx context.Context) bool { // within a's step, before it decides
		took.Do(func() {
			// a's lock expires (its renewal was slow) and b takes over...
			if err := e.b.Leader.Purge(ctx, "autoscaler"); err != nil {
				t.Fatal(err)
			}
			e.stepUntil(b, allOn("rt-a", "rt-b"))
			// ...then a job arrives, which a sees before it decides.
			k = e.putJob("k")
			testutil.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
				if _, ok := autoscaler.Snapshot(a).Jobs["k"]; !ok {
					return errors.New("a's view has no job k yet")
				}
				return nil
			})
		})
		return true
	})
	_, err := a.Step(context.Background())
	termB := autoscaler.Term(b)
	if !termB.After(termA) {
		t.Fatalf("b's term %+v is not after a's %+v", termB, termA)
	}
	if !errors.Is(err, store.ErrFenced) {
		t.Errorf("the deposed leader's step: %v, want its writes refused (store.ErrFenced)", err)
	}
	if p := e.placementOf(k); len(p) != 0 {
		t.Fatalf("the deposed leader placed job k after b took over: %v", p)
	}
	if _, err := a.Step(context.Background()); !errors.Is(err, autoscaler.ErrNotLeader) || a.IsLeader() {
		t.Fatalf("the deposed leader's next step: %v (leader %v), want it stepped down", err, a.IsLeader())
	}
	// The placement is b's alone from now on: every entry written since it took over is of its term.
	var placed map[string]wire.Placement
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		e.beat("rt-a")
		e.beat("rt-b")
		if _, err := b.Step(context.Background()); err != nil {
			return err
		}
		if placed = e.placementOf(k); len(placed) != len(k.Layout.Shards) {
			return fmt.Errorf("%d of %d shards of k placed", len(placed), len(k.Layout.Shards))
		}
		return nil
	})
	for key, p := range placed {
		if p.Term != termB.Rev {
			t.Errorf("%s written in term %d, want b's %d", key, p.Term, termB.Rev)
		}
	}
	if got, err := store.BucketTerm(context.Background(), jetstreamOf(t, e.nc), wire.PlacementBucket); err != nil || got != termB {
		t.Errorf("the placement's fence holds %+v (%v), want b's term %+v", got, err, termB)
	}
}

func jetstreamOf(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// A leader whose renewal hangs stops acting as leader once its lease is over, before the lock's
// TTL has passed (so before another can take the lock): it was leader as long as it held the lock,
// renewed or not. Its next step ends that term; it may lead again only in a new one, taking the
// lock back (it still names it, and nobody else could have taken it).
func TestControllerStopsLeadingWhenItCannotRenew(t *testing.T) {
	t.Parallel()
	if autoscaler.LeaseFor >= store.LeaderTTL {
		t.Fatalf("lease %v not shorter than the lock's TTL %v", autoscaler.LeaseFor, store.LeaderTTL)
	}
	e := newCtlEnv(t)
	e.beat("rt-a")
	clock := newManualClock()
	a := e.controller(&fakePool{size: 1}, autoscaler.WithClock(clock.Now))
	e.stepUntil(a, allOn("rt-a"))
	renewing, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	autoscaler.SetRenewHook(a, func(context.Context) {
		if calls.Add(1) == 1 { // this renewal hangs; later ones (a new term's) do not
			close(renewing)
			<-release
		}
	})
	term := autoscaler.Term(a)
	var wg sync.WaitGroup
	wg.Go(func() { autoscaler.Renew(a, context.Background()) })
	defer func() { close(release); wg.Wait() }()
	<-renewing // the renewal hangs
	clock.Add(autoscaler.LeaseFor - time.Millisecond)
	if !a.IsLeader() {
		t.Fatal("not leader within its lease")
	}
	clock.Add(time.Millisecond)
	if a.IsLeader() {
		t.Fatalf("still leader %v after its last renewal, the lock's TTL being %v", autoscaler.LeaseFor, store.LeaderTTL)
	}
	_, err := a.Step(context.Background())
	if now := autoscaler.Term(a); !errors.Is(err, autoscaler.ErrNotLeader) && (err != nil || now.Rev <= term.Rev) {
		t.Fatalf("a step after the lease ran out: %v, in term %d (the lapsed one %d)", err, now.Rev, term.Rev)
	}
}

// A renewal that gave up waiting may still be stored (behind a full link, its answer came after
// the attempt ended). The next renewal, made from the revision before it, is refused; the leader
// then finds the lock still its own at a later revision and renews from there, where it used to
// step down ("the lock expired") and begin a new term.
func TestControllerKeepsTheLockALateRenewalKept(t *testing.T) {
	t.Parallel()
	e := newCtlEnv(t)
	e.beat("rt-a")
	a := e.controller(&fakePool{size: 1})
	e.stepUntil(a, allOn("rt-a"))
	term := autoscaler.Term(a)
	ctx := context.Background()
	lock, err := e.b.Leader.Get(ctx, "autoscaler")
	if err != nil {
		t.Fatal(err)
	}
	// The renewal that gave up, stored: the same holder, the next revision.
	late, err := e.b.Leader.Update(ctx, "autoscaler", lock.Value(), lock.Revision())
	if err != nil {
		t.Fatal(err)
	}
	autoscaler.Renew(a, ctx) // from lock.Revision(): refused
	if !a.IsLeader() || autoscaler.Term(a) != term {
		t.Fatalf("after a renewal refused because a late one was stored: leader %v, term %+v, want term %+v", a.IsLeader(), autoscaler.Term(a), term)
	}
	autoscaler.Renew(a, ctx) // from the late one's revision
	now, err := e.b.Leader.Get(ctx, "autoscaler")
	if err != nil {
		t.Fatal(err)
	}
	if now.Revision() <= late || string(now.Value()) != string(lock.Value()) {
		t.Fatalf("the lock at revision %d holding %q, want a renewal after %d by %q", now.Revision(), now.Value(), late, lock.Value())
	}
	if _, err := a.Step(ctx); err != nil {
		t.Fatalf("a step in the same term: %v", err)
	}
}

// A lock bucket whose TTL is shorter than LeaderTTL (an older fanin's, 5 s, written back by it
// during a rolling upgrade) gets a lease shorter than its TTL: the leader stops acting before the
// server could let another take the lock.
func TestControllerLeaseFollowsTheLocksTTL(t *testing.T) {
	t.Parallel()
	e := newCtlEnv(t)
	e.beat("rt-a")
	clock := newManualClock()
	a := e.controller(&fakePool{size: 1}, autoscaler.WithClock(clock.Now))
	e.stepUntil(a, allOn("rt-a"))
	ctx := context.Background()
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 5 * time.Second
	if _, err := js.UpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.LeaderBucket, History: 1, TTL: ttl,
		Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	// The term taken at 10 s ends by its lease; the next is taken under the 5 s TTL.
	clock.Add(autoscaler.LeaseFor)
	if _, err := a.Step(ctx); err != nil {
		t.Fatalf("a step in a new term: %v", err)
	}
	clock.Add(ttl - time.Second - time.Millisecond)
	if !a.IsLeader() {
		t.Fatal("not leader within a lease shorter than the lock's 5s TTL")
	}
	clock.Add(time.Millisecond)
	if a.IsLeader() {
		t.Fatalf("still leader %v after its renewal, the lock's TTL being %v", ttl-time.Second, ttl)
	}
}

// blockingPool is a pool driver whose Scale blocks until released: a slow decision.
type blockingPool struct {
	fakePool
	entered chan struct{} // closed at the first Scale
	release chan struct{}
	once    sync.Once
}

func (p *blockingPool) Scale(ctx context.Context, n int) error {
	p.once.Do(func() { close(p.entered) })
	select {
	case <-p.release:
	case <-ctx.Done():
	}
	return p.fakePool.Scale(ctx, n)
}

// The leader lock is renewed from a goroutine of its own: a decision stuck in the pool driver does
// not let it lapse. (It used to be renewed by each decision.)
func TestControllerRenewsWhileADecisionIsSlow(t *testing.T) {
	t.Parallel()
	e := newCtlEnv(t)
	e.beat("rt-a")
	pool := &blockingPool{entered: make(chan struct{}), release: make(chan struct{})}
	c, err := autoscaler.NewController(e.nc, pool, autoscaler.WithControllerLogger(testutil.Logger()),
		autoscaler.WithControllerTelemetry(nil, nil), autoscaler.WithInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	defer close(pool.release)
	<-pool.entered // the decision is stuck in Scale
	first, err := e.b.Leader.Get(ctx, "autoscaler")
	if err != nil {
		t.Fatal(err)
	}
	testutil.CheckFor(t, 3*store.LeaderTTL, 50*time.Millisecond, func() error {
		en, err := e.b.Leader.Get(ctx, "autoscaler")
		if err != nil {
			return fmt.Errorf("the lock lapsed while a decision was slow: %w", err)
		}
		if en.Revision() < first.Revision()+2 {
			return fmt.Errorf("lock at revision %d, taken at %d: not renewed", en.Revision(), first.Revision())
		}
		if string(en.Value()) != string(first.Value()) {
			return fmt.Errorf("lock held by %s, not %s", en.Value(), first.Value())
		}
		return nil
	})
	if !c.IsLeader() {
		t.Fatal("not leader while its lock is renewed")
	}
}

// ownPool is a pool driver that owns only the runtimes it started (as ProcessDriver) and counts
// what it is asked to do.
type ownPool struct {
	mu      sync.Mutex
	owned   map[string]bool
	started int
	removed []string
}

func (p *ownPool) Scale(_ context.Context, n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.owned) < n {
		p.started++
		p.owned[fmt.Sprintf("rt-own-%d", p.started)] = true
	}
	return nil
}

func (p *ownPool) Remove(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removed = append(p.removed, id)
	delete(p.owned, id) // a runtime it does not own is left running, as ProcessDriver does
	return nil
}

func (p *ownPool) Size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.owned)
}

func (p *ownPool) Owns(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.owned[id]
}

// A leader whose driver did not start the pool's runtimes (another autoscaler's did) adopts them:
// it starts none for them, and one it drains is stopped by a stop request, which it obeys. Before,
// the leader asked its own driver to remove it (a no-op), and started its own runtimes beside the
// others, then drained and stopped those, and started them again: one a second, for good.
func TestControllerAdoptsAndStopsForeignRuntimes(t *testing.T) {
	t.Parallel()
	e := newCtlEnv(t)
	e.beat("rt-x")
	e.beat("rt-y")
	var mu sync.Mutex
	stops := map[string]int{}
	sub, err := e.nc.Subscribe(wire.RuntimeStopSubject("*"), func(m *nats.Msg) { // the runtimes
		id := strings.Split(strings.TrimPrefix(m.Subject, wire.Prefix+"runtimes."), ".")[0]
		var term store.Term
		if json.Unmarshal([]byte(m.Header.Get(store.HdrTerm)), &term) != nil || term.IsZero() {
			_ = m.Respond([]byte("refused: no term"))
			return
		}
		mu.Lock()
		stops[id]++
		mu.Unlock()
		_ = m.Respond([]byte(wire.RuntimeStopping))
		_ = e.b.Runtimes.Delete(context.Background(), id) // it deregisters as it exits
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	pool := &ownPool{owned: map[string]bool{}}
	c := e.controller(pool)
	var survivor string
	e.stepUntil(c, func(p map[string]string) error {
		mu.Lock()
		defer mu.Unlock()
		if len(stops) == 0 {
			return errors.New("no runtime stopped yet")
		}
		survivor = "rt-x"
		if stops["rt-x"] > 0 {
			survivor = "rt-y"
		}
		return allOn(survivor)(p)
	})
	for range 10 { // and then it stays so
		e.beat(survivor)
		if _, err := c.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	pool.mu.Lock()
	defer pool.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if pool.started != 0 || len(pool.removed) != 0 {
		t.Errorf("the leader started %d runtimes and removed %v beside the adopted ones", pool.started, pool.removed)
	}
	if len(stops) != 1 {
		t.Errorf("stop requests %v, want one, to the drained runtime", stops)
	}
}
