package autoscaler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/members"
	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/internal/view"
	"github.com/fanin-ml/fanin/wire"
)

// PoolDriver starts and stops runtimes. Drivers: in-process (fanin dev), OS processes
// (ProcessDriver), and a Kubernetes Deployment (scaling its replicas).
type PoolDriver interface {
	// Scale grows the pool to n runtimes; it never stops any (Remove does).
	Scale(ctx context.Context, n int) error
	// Remove stops one runtime gracefully: it checkpoints and releases its shards.
	Remove(ctx context.Context, id string) error
	// Size is the number of runtimes started and not removed.
	Size() int
}

// ownerDriver is a pool driver that runs only some of the pool's runtimes: ProcessDriver, the processes
// it started (another autoscaler's driver runs the others). A driver without it runs them all.
// The leader adopts the runtimes its driver does not own: it counts them in the pool instead of
// starting more, and stops those it drains by a stop request (wire.RuntimeStopSubject).
type ownerDriver interface {
	Owns(id string) bool
}

// templateSized is a pool driver whose runtimes a template sizes, not the policy: the Kubernetes
// Deployment's pod template (its CPU request), which the runtimes report as their cores. With such
// a driver the decider counts in the reported cores whatever the policy's cores_per_runtime says
// (as with cores_per_runtime 0): counting the default 4 cores for pods of 1 would size the pool 4
// times too small. ProcessDriver starts its runtimes with --cores cores_per_runtime.
type templateSized interface {
	TemplateSized() bool
}

// leaderKey is the key of the leader lock in the leader bucket.
const leaderKey = "autoscaler"

// Controller is the autoscaler's control loop. Every Interval the leader observes runtimes, shards
// and their load, asks the Decider, and carries the decision out: it resizes the pool through the
// driver and writes the placement, the leader being its only writer. Several controllers may run;
// a key-value lock with a TTL elects one leader, which renews it from a goroutine of its own and
// stops acting before the TTL ends when it cannot. Every write of the leader's to shared state
// (placement, assignments, decisions) is fenced by its term (store.Fence): the server refuses it
// once a later leader has claimed the fence, so there is never a second writer.
type Controller struct {
	js       jetstream.JetStream
	nc       *nats.Conn
	driver   PoolDriver
	log      *slog.Logger
	id       string
	interval time.Duration
	now      func() time.Time
	decider  *Decider
	buckets  *store.Buckets
	loop     bool
	tracing  *telemetry.Provider        // nil: tracing off
	met      *metrics.AutoscalerMetrics // nil: metrics off

	// view is the shared state (jobs, placement, runtimes, load reports) that Run follows; the
	// controller sees it through its own rules (observe): paused jobs and runtimes the driver
	// reported dead are left out.
	view *view.View

	renewHook func(context.Context) // runs before each renewal of the lock (tests); nil: none

	mu       sync.Mutex // guards everything below
	policy   Policy
	draining map[string]bool
	// templateSaid: the log said once that the driver's template, not the policy, sizes runtimes.
	templateSaid bool
	// The leadership: the lock's current revision (0: not leader), the term it was taken in, how
	// long a renewal lets it act (leaseFor, or less on a lock bucket with a shorter TTL), until
	// when this controller may act as leader (renewals push it on), and the term's fences.
	leaderRev  uint64
	term       store.Term
	lease      time.Duration
	leaseUntil time.Time
	fences     *fences
	recent     []Decision           // newest last, at most maxRecent
	vanished   []string             // runtimes the driver saw die, to deregister at once
	dead       map[string]time.Time // runtimes deregistered as vanished, and when: ids are never reused
	wake       chan struct{}        // a runtime vanished: decide now
	// registrySince is when the runtime registry last became writable (zero while it is not): a
	// runtime's heartbeats lapse for real only once it has been for that runtime's whole lapse.
	registrySince time.Time
	registryCheck func(context.Context) bool // registryHealthy; tests replace it
	// lapsed are the runtimes observe took for dead by their heartbeats, each with the heartbeat
	// it was last heard at then (sayLapse).
	lapsed map[string]time.Time

	ready chan struct{} // closed once Run follows the state (buckets set, current values in)

	// leaders are, per stream of a job, the NATS server leading it and when it was asked; only
	// Step, which is never concurrent with itself, reads and writes them (streamLeaders).
	leaders  map[string]streamLeader
	rehoming rehoming // what rehome keeps between decisions; only Step reads and writes it
}

type streamLeader struct {
	job    string
	server string
	at     time.Time
	// tag is the node tag (wire.NodeTag) the stream is placed by, if that is all its placement;
	// replicas, its replicas; moving, whether a move of it is under way (more peers than replicas).
	tag      string
	replicas int
	moving   bool
}

const maxRecent = 100

// ControllerOption configures a Controller.
type ControllerOption func(*Controller) error

// WithControllerLogger sets the logger.
func WithControllerLogger(l *slog.Logger) ControllerOption {
	return func(c *Controller) error { c.log = l; return nil }
}

