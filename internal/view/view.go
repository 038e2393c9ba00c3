package view

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/rate"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// FreshLoad is how old a load report may be and still count as its runtime's current word: the
// liveness lapse, since a live runtime reports every second.
const FreshLoad = store.RuntimeLapse

// forgetShard is how long a shard's track is kept after its last report.
const forgetShard = time.Minute

// ForgetRuntime is how long the view keeps a registration after its last heartbeat. The bucket
// drops it after store.RuntimeTTL, but its watch is not told, so without this a runtime killed
// before it could deregister stayed in every view for good (ids are never reused: one more each
// crash). It is long past the TTL because the autoscaler counts expired registrations while the
// registry cannot take heartbeats (a NATS restart, an election), and short enough that a crashed
// runtime leaves the dashboard within minutes.
const ForgetRuntime = 10 * time.Minute

// Runtime is a runtime's registration.
type Runtime struct {
	wire.RuntimeInfo
	// Beat is when the registration was last written, as the NATS server stamped its entry: the
	// runtime's last heartbeat. The liveness rule uses it, not RuntimeInfo.Beat (the runtime's
	// own clock).
	Beat time.Time
	// Registered is when the runtime started, on the NATS server's clock: the entry's time (Beat)
	// less the runtime's uptime as it wrote it (RuntimeInfo.Beat − RuntimeInfo.Started, two
	// readings of its own clock, so a skew between the runtime's clock and the server's cancels).
	// A registration without Started (a runtime from before it was written) counts from the first
	// of its writes the view saw. The autoscaler reads it as the runtime's age; Beat is only its
	// last heartbeat.
	Registered time.Time
}

// Alive applies the one liveness rule (store.RuntimeAlive) at now, with the lapse the runtime
// asked for.
func (r Runtime) Alive(now time.Time) bool { return store.RuntimeAlive(r.Beat, r.Lapse, now) }

// Expired reports whether the bucket has dropped the registration at now by its TTL
// (store.RuntimeTTL). The watch is not told when a key expires, so the view keeps it until
// ForgetRuntime: the autoscaler still counts such a runtime while the registry cannot take
// heartbeats.
func (r Runtime) Expired(now time.Time) bool { return now.Sub(r.Beat) >= store.RuntimeTTL }

// Placed is a shard's placement entry and its revision in the bucket.
type Placed struct {
	wire.Placement
	Revision uint64
}

// Load is a runtime's latest load report.
type Load struct {
	wire.LoadReport
	Received time.Time // by the view's clock
}

// Shard is what the latest load report that named a shard says about it.
type Shard struct {
	wire.ShardLoad
	Runtime  string    // the runtime that sent that report
	Received time.Time // when
	Fresh    bool      // received less than FreshLoad ago
	Rate     float64   // steps/s by the rule of JobRate; 0 unless Fresh
}

// Snapshot is the whole view at one moment. Its maps are copies, the caller's to keep.
type Snapshot struct {
	Now       time.Time             // the view's clock when it was taken
	Jobs      map[string]job.Record // every job; a paused one has Record.Paused set
	Placement map[string]Placed     // <job>.<shard> -> its entry
	Runtimes  map[string]Runtime    // registrations, dead ones included: see Runtime.Alive
	Loads     map[string]Load       // runtime -> its latest report, until its registration is deleted
	// Assignments are the elastic workers' assignments by job (wire.AssignBucket), as the
	// autoscaler leader last wrote them; a job none of whose elastic workers ever beat has none.
	// Their slices are shared with the view, which never writes into them: read, don't modify.
	Assignments map[string]wire.Assignment
}

// View follows the jobs, placement, runtimes and assignment buckets (store.Follow: the watches
// heal) and the runtimes' load reports (wire.LoadWildcard), from Open until Close. Its methods are safe for
// concurrent use and return copies.
type View struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	buckets *store.Buckets
	log     *slog.Logger
	now     func() time.Time

	cancel    context.CancelFunc // ends the watches and the load reader
	wg        sync.WaitGroup     // the watches' goroutines and the load reader
	sub       *nats.Subscription // load reports, into the load reader's channel
	closeOnce sync.Once

	mu        sync.Mutex // guards everything below
	jobs      map[string]job.Record
	placement map[string]Placed
	runtimes  map[string]Runtime
	loads     map[string]Load
	assigns   map[string]wire.Assignment // job -> its elastic workers' assignment
	shards    map[string]*track          // <job>.<shard> -> its latest report and recent steps
	pruned    time.Time                  // when shards and runtimes were last pruned
	// seen is, per bucket followed, the newest revision delivered (its fence key's included);
	// advanced is closed and replaced whenever one grows.
	seen     map[string]uint64
	advanced chan struct{}
}