// WithInterval sets how often the leader decides (default 1s): more than 0 and at most half the
// leader lock's TTL (store.LeaderTTL), so that a new leader decides soon after it takes over.
func WithInterval(d time.Duration) ControllerOption {
	return func(c *Controller) error {
		if d <= 0 || d > store.LeaderTTL/2 {
			return fmt.Errorf("interval must be > 0 and at most half the leader lock's TTL (%v), got %v", store.LeaderTTL, d)
		}
		c.interval = d
		return nil
	}
}

// WithPolicy sets the policy used until one is stored in the policy bucket.
func WithPolicy(p Policy) ControllerOption {
	return func(c *Controller) error {
		if err := p.Validate(); err != nil {
			return err
		}
		c.policy = p
		return nil
	}
}

// WithClock sets the controller's clock (tests).
func WithClock(now func() time.Time) ControllerOption {
	return func(c *Controller) error { c.now = now; return nil }
}

// WithManualSteps switches the loop off: the test calls Step itself, and each Step renews the
// leader lock (no goroutine does).
func WithManualSteps() ControllerOption {
	return func(c *Controller) error { c.loop = false; return nil }
}

// WithControllerTelemetry sets the tracer provider and the metrics registry (defaults:
// telemetry.Default() and metrics.Default()); nil turns either off.
func WithControllerTelemetry(tp *telemetry.Provider, m *metrics.Metrics) ControllerOption {
	return func(c *Controller) error { c.tracing, c.met = tp, m.Autoscaler(); return nil }
}

// NewController returns a controller; driver may be nil for a pool someone else sizes. Options:
// WithControllerLogger, WithInterval, WithPolicy, WithManualSteps, WithControllerTelemetry.
func NewController(nc *nats.Conn, driver PoolDriver, opts ...ControllerOption) (*Controller, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	c := &Controller{
		js: js, nc: nc, driver: driver, log: slog.Default(), id: "as-" + uuid.NewString()[:8],
		interval: time.Second, now: time.Now, decider: NewDecider(), loop: true, policy: DefaultPolicy(),
		draining: map[string]bool{}, dead: map[string]time.Time{}, leaders: map[string]streamLeader{},
		wake: make(chan struct{}, 1), ready: make(chan struct{}),
		tracing: telemetry.Default(), met: metrics.Default().Autoscaler(),
	}
	c.registryCheck = c.registryHealthy
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	c.log = c.log.With("component", "autoscaler", "id", c.id)
	return c, nil
}

// Run watches the shared state and, while leader, decides every interval, until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	b, err := store.OpenBuckets(ctx, c.js)
	if err != nil {
		return err
	}
	c.buckets = b
	// Kept per subject, not in all: the fence (one message a term) is never evicted by decisions.
	if _, err := store.EnsureStream(ctx, c.js, jetstream.StreamConfig{
		Name: wire.DecisionsStream, Subjects: []string{wire.DecisionsSubject, wire.DecisionsFence}, Storage: jetstream.FileStorage,
		MaxMsgsPerSubject: 1000, Description: "fanin autoscaler decisions",
	}); err != nil {
		return err
	}
	defer c.met.WatchConn("autoscaler "+c.id, c.nc)()

	// Decide only on the whole state: a leader missing the placement would move everything. Open
	// returns once the view holds every bucket's current values.
	v, err := view.Open(ctx, c.nc, view.WithBuckets(b), view.WithClock(c.now), view.WithLogger(c.log))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer v.Close()
	c.view = v
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	ready, err := store.Follow(wctx, c.js, b.Policy, ">", &wg, c.onPolicy)
	if err != nil {
		return err
	}
	select {
	case <-ready:
	case <-ctx.Done():
		return nil
	}
	close(c.ready)
	if !c.loop {
		<-ctx.Done()
		return nil
	}
	// Elastic workers' membership: every replica follows the beats, the leader assigns ranks.
	assigner := members.New(c.nc, b.Assign, v.Jobs, c.IsLeader, c.log.With("part", "members")).WithFence(c.assignWriter)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := assigner.Run(wctx); err != nil {
			c.log.Error("elastic workers' membership stopped", "err", err)
		}
	}()
	// The lock is renewed apart from the decisions: a slow one must not let it lapse.
	wg.Go(func() { c.renewLoop(wctx) })
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			cancel()
			wg.Wait() // the renewals stopped: the lock is not renewed after it is released
			c.resign()
			return nil
		case <-t.C:
		case <-c.wake: // a runtime died: its shards are placed elsewhere now, not at the next tick
		}
		if _, err := c.Step(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, ErrNotLeader) {
			c.log.Warn("autoscaler step", "err", err)
		}
	}
}

// ErrNotLeader is returned by Step on a controller that does not hold the leader lock.
var ErrNotLeader = errors.New("not the autoscaler leader")

// Step runs one observe-decide-act cycle if this controller is (or becomes) the leader. It waits for
// Run to have loaded the shared state. A leader first claims its term's fences, and decides once
// its view holds everything written before the claim; it steps down when a later term holds one.
func (c *Controller) Step(ctx context.Context) (Decision, error) {
	select {
	case <-c.ready:
	case <-ctx.Done():
		return Decision{}, ctx.Err()
	}
	if !c.campaign(ctx) {
		c.met.Leader(false)
		return Decision{}, ErrNotLeader
	}
	if !c.loop {
		c.renew(ctx) // no goroutine renews with manual steps: the caller is the loop
	}
	f := c.currentFences()
	if f == nil {
		c.met.Leader(false)
		return Decision{}, ErrNotLeader
	}
	if err := f.claim(ctx); err != nil {
		if errors.Is(err, store.ErrFenced) {
			c.stepDown(f, "deposed, a later leader holds the fence", err)
			c.met.Leader(false)
			return Decision{}, ErrNotLeader
		}
		return Decision{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, store.LeaderTTL/2)
	err := c.view.WaitSeen(wctx, wire.PlacementBucket, f.placement.Claimed())
	cancel()
	if err != nil {
		return Decision{}, err
	}
	c.met.Leader(true)
	c.deregisterVanished(ctx)
	healthy := c.registryCheck(ctx)
	now := c.now()
	snap := c.view.Snapshot()
	leaders := c.streamLeaders(ctx, snap, now)
	c.mu.Lock()
	switch {
	case !healthy:
		c.registrySince = time.Time{}
	case c.registrySince.IsZero():
		c.registrySince = now
	}
	writable := time.Duration(-1)
	if !c.registrySince.IsZero() {
		writable = now.Sub(c.registrySince)
	}
	pol := c.policy
	if ts, ok := c.driver.(templateSized); ok && ts.TemplateSized() && pol.CoresPerRuntime != 0 {
		if !c.templateSaid {
			c.templateSaid = true
			c.log.Info("the pool driver's template sizes the runtimes: counting the cores they report, not the policy's cores_per_runtime",
				"cores_per_runtime", pol.CoresPerRuntime)
		}
		pol.CoresPerRuntime = 0
	}
	obs := c.observe(snap, now, writable)
	c.mu.Unlock()
	for i := range obs.Shards {
		sh := &obs.Shards[i]
		sh.Leader = leaders[wire.ParamsStream(sh.Job)]
		if rec, ok := snap.Jobs[sh.Job]; ok && rec.Spec.GradStreams() > 1 {
			n := rec.Spec.GradStreams()
			if id, ok := wire.ShardFromSubject(sh.Key); ok {
				sh.GradLeader = leaders[wire.GradStreamOf(sh.Job, n, id)]
			}
		}
	}
	c.rehome(ctx, f.placement.Term().Rev, snap, obs, leaders, now)
	d := c.decider.Decide(pol, obs, now)
	c.observeDecision(obs, d)
	ctx, span := c.traceDecision(ctx, obs, d)
	err = c.apply(ctx, f, obs, d)
	telemetry.EndSpan(span, err)
	if err != nil {
		c.met.Error()
		return d, err
	}
	c.record(ctx, f, d)
	return d, nil
}

// The leader lock's timing: renewed every renewEvery; a renewal begun at t lets the leader act
// until t+leaseFor, a margin before the lock can expire at the server (its TTL counts from when
// the server stored the renewal, after t). An attempt may run until the lease would end: behind a
// full link a renewal can take seconds, and one cut short is sent again only by the next.
const (
	renewEvery = time.Second
	leaseFor   = store.LeaderTTL - renewEvery
)

// fences are one term's fences: of the placement, the assignments and the decisions.
type fences struct {
	placement, assign, decisions *store.Fence
}

func (c *Controller) newFences(term store.Term) *fences {
	return &fences{
		placement: store.NewKVFence(c.js, wire.PlacementBucket, term),
		assign:    store.NewKVFence(c.js, wire.AssignBucket, term),
		decisions: store.NewStreamFence(c.js, wire.DecisionsStream, wire.DecisionsFence, term),
	}
}

// claim claims every fence not claimed yet.
func (f *fences) claim(ctx context.Context) error {
	for _, x := range []*store.Fence{f.placement, f.assign, f.decisions} {
		if _, err := x.Claim(ctx); err != nil {
			return err
		}
	}
	return nil
}

// campaign reports whether this controller leads: it holds the lock and its lease has not run
// out, or it takes the lock now.
func (c *Controller) campaign(ctx context.Context) bool {
	c.mu.Lock()
	rev, until, f := c.leaderRev, c.leaseUntil, c.fences
	c.mu.Unlock()
	if rev != 0 {
		if c.now().Before(until) {
			return true
		}
		if !c.lapse(f, until) {
			return true // a renewal extended the lease meanwhile
		}
	}
	t0 := c.now()
	kv := c.buckets.Leader
	nrev, err := kv.Create(ctx, leaderKey, []byte(c.id))
	if errors.Is(err, jetstream.ErrKeyExists) {
		nrev, err = c.takeBack(ctx)
	}
	if err != nil {
		return false
	}
	// The term: this revision, in this lock bucket's lifetime (a recreated bucket counts anew).
	st, err := c.js.Stream(ctx, "KV_"+wire.LeaderBucket)
	if err != nil {
		_ = kv.Delete(ctx, leaderKey, jetstream.LastRevision(nrev))
		return false
	}
	term := store.Term{Epoch: st.CachedInfo().Created.UnixNano(), Rev: nrev, Leader: c.id}
	// The lease is shorter than the lock's TTL as the bucket has it: an older fanin's may be
	// shorter than LeaderTTL.
	lease := leaseFor
	if ttl := st.CachedInfo().Config.MaxAge; ttl > 0 {
		lease = min(lease, max(ttl/2, ttl-renewEvery))
	}
	c.mu.Lock()
	c.leaderRev, c.term, c.lease, c.leaseUntil, c.fences = nrev, term, lease, t0.Add(lease), c.newFences(term)
	c.mu.Unlock()
	c.log.Info("became the autoscaler leader", "term", nrev)
	return true
}

// renewLoop renews the lock every renewEvery while this controller leads, until ctx ends.
func (c *Controller) renewLoop(ctx context.Context) {
	t := time.NewTicker(renewEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.renew(ctx)
		}
	}
}