// track is a shard's latest load, who reported it and when, and its recent steps.
type track struct {
	load    wire.ShardLoad
	runtime string
	at      time.Time
	steps   rate.Steps
}

// Option configures a View.
type Option func(*View) error

// WithClock sets the view's clock (default time.Now): when load reports are received, and what
// "now" is for freshness and liveness.
func WithClock(now func() time.Time) Option {
	return func(v *View) error { v.now = now; return nil }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(v *View) error { v.log = l; return nil } }

// WithBuckets uses buckets its caller has opened already (default: Open opens them).
func WithBuckets(b *store.Buckets) Option { return func(v *View) error { v.buckets = b; return nil } }

// Open follows fanin's shared state over nc and returns once the view holds the current values of
// every bucket: whoever decides on it decides on the whole state, never on part of it. ctx bounds
// the setup only (opening the buckets, the initial values); the view runs until Close. Options:
// WithClock, WithLogger, WithBuckets.
func Open(ctx context.Context, nc *nats.Conn, opts ...Option) (_ *View, err error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	v := &View{nc: nc, js: js, log: slog.Default(), now: time.Now,
		jobs: map[string]job.Record{}, placement: map[string]Placed{}, runtimes: map[string]Runtime{},
		loads: map[string]Load{}, assigns: map[string]wire.Assignment{}, shards: map[string]*track{},
		seen: map[string]uint64{}, advanced: make(chan struct{})}
	for _, o := range opts {
		if err := o(v); err != nil {
			return nil, err
		}
	}
	if v.buckets == nil {
		if v.buckets, err = store.OpenBuckets(ctx, js); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	life, cancel := context.WithCancel(context.Background())
	v.cancel = cancel
	defer func() {
		if err != nil {
			v.Close()
		}
	}()

	// The reports come through a channel read by a goroutine of the view's own, so that Close can
	// stop and wait for it (a callback would run on nats.go's goroutine). A full channel drops
	// reports (nats.go counts a slow consumer); the next second's replace them.
	reports := make(chan *nats.Msg, 4096)
	if v.sub, err = nc.ChanSubscribe(wire.LoadWildcard, reports); err != nil {
		return nil, fmt.Errorf("subscribe to load reports: %w", err)
	}
	v.wg.Go(func() {
		for {
			select {
			case <-life.Done():
				return
			case m := <-reports:
				v.onLoad(m)
			}
		}
	})

	var readies []<-chan struct{}
	for _, w := range []struct {
		kv jetstream.KeyValue
		fn func(jetstream.KeyValueEntry)
	}{{v.buckets.Jobs, v.onJob}, {v.buckets.Placement, v.onPlacement}, {v.buckets.Runtimes, v.onRuntime},
		{v.buckets.Assign, v.onAssign}} {
		if w.kv == nil {
			continue // buckets a caller opened without store.OpenBuckets
		}
		ready, err := store.Follow(life, js, w.kv, ">", &v.wg, w.fn)
		if err != nil {
			return nil, err
		}
		readies = append(readies, ready)
	}
	for _, ready := range readies {
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the shared state's current values: %w", ctx.Err())
		}
	}
	return v, nil
}

// Close stops following and waits for the view's goroutines. The view keeps answering with the
// last state it had.
func (v *View) Close() {
	v.closeOnce.Do(func() {
		if v.sub != nil {
			_ = v.sub.Unsubscribe()
		}
		v.cancel()
		v.wg.Wait()
	})
}

// Now is the view's clock.
func (v *View) Now() time.Time { return v.now() }

// Snapshot returns the whole view, taken at once.
func (v *View) Snapshot() Snapshot {
	v.mu.Lock()
	defer v.mu.Unlock()
	return Snapshot{Now: v.now(), Jobs: maps.Clone(v.jobs), Placement: maps.Clone(v.placement),
		Runtimes: maps.Clone(v.runtimes), Loads: maps.Clone(v.loads), Assignments: maps.Clone(v.assigns)}
}

// Assignment returns a job's elastic workers' assignment as the autoscaler leader last wrote it
// (a copy); false if it has none: none of its elastic workers ever beat, or it was deleted.
func (v *View) Assignment(id string) (wire.Assignment, bool) {
	v.mu.Lock()
	a, ok := v.assigns[id]
	v.mu.Unlock()
	if !ok {
		return a, false
	}
	a.Workers = slices.Clone(a.Workers)
	for i := range a.Workers {
		a.Workers[i].Ranks = slices.Clone(a.Workers[i].Ranks)
	}
	a.Unassigned = slices.Clone(a.Unassigned)
	return a, true
}

// Jobs returns every job's record (a copy).
func (v *View) Jobs() map[string]job.Record {
	v.mu.Lock()
	defer v.mu.Unlock()
	return maps.Clone(v.jobs)
}