// renew renews the lock, if this controller holds it. A renewal that succeeds extends the lease
// (leaseFor from when it began). One refused means the lock was lost (it expired, and maybe
// another took it), unless an earlier renewal that gave up waiting was stored after all
// (landed): this controller steps down. One that fails otherwise changes nothing: the lease runs
// out by itself.
func (c *Controller) renew(ctx context.Context) {
	c.mu.Lock()
	rev, f := c.leaderRev, c.fences
	c.mu.Unlock()
	if rev == 0 {
		return
	}
	if c.renewHook != nil {
		c.renewHook(ctx)
	}
	t0 := c.now()
	rctx, cancel := context.WithTimeout(ctx, c.renewFor(t0))
	nrev, err := c.buckets.Leader.Update(rctx, leaderKey, []byte(c.id), rev)
	cancel()
	switch {
	case err == nil:
		c.mu.Lock()
		if c.leaderRev == rev { // not stepped down meanwhile
			c.leaderRev, c.leaseUntil = nrev, t0.Add(c.lease)
		}
		c.mu.Unlock()
	case errors.Is(err, jetstream.ErrKeyExists) || store.Refused(err):
		if c.landed(ctx, rev) {
			return
		}
		c.stepDown(f, "the lock expired", err)
	case ctx.Err() == nil:
		c.log.Warn("cannot renew the leader lock", "err", err)
	}
}

// renewFor is how long a renewal begun at now may wait: until the lease ends, and renewEvery at
// least.
func (c *Controller) renewFor(now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(renewEvery, c.leaseUntil.Sub(now))
}

// landed reports whether a renewal of this controller's that gave up waiting was stored after
// all: the lock, at a revision after rev, still names this controller (no other can write that,
// and this one takes the lock anew only once it has stepped down). The next renewal then renews
// from that revision. The lease stays where the last renewal known to have succeeded put it,
// which is before the lock's expiry counted from the landed one.
func (c *Controller) landed(ctx context.Context, rev uint64) bool {
	gctx, cancel := context.WithTimeout(ctx, c.renewFor(c.now()))
	e, err := c.buckets.Leader.Get(gctx, leaderKey)
	cancel()
	if err != nil || string(e.Value()) != c.id || e.Revision() <= rev {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leaderRev != rev { // stepped down meanwhile
		return false
	}
	c.leaderRev = e.Revision()
	c.log.Info("a renewal of the leader lock that gave up waiting was stored after all", "revision", e.Revision())
	return true
}

// lapse steps down from the term of f because its lease, which ran until until, is over; unless
// a renewal extended the lease since (it reports false then).
func (c *Controller) lapse(f *fences, until time.Time) bool {
	c.mu.Lock()
	renewed := c.fences == f && c.leaseUntil.After(until)
	c.mu.Unlock()
	if renewed {
		return false
	}
	c.stepDown(f, "the lock was not renewed in time", nil)
	return true
}

// takeBack takes the lock for a new term when it still names this controller, which no longer
// leads: a renewal stored after the lease ran out (behind a full link). Without it, nobody could
// take the lock until it expired, a whole TTL without a leader. The update is refused if the
// lock moved on meanwhile.
func (c *Controller) takeBack(ctx context.Context) (uint64, error) {
	e, err := c.buckets.Leader.Get(ctx, leaderKey)
	if err != nil {
		return 0, err
	}
	if string(e.Value()) != c.id {
		return 0, jetstream.ErrKeyExists
	}
	return c.buckets.Leader.Update(ctx, leaderKey, []byte(c.id), e.Revision())
}

// stepDown ends the leadership of the term of f, saying why, unless it has ended already.
func (c *Controller) stepDown(f *fences, why string, err error) {
	c.mu.Lock()
	if f == nil || c.fences != f {
		c.mu.Unlock()
		return
	}
	c.leaderRev, c.term, c.leaseUntil, c.fences = 0, store.Term{}, time.Time{}, nil
	c.mu.Unlock()
	args := []any{"term", f.placement.Term().Rev}
	if err != nil {
		args = append(args, "err", err)
	}
	c.log.Warn("lost the autoscaler leadership: "+why, args...)
}

// leading reports whether this controller holds the lock and its lease has not run out.
func (c *Controller) leading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leaderRev != 0 && c.now().Before(c.leaseUntil)
}

// currentFences are the fences of the term this controller leads in, nil when it does not.
func (c *Controller) currentFences() *fences {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leaderRev == 0 || !c.now().Before(c.leaseUntil) {
		return nil
	}
	return c.fences
}

// assignWriter is the fenced writer of the elastic workers' assignments while this controller
// leads and has claimed the fence; nil otherwise.
func (c *Controller) assignWriter() members.Writer {
	f := c.currentFences()
	if f == nil || f.assign.Claimed() == 0 {
		return nil
	}
	return f.assign
}

// IsLeader reports whether this controller holds the lock and its lease has not run out.
func (c *Controller) IsLeader() bool { return c.leading() }

func (c *Controller) resign() {
	c.mu.Lock()
	rev := c.leaderRev
	c.leaderRev, c.fences = 0, nil
	c.mu.Unlock()
	if rev != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = c.buckets.Leader.Delete(ctx, leaderKey, jetstream.LastRevision(rev))
		cancel()
	}
}

// registryHealthy tells whether the runtime registry's stream answers and has a leader. While it
// does not (a server restarts, the node leading it was lost), no heartbeat can be written, and a
// runtime whose heartbeat lapsed is not known to be dead: the driver still reports the processes
// or pods that die.
func (c *Controller) registryHealthy(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := c.js.Stream(ctx, "KV_"+wire.RuntimesBucket)
	if err != nil {
		return false
	}
	cl := st.CachedInfo().Cluster
	return cl == nil || cl.Leader != ""
}

// deadFor is how long a runtime the driver reported dead stays dead to the controller: a heartbeat
// it sent before it died can come late, within the registry's TTL.
const deadFor = 2 * store.RuntimeTTL