// Job returns a job's record (a paused job's has Paused set).
func (v *View) Job(id string) (job.Record, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	rec, ok := v.jobs[id]
	return rec, ok
}

// Placement returns every placement entry.
func (v *View) Placement() map[string]Placed {
	v.mu.Lock()
	defer v.mu.Unlock()
	return maps.Clone(v.placement)
}

// JobPlacement returns the placement entries of one job's shards.
func (v *View) JobPlacement(jobID string) map[string]Placed {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := map[string]Placed{}
	for k, p := range v.placement {
		if rest, ok := strings.CutPrefix(k, jobID+"."); ok && !strings.Contains(rest, ".") {
			if _, ok := wire.ShardFromSubject(k); ok {
				out[k] = p
			}
		}
	}
	return out
}

// Remember records a placement entry its caller has just written at revision rev, before the
// watch delivers it: a decision taken meanwhile must not write the key again from the revision
// before. An entry is never replaced by an older revision of itself, whichever comes first.
func (v *View) Remember(key string, p wire.Placement, rev uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.remember(key, Placed{Placement: p, Revision: rev})
}

// remember keeps p unless a later revision of key is held already. v.mu is held.
func (v *View) remember(key string, p Placed) {
	if cur, ok := v.placement[key]; !ok || cur.Revision < p.Revision {
		v.placement[key] = p
	}
}

// Runtime returns a runtime's registration.
func (v *View) Runtime(id string) (Runtime, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	r, ok := v.runtimes[id]
	return r, ok
}

// Load returns a runtime's latest load report.
func (v *View) Load(runtime string) (Load, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	l, ok := v.loads[runtime]
	return l, ok
}

// Loads returns every runtime's latest load report.
func (v *View) Loads() map[string]Load {
	v.mu.Lock()
	defer v.mu.Unlock()
	return maps.Clone(v.loads)
}

// Shard returns what the latest report naming a shard (<job>.<shard>) said, received within the
// last minute.
func (v *View) Shard(key string) (Shard, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	t := v.shards[key]
	if t == nil {
		return Shard{}, false
	}
	s := Shard{ShardLoad: t.load, Runtime: t.runtime, Received: t.at, Fresh: v.now().Sub(t.at) < FreshLoad}
	if s.Fresh {
		s.Rate = t.rate()
	}
	return s, true
}

// JobRate is a job's training speed in steps/s, by fanin's one rule (the gateway's job status,
// `fanin jobs`, `fanin top` and the dashboard all show it): the slowest of its shards that a
// fresh report names (FreshLoad), 0 if none does. A shard's speed is its steps/s over
// rate.Window, from the step each of its load reports gave when the view received it; while that
// is not known yet (fewer than two reports, or over less than half a second) and the shard has
// gradients pending, it is one step per period (the report's Period). The dashboard used to
// sample each job's slowest step once a second instead; this is the gateway's rule, which it
// documents in the API.
func (v *View) JobRate(id string) float64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	rec, ok := v.jobs[id]
	if !ok {
		return 0
	}
	now := v.now()
	r := -1.0
	for _, sh := range rec.Layout.Shards {
		t := v.shards[wire.PlacementKey(id, sh.ID)]
		if t == nil || now.Sub(t.at) >= FreshLoad {
			continue
		}
		if x := t.rate(); r < 0 || x < r {
			r = x
		}
	}
	return max(r, 0)
}

// rate is the shard's steps/s (View.JobRate says how), fresh or not.
func (t *track) rate() float64 {
	r := t.steps.Rate()
	if r == 0 && t.load.Period > 0 && t.load.Pending > 0 {
		r = 1 / t.load.Period.Seconds()
	}
	return r
}

func (v *View) onJob(e jetstream.KeyValueEntry) {
	v.mu.Lock()
	defer v.mu.Unlock()
	defer v.see(e)
	if e.Operation() != jetstream.KeyValuePut {
		delete(v.jobs, e.Key())
		return
	}
	var rec job.Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		v.log.Warn("undecodable job record; keeping the last one", "job", e.Key(), "err", err)
		return
	}
	v.jobs[e.Key()] = rec
}

// Seen is the newest revision of bucket the view has taken in: it holds every change of the
// bucket up to it. Followed: the jobs, placement and assignment buckets.
func (v *View) Seen(bucket string) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.seen[bucket]
}