// observe builds the decider's inputs from a snapshot of the view, through the controller's own
// rules: paused jobs are left out (their placement is removed); so are the registration of a
// runtime the driver reported dead, written before it did or until deadFor after, and its load
// reports received before. A runtime whose heartbeat lapsed is dead only once the registry has
// been writable (for writable; negative: it is not) for that runtime's whole lapse: until then its
// heartbeats may have had nowhere to go; and its age counts from the newest heartbeat the view
// has of any runtime, up to maxViewLag (below). c.mu is held.
func (c *Controller) observe(snap view.Snapshot, now time.Time, writable time.Duration) Observations {
	var obs Observations
	runtimes, loads := c.notDead(snap.Runtimes, snap.Loads)
	live := map[string]bool{}
	var rates []float64
	// The view's own lag: the age of the newest heartbeat of any runtime, less a period. Its watch
	// of the registry rides the NATS routes too, and behind a full link no heartbeat at all reached
	// it for seconds: every runtime looked that much older than it was. The lag is taken off every
	// runtime's age, up to maxViewLag: were all the runtimes dead at once, they would be found dead
	// that much later (the driver reports the deaths it sees at once).
	var newest time.Time
	for _, rt := range runtimes {
		if rt.Beat.After(newest) {
			newest = rt.Beat
		}
	}
	lag := min(maxViewLag, max(0, now.Sub(newest)-store.RuntimeHeartbeat))
	for id, rt := range runtimes {
		// Once dead, a runtime stays so until it is heard again: the lag and the registry's
		// health can change without any news of it.
		at, was := c.lapsed[id]
		lapsed := was && !rt.Beat.After(at) || writable >= store.Lapse(rt.Lapse) && !rt.Alive(now.Add(-lag))
		c.sayLapse(id, rt, now, newest, lapsed)
		if lapsed {
			continue
		}
		live[id] = true
		if l, ok := loads[id]; ok && l.NanosPerByte > 0 {
			rates = append(rates, l.NanosPerByte)
		}
	}
	for id := range c.lapsed {
		if _, ok := runtimes[id]; !ok {
			delete(c.lapsed, id) // deregistered, or forgotten by the view
		}
	}
	median := 0.0
	if len(rates) > 0 {
		sort.Float64s(rates)
		median = rates[len(rates)/2]
	}
	for id := range live {
		// Its cores: from its load reports, or, before the first, from its registration.
		ro := RuntimeObs{ID: id, Cores: max(1, runtimes[id].Cores), Draining: c.draining[id], Unreported: true}
		if l, ok := loads[id]; ok {
			ro.Unreported = false
			ro.Cores = max(1, l.Cores)
			ro.Node, ro.Server, ro.NIC = l.Node, l.Server, l.NICBytesPerSec
			if l.NanosPerByte > 0 && median > 0 {
				ro.Speed = median / l.NanosPerByte
			}
		}
		ro.Since = runtimes[id].Registered // when it started, not its last heartbeat
		obs.Runtimes = append(obs.Runtimes, ro)
	}
	slices.SortFunc(obs.Runtimes, func(a, b RuntimeObs) int { return strings.Compare(a.ID, b.ID) })

	// A shard that just moved is in its old owner's last report and its new owner's: the report
	// of the runtime it is placed on wins, else the one of the later step (not the order of a
	// map's iteration).
	shardLoad, owned := map[string]wire.ShardLoad{}, map[string]bool{}
	for id, l := range loads {
		for _, s := range l.Shards {
			// A shard costs its runtime's process more than its kernels' time: plan what it costs.
			if l.Overhead > 1 {
				s.Work *= l.Overhead
			}
			own := snap.Placement[s.Key].Runtime == id
			prev, seen := shardLoad[s.Key]
			if !seen || own && !owned[s.Key] || own == owned[s.Key] && s.Step > prev.Step {
				shardLoad[s.Key], owned[s.Key] = s, own
			}
		}
	}
	ids := make([]string, 0, len(snap.Jobs))
	for id, rec := range snap.Jobs {
		if !rec.Paused { // placed nowhere: its placement is removed, and its shards stop
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		rec := snap.Jobs[id]
		for _, sh := range rec.Layout.Shards {
			key := wire.PlacementKey(id, sh.ID)
			so := ShardObs{Key: key, Job: id, Bytes: int64(rec.Spec.Ranks) * int64(sh.Bytes()), Priority: rec.Spec.PriorityClass()}
			if p, ok := snap.Placement[key]; ok && live[p.Runtime] {
				so.Runtime = p.Runtime
			}
			if l, ok := shardLoad[key]; ok {
				so.Work, so.Period, so.Phase, so.Burst = l.Work, l.Period, l.Phase, l.Burst
				so.QueueWait, so.Pending = l.QueueWait, int(l.Pending)
				// Out of the node: the parameters go to every rank's worker.
				so.BytesIn, so.BytesOut = l.BytesInPerSec, l.BytesOutPerSec*float64(rec.Spec.Ranks)
			}
			if so.Work == 0 {
				so.Work = float64(so.Bytes) / estimatedBytesPerCoreSecond
			}
			obs.Shards = append(obs.Shards, so)
		}
	}
	return obs
}

// leaderRefresh is how long the controller trusts the leader it was told of a job's parameter
// stream, and leaderBudget how long one decision may spend asking.
const (
	leaderRefresh = 10 * time.Second
	leaderBudget  = time.Second
)

// streamLeaders returns, by stream name, the NATS server leading each job's parameter stream (for
// placement's preference among equal runtimes) and, for a job with several gradient streams, each
// of those (placement puts a shard on a runtime connected to its stream's leader: see
// ShardObs.GradLeader). Each is asked of JetStream at most every leaderRefresh and for at most
// leaderBudget per decision; nil while no runtime reports its server (nothing to match).
func (c *Controller) streamLeaders(ctx context.Context, snap view.Snapshot, now time.Time) map[string]string {
	servers := false
	for _, l := range snap.Loads {
		servers = servers || l.Server != ""
	}
	if !servers {
		return nil
	}
	for name, l := range c.leaders {
		if _, ok := snap.Jobs[l.job]; !ok {
			delete(c.leaders, name)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, leaderBudget)
	defer cancel()
	out := make(map[string]string, len(snap.Jobs))
	for _, id := range sortedKeys(snap.Jobs) {
		rec := snap.Jobs[id]
		names := []string{wire.ParamsStream(id)}
		if n := rec.Spec.GradStreams(); n > 1 {
			for g := range n {
				names = append(names, wire.GradGroupStream(id, g))
			}
		}
		for _, name := range names {
			l, ok := c.leaders[name]
			if (!ok || now.Sub(l.at) >= leaderRefresh) && ctx.Err() == nil {
				// An answer is kept for leaderRefresh: the leader, or none (no such stream, or a
				// server outside a cluster). A failed question (a timeout under load) is asked
				// again at the next decision, and what was known before stands meanwhile: kept as
				// "no leader" for 10 s, it placed a shard away from its stream's server.
				st, err := c.js.Stream(ctx, name)
				switch {
				case err == nil:
					info := st.CachedInfo()
					l = streamLeader{job: id, at: now, replicas: info.Config.Replicas}
					if cl := info.Cluster; cl != nil {
						l.server, l.moving = cl.Leader, 1+len(cl.Replicas) > max(1, l.replicas)
					}
					if p := info.Config.Placement; p != nil && p.Cluster == "" && len(p.Tags) == 1 && strings.HasPrefix(p.Tags[0], wire.NodeTag("")) {
						l.tag = p.Tags[0]
					}
					c.leaders[name] = l
				case errors.Is(err, jetstream.ErrStreamNotFound):
					l = streamLeader{job: id, at: now}
					c.leaders[name] = l
				}
			}
			out[name] = l.server
		}
	}
	return out
}

// maxViewLag is the most of the view's lag that observe takes off the runtimes' ages.
const maxViewLag = store.MaxRuntimeLapse - store.RuntimeLapse

// sayLapse logs when runtime id's heartbeats lapse (with the age of the newest heartbeat of any
// runtime: a view that lags makes them all old), and when a runtime taken for dead is heard again:
// its heartbeats were late, not missing (a full link, an overloaded NATS server), and its shards
// moved for nothing. c.mu is held.
func (c *Controller) sayLapse(id string, rt view.Runtime, now, newest time.Time, lapsed bool) {
	if c.lapsed == nil {
		c.lapsed = map[string]time.Time{}
	}
	_, was := c.lapsed[id]
	if lapsed {
		c.lapsed[id] = rt.Beat
	} else {
		delete(c.lapsed, id)
	}
	if was == lapsed || c.log == nil {
		return
	}
	if lapsed {
		c.log.Info("a runtime's heartbeats lapsed: taking it for dead", "runtime", id,
			"last_heartbeat", now.Sub(rt.Beat).Round(time.Millisecond), "lapse", store.Lapse(rt.Lapse),
			"newest_of_any", now.Sub(newest).Round(time.Millisecond))
		return
	}
	c.log.Warn("a runtime taken for dead is heard again: its heartbeats were late", "runtime", id,
		"lapse", store.Lapse(rt.Lapse))
}

// notDead removes from a snapshot's runtimes and loads what they hold of runtimes the driver
// reported dead, by observe's rule. c.mu is held.
func (c *Controller) notDead(runtimes map[string]view.Runtime, loads map[string]view.Load) (map[string]view.Runtime, map[string]view.Load) {
	if len(c.dead) == 0 {
		return runtimes, loads
	}
	for id, at := range c.dead {
		if rt, ok := runtimes[id]; ok && rt.Beat.Before(at.Add(deadFor)) {
			delete(runtimes, id)
		}
		if l, ok := loads[id]; ok && !l.Received.After(at) {
			delete(loads, id)
		}
	}
	return runtimes, loads
}

// estimatedBytesPerCoreSecond prices a shard's step before it has been measured.
const estimatedBytesPerCoreSecond = 2e9

// apply carries a decision out: placement first (fenced by the term of f, epoch+1, naming the
// previous owner so that it releases the shard first), then drained runtimes that are empty are
// stopped, then the pool is grown to the size wanted. A write refused by the fence ends it: the
// next Step finds out whether this controller was deposed.
func (c *Controller) apply(ctx context.Context, f *fences, obs Observations, d Decision) error {
	var errs []error
	term := f.placement.Term()
	current := c.view.Placement()
	owner := map[string]string{}
	for _, s := range obs.Shards {
		owner[s.Key] = s.Runtime
	}
	for key := range current { // placement of deleted or paused jobs: release the shards
		if _, ok := owner[key]; !ok {
			// Purge, not Delete: the bucket keeps a few revisions per key, which a deleted job
			// would otherwise leave behind for good.
			if err := f.placement.Purge(ctx, key); errors.Is(err, store.ErrFenced) {
				return err
			} else if err != nil {
				c.log.Debug("delete placement", "key", key, "err", err)
			}
		}
	}
	keys := make([]string, 0, len(d.Placement))
	for k := range d.Placement {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		target := d.Placement[key]
		if target == "" || owner[key] == target {
			continue
		}
		old, exists := current[key]
		if exists && old.Runtime == target {
			continue // written already; the watch has not caught up with the runtime yet
		}
		p := wire.Placement{Runtime: target, Epoch: old.Epoch + 1, From: old.Runtime, Term: term.Rev}
		val, _ := json.Marshal(p)
		// No compare-and-set on the key's revision: the fence makes this term the only writer,
		// and the view held every earlier write before the first decision of the term (Step).
		rev, err := f.placement.Put(ctx, key, val)
		if errors.Is(err, store.ErrFenced) {
			return fmt.Errorf("place %s on %s: %w", key, target, err)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("place %s on %s: %w", key, target, err))
			continue
		}
		// Remember the write at once: the next decision may come before the watch delivers it,
		// and would otherwise write the same key again from a stale revision.
		c.view.Remember(key, p, rev)
	}
	placement := c.view.Placement() // with the writes above
	c.mu.Lock()
	for _, id := range d.Drain {
		c.draining[id] = true
	}
	var empty []string
	for id := range c.draining {
		busy := false
		for _, p := range placement {
			if p.Runtime == id {
				busy = true
				break
			}
		}
		for _, r := range d.Placement {
			if r == id {
				busy = true
				break
			}
		}
		if !busy {
			empty = append(empty, id)
		}
	}
	c.mu.Unlock()
	if !c.leading() { // the lease ran out while writing: no runtime is started or stopped
		return errors.Join(append(errs, ErrNotLeader)...)
	}
	sort.Strings(empty)
	stopped := map[string]bool{}
	for _, id := range empty {
		if c.owns(id) {
			if c.driver != nil {
				if err := c.driver.Remove(ctx, id); err != nil {
					errs = append(errs, fmt.Errorf("remove %s: %w", id, err))
					continue
				}
			}
		} else {
			if err := c.stopRuntime(ctx, term, id); err != nil {
				errs = append(errs, fmt.Errorf("stop %s: %w", id, err))
				continue
			}
			stopped[id] = true
		}
		c.mu.Lock()
		delete(c.draining, id)
		c.mu.Unlock()
	}
	// Scale after removing: the driver counts the runtimes it has not been asked to remove, and
	// the runtimes of the pool it does not own (adopted) count as well.
	if c.driver != nil {
		adopted := 0
		for _, rt := range obs.Runtimes {
			if !c.owns(rt.ID) && !stopped[rt.ID] {
				adopted++
			}
		}
		if err := c.driver.Scale(ctx, max(0, d.Desired-adopted)); err != nil {
			errs = append(errs, fmt.Errorf("scale to %d (%d adopted): %w", d.Desired, adopted, err))
		}
	}
	return errors.Join(errs...)
}

// owns reports whether the pool driver runs runtime id (see ownerDriver).
func (c *Controller) owns(id string) bool {
	o, ok := c.driver.(ownerDriver)
	return !ok || o.Owns(id)
}

// stopTimeout bounds a stop request.
const stopTimeout = 2 * time.Second

// stopRuntime asks runtime id, which the driver does not own, to stop (wire.RuntimeStopSubject);
// one that does not answer is gone already. A runtime that stops is dead to the controller from
// now on, as if its driver had seen it die (it deregisters as it exits).
func (c *Controller) stopRuntime(ctx context.Context, term store.Term, id string) error {
	m := nats.NewMsg(wire.RuntimeStopSubject(id))
	t, _ := json.Marshal(term)
	m.Header.Set(store.HdrTerm, string(t))
	ctx, cancel := context.WithTimeout(ctx, stopTimeout)
	defer cancel()
	resp, err := c.nc.RequestMsgWithContext(ctx, m)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
	case err != nil:
		return err
	case string(resp.Data) != wire.RuntimeStopping:
		return fmt.Errorf("refused: %s", resp.Data)
	default:
		c.log.Info("stopped a runtime another driver started", "runtime", id)
	}
	c.mu.Lock()
	c.dead[id] = c.now()
	c.mu.Unlock()
	return nil
}