// WaitSeen waits until the view has taken in revision rev of bucket (Seen), or ctx ends. The
// autoscaler leader waits so for the claim of its fence: it then decides on everything the
// previous leader wrote; the gateway, for its own changes to the jobs bucket.
func (v *View) WaitSeen(ctx context.Context, bucket string, rev uint64) error {
	for {
		v.mu.Lock()
		seen, advanced := v.seen[bucket], v.advanced
		v.mu.Unlock()
		if seen >= rev {
			return nil
		}
		select {
		case <-advanced:
		case <-ctx.Done():
			return fmt.Errorf("wait for revision %d of %s (seen %d): %w", rev, bucket, seen, ctx.Err())
		}
	}
}

// see records that e was taken in. A re-sync's deletes (store.Watcher) carry no revision of the
// bucket's. v.mu is held.
func (v *View) see(e jetstream.KeyValueEntry) {
	if r := e.Revision(); r != math.MaxUint64 && r > v.seen[e.Bucket()] {
		v.seen[e.Bucket()] = r
		close(v.advanced)
		v.advanced = make(chan struct{})
	}
}

func (v *View) onAssign(e jetstream.KeyValueEntry) {
	if store.IsFence(e.Key()) {
		v.mu.Lock()
		v.see(e)
		v.mu.Unlock()
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		v.mu.Lock()
		delete(v.assigns, e.Key())
		v.see(e)
		v.mu.Unlock()
		return
	}
	var a wire.Assignment
	if err := json.Unmarshal(e.Value(), &a); err != nil {
		v.log.Warn("undecodable assignment; keeping the last one", "job", e.Key(), "err", err)
		return
	}
	v.mu.Lock()
	v.assigns[e.Key()] = a
	v.see(e)
	v.mu.Unlock()
}

func (v *View) onPlacement(e jetstream.KeyValueEntry) {
	v.mu.Lock()
	defer v.mu.Unlock()
	defer v.see(e)
	if store.IsFence(e.Key()) {
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		// A delete older than a write remembered meanwhile is not the last word on the key. (A
		// re-sync's deletes carry the highest revision.)
		if cur, ok := v.placement[e.Key()]; ok && cur.Revision < e.Revision() {
			delete(v.placement, e.Key())
		}
		return
	}
	var p wire.Placement
	if json.Unmarshal(e.Value(), &p) == nil {
		v.remember(e.Key(), Placed{Placement: p, Revision: e.Revision()})
	}
}

func (v *View) onRuntime(e jetstream.KeyValueEntry) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.prune(v.now())
	if e.Operation() != jetstream.KeyValuePut {
		delete(v.runtimes, e.Key())
		delete(v.loads, e.Key())
		return
	}
	r := Runtime{Beat: e.Created()}
	prev, seen := v.runtimes[e.Key()]
	if err := json.Unmarshal(e.Value(), &r.RuntimeInfo); err != nil {
		v.log.Warn("undecodable runtime registration; keeping what it said last", "runtime", e.Key(), "err", err)
		r.RuntimeInfo = prev.RuntimeInfo
		r.ID = e.Key()
	}
	r.Registered = registered(r, prev, seen)
	v.runtimes[e.Key()] = r
}

// registered is when the runtime of registration r started (Runtime.Registered says how); prev is
// the registration the view held before r, if seen.
func registered(r, prev Runtime, seen bool) time.Time {
	if up := r.RuntimeInfo.Beat.Sub(r.Started); !r.Started.IsZero() && !r.RuntimeInfo.Beat.IsZero() && up >= 0 {
		return r.Beat.Add(-up)
	}
	if seen && !prev.Registered.IsZero() && prev.Registered.Before(r.Beat) {
		return prev.Registered
	}
	return r.Beat
}

func (v *View) onLoad(m *nats.Msg) {
	var rep wire.LoadReport
	if json.Unmarshal(m.Data, &rep) != nil || rep.Runtime == "" {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	v.loads[rep.Runtime] = Load{LoadReport: rep, Received: now}
	for _, sl := range rep.Shards {
		t := v.shards[sl.Key]
		if t == nil {
			t = &track{}
			v.shards[sl.Key] = t
		}
		t.load, t.runtime, t.at = sl, rep.Runtime, now
		t.steps.Add(now, sl.Step)
	}
	v.prune(now)
}

// prune forgets, at most once a second, the shards no runtime has named for forgetShard and the
// registrations without a heartbeat for ForgetRuntime, with their load reports. It runs on the
// registrations' and the reports' arrivals (once a second each per live runtime). v.mu is held.
func (v *View) prune(now time.Time) {
	if now.Sub(v.pruned) < time.Second {
		return
	}
	v.pruned = now
	for k, t := range v.shards {
		if now.Sub(t.at) > forgetShard {
			delete(v.shards, k)
		}
	}
	for id, r := range v.runtimes {
		if now.Sub(r.Beat) > ForgetRuntime {
			delete(v.runtimes, id)
			delete(v.loads, id)
		}
	}
}