// record keeps the decision for the API and publishes it (fenced by the term of f) when it changed
// anything.
func (c *Controller) record(ctx context.Context, f *fences, d Decision) {
	c.mu.Lock()
	var prev *Decision
	if n := len(c.recent); n > 0 {
		prev = &c.recent[n-1]
	}
	changed := prev == nil || len(d.Moves) > 0 || len(d.Drain) > 0 || d.Desired != prev.Desired || d.Mode != prev.Mode
	if changed {
		c.recent = append(c.recent, d)
		if len(c.recent) > maxRecent {
			c.recent = c.recent[len(c.recent)-maxRecent:]
		}
	}
	c.mu.Unlock()
	if changed {
		data, _ := json.Marshal(d)
		if _, err := f.decisions.Publish(ctx, wire.DecisionsSubject, data); err != nil {
			c.log.Warn("publish the decision", "err", err)
		}
		c.log.Info("decision", "desired", d.Desired, "mode", d.Mode, "moves", len(d.Moves), "drain", d.Drain,
			"demand", strconv.FormatFloat(d.Demand, 'f', 2, 64), "reasons", strings.Join(d.Reasons, "; "))
	}
}

// Recent returns the latest decisions that changed something, oldest first.
func (c *Controller) Recent() []Decision {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.recent)
}

// Vanished tells the controller that a runtime process died: the next decision, taken at once,
// counts it dead and places its shards elsewhere, and its registration is removed, without waiting
// for its heartbeat to lapse.
func (c *Controller) Vanished(id string) {
	c.mu.Lock()
	c.vanished = append(c.vanished, id)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Controller) deregisterVanished(ctx context.Context) {
	c.mu.Lock()
	ids := c.vanished
	c.vanished = nil
	now := c.now()
	for _, id := range ids {
		c.dead[id] = now
	}
	for id, at := range c.dead { // a late heartbeat of a dead runtime comes within its TTL
		if now.Sub(at) <= deadFor {
			continue
		}
		// Forgotten once the view holds nothing of it that observe leaves out: its registration
		// and reports from before it died are deleted (an expired key is never deleted).
		if rt, ok := c.view.Runtime(id); ok && rt.Beat.Before(at.Add(deadFor)) {
			continue
		}
		if l, ok := c.view.Load(id); ok && !l.Received.After(at) {
			continue
		}
		delete(c.dead, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		if err := c.buckets.Runtimes.Delete(ctx, id); err != nil {
			c.log.Warn("deregister a vanished runtime", "runtime", id, "err", err)
		}
	}
}

// PolicyKey is the key of the policy in the policy bucket.
const PolicyKey = "policy"

func (c *Controller) onPolicy(e jetstream.KeyValueEntry) {
	if e.Key() != PolicyKey || e.Operation() != jetstream.KeyValuePut {
		return
	}
	p, err := ParsePolicy(e.Value())
	if err != nil {
		c.log.Error("stored policy is invalid; keeping the current one", "err", err)
		return
	}
	c.mu.Lock()
	c.policy = p
	c.mu.Unlock()
	c.log.Info("policy updated", "revision", e.Revision())
}

// Policy returns the policy in force.
func (c *Controller) Policy() Policy {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.policy
}
