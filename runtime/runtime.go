package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/fanin-ml/fanin/functions/wasmfn"
	"log/slog"
	goruntime "runtime"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// Runtime hosts shard executors. Create it with New, run it with Run.
type Runtime struct {
	id    string
	tally wire.RejectTally // this process's rejections by job, for exact counts (wire.HdrRejectCounts)
	// origin names this process in HdrRejectOrigin: the id and the start time, so that a runtime
	// restarted under the same id counts afresh under a new origin.
	origin string
	nc     *nats.Conn
	js     jetstream.JetStream
	log    *slog.Logger
	cores  int
	now    func() time.Time

	node string  // the node's label (WithNode); "" reports the NATS server's name
	nic  float64 // the node's bandwidth each way in bytes per second (WithNICBandwidth); 0 unknown

	metricsURL string // where this runtime's metrics are served; "" when nowhere
	// processCPU reads the CPU time its process has used (WithProcessCPU); nil: not measured.
	processCPU func() time.Duration

	heartbeat time.Duration
	beats     *beatMeter // the heartbeats in flight and their round trips (beat.go)
	// putBeat writes the registration; tests delay it, as a full link does.
	putBeat func(ctx context.Context, id string, info []byte) error
	// registered, if set, runs once Run has registered, before it watches the placement (tests).
	registered func(context.Context)
	sweep      time.Duration

	cpu     *cpuPool      // the cores, as tokens: bounds concurrent aggregation work (cpu.go)
	hurry   chan struct{} // asks for a load report now (reportSoon)
	buckets *store.Buckets
	acks    *acker
	purger  *purger
	rejects *rejectLog
	stats   Stats

	tracing *telemetry.Provider     // nil: tracing off
	metrics *metrics.Metrics        // nil: metrics off
	met     *metrics.RuntimeMetrics // this runtime's handle of metrics; nil when off

	fnLimits wasmfn.Limits // user functions' sandbox (WithFunctionLimits)
	userFns  userFuncs     // their engine and store, opened at first use (userfunc.go)

	mu     sync.Mutex // guards shards and jobs
	shards map[string]*shardExec
	jobs   map[string]*jobInfo // by incarnation
	// releasing holds, per shard key, the newest executor started here; one that is stopping is
	// waited for by the next executor of the same shard on this runtime.
	releasing map[string]*shardExec
	// retries counts, per shard key, the failed starts of a shard placed here; retryC takes the keys
	// whose placement the watch loop should look at again.
	retries map[string]int
	retryC  chan string
	seen    map[string]uint64 // per shard key, the revision of the placement entry last acted on
	wg      sync.WaitGroup    // the shard executors' goroutines
}

// jobInfo is what the shards of one job share on this runtime.
type jobInfo struct {
	rec    *job.Record
	grads  []jetstream.Stream // shard s's is grads[s mod len(grads)]: see gradStream
	params jetstream.Stream
	init   jetstream.Stream // init "upload" jobs: the uploaded initial parameters; nil otherwise
	refs   int
	// incarnation is the job's id and creation time: the key of r.jobs and of its rejection counts
	// (r.tally).
	incarnation string
	// inc is the incarnation in the message ids of its parameters and checkpoints
	// (wire.Incarnation).
	inc string
	// streams are the gradient streams, then the parameter stream, as this incarnation created
	// them (the parameter stream is the last): an executor
	// checks them (current) before it creates a consumer, purges, or retries a publish, so that
	// nothing it does lands in the streams of the job created again under the same id.
	streams []streamRef
	// homeMu guards homeKnown and homeTok: whether ckptHome decided where the job's checkpoints go
	// on this runtime's node, and the token of its node checkpoint stream ("" the parameter stream).
	homeMu    sync.Mutex
	homeKnown bool
	homeTok   string
}

// Option configures a Runtime.
type Option func(*Runtime) error

// WithID sets the runtime's id (default: "rt-" and a random suffix).
func WithID(id string) Option {
	return func(r *Runtime) error {
		if id == "" {
			return errors.New("runtime id must not be empty")
		}
		r.id = id
		return nil
	}
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(r *Runtime) error { r.log = l; return nil }
}

// WithCores sets how many shard invocations run at once and the capacity the runtime reports
// (default GOMAXPROCS).
func WithCores(n int) Option {
	return func(r *Runtime) error {
		if n < 1 {
			return fmt.Errorf("cores must be >= 1, got %d", n)
		}
		r.cores = n
		return nil
	}
}

// WithMetricsURL records, in the runtime's registration, the URL where its Prometheus metrics are
// served (see `fanin runtime --metrics`), so that service discovery finds it.
func WithMetricsURL(u string) Option {
	return func(r *Runtime) error { r.metricsURL = u; return nil }
}

// WithProcessCPU gives the runtime a reading of its process's CPU time (user and system), for a
// runtime that has its process to itself (fanin runtime): its load reports then say how much CPU
// the process spends per second of its shards' work (wire.LoadReport.Overhead), which the
// autoscaler plans. A runtime sharing its process with others (fanin dev, tests) must not: their
// CPU would count as its own.
func WithProcessCPU(read func() time.Duration) Option {
	return func(r *Runtime) error { r.processCPU = read; return nil }
}

// New returns a runtime that talks to NATS over nc. Options: WithID, WithLogger, WithCores,
// WithTracing, WithMetrics.
func New(nc *nats.Conn, opts ...Option) (*Runtime, error) {
	// Without a timeout, an acknowledgement lost in a reconnect would leave its future (and the
	// buffer it holds) waiting forever; a timeout turns it into a retry, which the message id
	// makes safe.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(ackAttemptMax))
	if err != nil {
		return nil, err
	}
	r := &Runtime{
		id:        "rt-" + uuid.NewString()[:8],
		nc:        nc,
		js:        js,
		log:       slog.Default(),
		cores:     goruntime.GOMAXPROCS(0),
		now:       time.Now,
		heartbeat: store.RuntimeHeartbeat,
		beats:     newBeatMeter(),
		sweep:     2 * time.Second,
		shards:    make(map[string]*shardExec),
		releasing: make(map[string]*shardExec),
		retries:   make(map[string]int),
		seen:      make(map[string]uint64),
		retryC:    make(chan string),
		jobs:      make(map[string]*jobInfo),
		tracing:   telemetry.Default(),
		metrics:   metrics.Default(),
	}
	for _, o := range opts {
		if err := o(r); err != nil {
			return nil, err
		}
	}
	r.log = r.log.With("runtime", r.id)
	r.putBeat = r.putRegistration
	r.origin = r.id + "@" + strconv.FormatInt(time.Now().UnixNano(), 36)
	r.cpu = newCPUPool(r.cores)
	r.hurry = make(chan struct{}, 1)
	r.rejects = newRejectLog(r.log, r.now)
	r.met = r.metrics.Runtime(r.id)
	return r, nil
}

// ID is the runtime's id, as it appears in the placement.
func (r *Runtime) ID() string { return r.id }

// Run registers the runtime, serves the shards placed on it until ctx is done, then stops every
// shard (each writes its final checkpoint) and deregisters.
func (r *Runtime) Run(ctx context.Context) error {
	b, err := store.OpenBuckets(ctx, r.js)
	if err != nil {
		return err
	}
	r.buckets = b
	defer r.closeUserFuncs() // last: after every shard executor has stopped
	// The leader's stop request, from before the runtime is registered: whichever driver started
	// it, it stops as on SIGTERM.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	stopCtx := ctx // ctx is reassigned below, while the subscription's callback may run
	stopSub, err := r.nc.Subscribe(wire.RuntimeStopSubject(r.id), func(m *nats.Msg) { r.onStop(stopCtx, m, stop) })
	if err != nil {
		return fmt.Errorf("subscribe to stop requests: %w", err)
	}
	defer func() { _ = stopSub.Unsubscribe() }()
	started := r.now()
	if err := r.register(ctx, started); err != nil {
		return err
	}
	if r.registered != nil {
		r.registered(ctx)
	}
	watcher, err := store.Watch(ctx, r.js, b.Placement, ">") // heals: see store.Watcher
	if err != nil {
		if ctx.Err() != nil { // stopped while starting, at the leader's request or the caller's
			dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = b.Runtimes.Delete(dctx, r.id)
			cancel()
			return nil
		}
		return fmt.Errorf("watch placement: %w", err)
	}

	var bg sync.WaitGroup
	loops, stopLoops := context.WithCancel(context.Background())
	r.acks = newAcker(r.js, r.log)
	r.acks.seen = func(rtt time.Duration) { r.beats.observe(r.now(), rtt) }
	r.purger = newPurger(r.log)
	bg.Add(4)
	go func() { defer bg.Done(); r.report(loops, time.Duration(loadEvery.Load())) }()
	// The first report goes out at once, not a period later: until it does the autoscaler does
	// not know the runtime's node and NIC, and gives it no new shards while it knows others'.
	r.reportSoon()
	go func() { defer bg.Done(); r.acks.run(loops) }()
	go func() { defer bg.Done(); r.purger.run(loops) }()
	go func() { defer bg.Done(); r.beat(loops, started) }()
	r.log.Info("runtime started", "cores", r.cores)
	r.met.Observe(r.cores, r.shardGauges)
	stopConnMetrics := r.metrics.WatchConn("runtime "+r.id, r.nc)

	ctx, cancel := context.WithCancel(ctx) // ends retryLater's waits however Run returns
	defer func() {
		cancel()
		_ = watcher.Stop()
		r.stopAll()
		r.wg.Wait()
		stopLoops()
		bg.Wait()
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = b.Runtimes.Delete(dctx, r.id)
		cancel()
		r.met.Close()
		stopConnMetrics()
		r.log.Info("runtime stopped")
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-watcher.Updates():
			if !ok {
				if ctx.Err() != nil { // stopping: the watch ends with the context it was made with
					return nil
				}
				return errors.New("placement watch closed")
			}
			if e != nil {
				r.onPlacement(ctx, e, false)
			}
		case key := <-r.retryC: // a shard that could not start: its placement, as it is now
			if e, err := b.Placement.Get(ctx, key); err == nil {
				r.onPlacement(ctx, e, true)
			}
		}
	}
}

// onStop answers a stop request and, if it obeys it, stops the runtime (stop: Run's cancel). It
// obeys a request of the autoscaler leader's current term: not one of a term older than the one
// holding the placement's fence (a deposed leader's), nor one without a term.
func (r *Runtime) onStop(ctx context.Context, m *nats.Msg, stop context.CancelFunc) {
	var term store.Term
	if err := json.Unmarshal([]byte(m.Header.Get(store.HdrTerm)), &term); err != nil || term.IsZero() {
		_ = m.Respond([]byte("refused: no leadership term (header " + store.HdrTerm + ")"))
		return
	}
	fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	cur, err := store.BucketTerm(fctx, r.js, wire.PlacementBucket)
	cancel()
	switch {
	case err != nil:
		_ = m.Respond([]byte("refused: cannot read the placement's fence: " + err.Error()))
		return
	case cur.After(term):
		_ = m.Respond([]byte(fmt.Sprintf("refused: term %d is over, the leader's is %d", term.Rev, cur.Rev)))
		return
	}
	r.log.Info("stopping at the autoscaler leader's request", "term", term.Rev, "leader", term.Leader)
	_ = m.Respond([]byte(wire.RuntimeStopping))
	stop()
}

// onPlacement starts or stops the executor of the shard an entry names. Entries are acted on in
// revision order: a retry reads the newest entry, which the watch may deliver again, or after
// older ones, later. A retry acts on the revision it read again even when it was seen.
func (r *Runtime) onPlacement(ctx context.Context, e jetstream.KeyValueEntry, retry bool) {
	key := e.Key()
	if store.IsFence(key) {
		return
	}
	r.mu.Lock()
	if seen := r.seen[key]; e.Revision() < seen || (e.Revision() == seen && !retry) {
		r.mu.Unlock()
		return
	}
	if e.Operation() == jetstream.KeyValuePut {
		r.seen[key] = e.Revision()
	} else {
		delete(r.seen, key)
	}
	r.mu.Unlock()
	var p wire.Placement
	mine := false
	if e.Operation() == jetstream.KeyValuePut {
		if err := json.Unmarshal(e.Value(), &p); err != nil {
			r.log.Warn("bad placement entry", "key", key, "err", err)
			return
		}
		mine = p.Runtime == r.id
	}
	r.mu.Lock()
	x, running := r.shards[key]
	if !mine {
		delete(r.retries, key) // placed elsewhere now: no more retries of an earlier failed start
	}
	r.mu.Unlock()
	switch {
	case mine && !running:
		jobID, shard, err := splitPlacementKey(key)
		if err != nil {
			r.log.Warn("bad placement key", "key", key, "err", err)
			return
		}
		if err := r.startShard(ctx, key, jobID, shard, p); err != nil {
			r.log.Warn("cannot serve shard", "job", jobID, "shard", shard, "err", err)
			if !errors.Is(err, errPermanent) {
				r.stats.failedStart.Add(1)
				r.retryLater(ctx, key)
			}
		}
	case !mine && running:
		// Moved away (or the job is gone): stop at a step boundary and release the shard to its new
		// owner, without holding up the other placement changes.
		r.mu.Lock()
		delete(r.shards, key)
		r.mu.Unlock()
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.release(ctx, x, p.Epoch, e.Operation() == jetstream.KeyValuePut)
		}()
	case !mine && p.From == r.id:
		// Moved away from here, but no executor of it runs here (see releaseUnserved). One that is
		// still stopping releases an earlier epoch first.
		r.mu.Lock()
		stopping := r.releasing[key]
		r.mu.Unlock()
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if stopping != nil {
				<-stopping.released
			}
			r.releaseUnserved(ctx, key, p)
		}()
	}
}

// release stops x and, when the shard moved to another runtime, writes the handover record the new
// owner waits for (recordRelease): by then the shard's final snapshot is stored. ctx is the
// runtime's: it ends the record's retries when the runtime stops.
func (r *Runtime) release(ctx context.Context, x *shardExec, epoch uint64, moved bool) {
	defer r.doneReleasing(x)
	stopped := r.now()
	x.cancel()
	<-x.done
	if !moved {
		return
	}
	var prev wire.Handover
	if !x.acquired.Load() {
		// Moved on before it was ever served here: the previous owner may still be storing its
		// final snapshot. Releasing now would let the next owner restore an older one, so first
		// wait for that release (or that owner's death), as serving would have.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var err error
		if prev, err = x.awaitRelease(ctx); err != nil {
			r.log.Warn("shard moved on before its previous owner released it", "shard", x.key, "err", err)
		}
		cancel()
	}
	x.mu.Lock()
	h := wire.Handover{Epoch: epoch, From: r.id, Step: x.step, Stopped: stopped.UTC(), Released: r.now().UTC()}
	if x.acquired.Load() {
		h.Decided = max(x.seq, x.sync.quietTo) // it reported its refusals up to here
	} else {
		h.Decided = prev.Decided // passed on: the owner before it reported them
	}
	x.mu.Unlock()
	x.log.Debug("releasing the shard", "epoch", epoch, "step", h.Step, "acquired", x.acquired.Load())
	r.recordRelease(ctx, x.key, h)
}

// handoverAttempt bounds the first attempt to write a handover record; each attempt after a failed
// one has twice the time of the one before, up to handoverAttemptMax, with a pause between them
// growing from handoverBackoff to handoverBackoffMax.
const (
	handoverAttempt    = 5 * time.Second
	handoverAttemptMax = 30 * time.Second
	handoverBackoff    = 100 * time.Millisecond
	handoverBackoffMax = 2 * time.Second
)

// recordRelease writes h, the handover record of shard key that its new owner waits for, until it
// is stored, it is no longer wanted (releaseWanted), or ctx (the runtime's) ends. The new owner
// serves once it finds the record or finds this runtime gone, and this runtime is not gone: a
// record given up on (its requests timed out behind a full link) held the shard, and its job's
// steps, until a human stopped a runtime. The first attempt is made even if ctx has ended (a
// runtime that stops records what it can); the later ones end with ctx.
func (r *Runtime) recordRelease(ctx context.Context, key string, h wire.Handover) {
	log := r.log.With("shard", key, "epoch", h.Epoch)
	const stopped = "handover not recorded before this runtime stopped; the new owner waits for it to be gone"
	base, wait, backoff := context.Background(), handoverAttempt, handoverBackoff
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			select {
			case <-ctx.Done():
				log.Warn(stopped)
				return
			case <-time.After(backoff):
			}
			base, wait, backoff = ctx, min(2*wait, handoverAttemptMax), min(2*backoff, handoverBackoffMax)
			wctx, cancel := context.WithTimeout(ctx, wait)
			wanted, err := r.releaseWanted(wctx, key, h)
			cancel()
			if err == nil && !wanted {
				log.Info("handover no longer wanted: the shard's placement was cleared or began again", "attempts", attempt-1)
				return
			}
		}
		actx, cancel := context.WithTimeout(base, wait)
		err := r.recordHandover(actx, key, h)
		cancel()
		switch {
		case err == nil:
			if attempt > 1 {
				log.Info("handover recorded", "attempts", attempt)
			}
			return
		case ctx.Err() != nil:
			log.Warn(stopped, "err", err)
			return
		}
		log.Warn("handover not recorded; retrying", "attempt", attempt, "err", err)
	}
}

// releaseWanted says whether the handover record h is still wanted: the shard's placement is at
// h's epoch or later. A placement that is gone (the job paused or deleted) or began again below it
// (resumed) had its handover records cleared by the gateway, and a record written now would come
// back among them: a later move to that epoch would find it and serve without waiting for the
// real previous owner.
func (r *Runtime) releaseWanted(ctx context.Context, key string, h wire.Handover) (bool, error) {
	e, err := r.buckets.Placement.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return true, err
	}
	var p wire.Placement
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		return true, err
	}
	return p.Epoch >= h.Epoch, nil
}

// recordHandover writes h unless the shard's record is already at a later epoch: releases may
// finish out of order, and a record must never go back, or an owner that waits for the later
// epoch would wait forever. A release of epoch e implies every earlier one.
func (r *Runtime) recordHandover(ctx context.Context, key string, h wire.Handover) error {
	if f, ok := failHandover.Load(key); ok {
		if err := f.(func() error)(); err != nil {
			return err
		}
	}
	val, _ := json.Marshal(h)
	for {
		e, err := r.buckets.Handover.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if _, err = r.buckets.Handover.Create(ctx, key, val); err == nil || !errors.Is(err, jetstream.ErrKeyExists) {
				return err
			}
			continue
		case err != nil:
			return err
		}
		var cur wire.Handover
		if json.Unmarshal(e.Value(), &cur) == nil && cur.Epoch >= h.Epoch {
			return nil
		}
		if _, err = r.buckets.Handover.Update(ctx, key, val, e.Revision()); err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
	}
}

func (r *Runtime) doneReleasing(x *shardExec) {
	r.mu.Lock()
	if r.releasing[x.key] == x {
		delete(r.releasing, x.key)
	}
	r.mu.Unlock()
	x.releaseOnce.Do(func() { close(x.released) })
}

// errPermanent marks a shard that cannot start however often it is tried: its job is gone or
// paused, or has no such shard.
var errPermanent = errors.New("not retried")

// startShard starts an executor for the shard placed here by p.
func (r *Runtime) startShard(ctx context.Context, key, jobID string, shard int, p wire.Placement) error {
	ji, err := r.acquireJob(ctx, jobID)
	if err != nil {
		return err
	}
	if shard >= ji.rec.Layout.NumShards() {
		r.releaseJob(ji)
		return fmt.Errorf("%w: job %s has no shard %d", errPermanent, jobID, shard)
	}
	x, err := newShardExec(r, ji, shard, p.Epoch)
	if err != nil {
		r.releaseJob(ji)
		return fmt.Errorf("%w: %w", errPermanent, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	x.cancel = cancel
	x.placement = p
	r.mu.Lock()
	x.prevLocal = r.releasing[key] // an executor of this shard that is still stopping here
	r.releasing[key] = x
	r.mu.Unlock()
	r.mu.Lock()
	r.shards[key] = x
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		x.run(sctx)
		r.mu.Lock()
		if r.shards[key] == x {
			delete(r.shards, key)
		}
		r.mu.Unlock()
		r.releaseJob(ji)
	}()
	r.mu.Lock()
	delete(r.retries, key)
	r.mu.Unlock()
	return nil
}

// retryLater has the watch loop look at key's placement again after a backoff (250 ms, doubling
// to 5 s): a shard whose executor could not start (say, a JetStream request timed out) would
// otherwise stay unserved until the autoscaler moved it.
func (r *Runtime) retryLater(ctx context.Context, key string) {
	r.mu.Lock()
	n := r.retries[key]
	r.retries[key] = n + 1
	r.mu.Unlock()
	wait := min(250*time.Millisecond<<min(n, 5), 5*time.Second)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
			select {
			case r.retryC <- key:
			case <-ctx.Done():
			}
		}
	}()
}

// shardExecs copies the shards served now, under r.mu, so that callers can go through them
// without holding it.
func (r *Runtime) shardExecs() []*shardExec {
	r.mu.Lock()
	defer r.mu.Unlock()
	execs := make([]*shardExec, 0, len(r.shards))
	for _, x := range r.shards {
		execs = append(execs, x)
	}
	return execs
}

func (r *Runtime) stopAll() {
	all := r.shardExecs()
	for _, x := range all {
		x.cancel()
	}
	for _, x := range all {
		<-x.done
		r.doneReleasing(x)
	}
}

func (r *Runtime) acquireJob(ctx context.Context, id string) (*jobInfo, error) {
	// The record first: a job deleted and created again under its id is another incarnation, and
	// shares nothing with the one before it, whose executors may still be stopping here.
	e, err := r.buckets.Jobs.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: job %s does not exist", errPermanent, id)
	}
	if err != nil {
		return nil, fmt.Errorf("read job %s: %w", id, err)
	}
	var rec job.Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, fmt.Errorf("decode job %s: %w", id, err)
	}
	incarnation := id + "@" + strconv.FormatInt(rec.Created.UnixNano(), 36)
	r.mu.Lock()
	if ji := r.jobs[incarnation]; ji != nil {
		ji.refs++
		r.mu.Unlock()
		return ji, nil
	}
	r.mu.Unlock()
	if rec.Paused {
		return nil, fmt.Errorf("%w: job %s is paused", errPermanent, id)
	}
	// A direct-gradients job has no gradient stream; a job may have several (spec gradient_streams).
	grads := make([]jetstream.Stream, rec.Spec.GradStreams())
	for g := range grads {
		name := wire.GradStreamOf(id, len(grads), g)
		if grads[g], err = r.js.Stream(ctx, name); err != nil {
			return nil, fmt.Errorf("open gradient stream %s of job %s: %w", name, id, err)
		}
	}
	params, err := r.js.Stream(ctx, wire.ParamsStream(id))
	if err != nil {
		return nil, fmt.Errorf("open parameter stream of job %s: %w", id, err)
	}
	var init jetstream.Stream
	if rec.Spec.Init.Kind == "upload" {
		if init, err = r.js.Stream(ctx, wire.InitStream(id)); err != nil {
			return nil, fmt.Errorf("open upload stream of job %s: %w", id, err)
		}
	}
	ji := newJobInfo(&rec, grads, params, init)
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur := r.jobs[incarnation]; cur != nil { // another shard of the job got here first
		cur.refs++
		return cur, nil
	}
	r.jobs[incarnation] = ji
	return ji, nil
}

// newJobInfo is the jobInfo of one incarnation of rec's job, with one reference. grads are its
// gradient streams, in the order of their groups (none for direct gradients).
func newJobInfo(rec *job.Record, grads []jetstream.Stream, params, init jetstream.Stream) *jobInfo {
	ji := &jobInfo{rec: rec, grads: grads, params: params, init: init, refs: 1,
		incarnation: rec.Spec.ID + "@" + strconv.FormatInt(rec.Created.UnixNano(), 36), inc: wire.Incarnation(rec.Created)}
	for _, g := range grads {
		ji.streams = append(ji.streams, newStreamRef(g))
	}
	ji.streams = append(ji.streams, newStreamRef(params))
	return ji
}

// gradRef is the gradient stream of shard, or the zero streamRef for a direct-gradients job.
func (ji *jobInfo) gradRef(shard int) streamRef {
	if len(ji.grads) == 0 {
		return streamRef{}
	}
	return ji.streams[shard%len(ji.grads)]
}

func (r *Runtime) releaseJob(ji *jobInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ji.refs--; ji.refs <= 0 && r.jobs[ji.incarnation] == ji {
		delete(r.jobs, ji.incarnation)
		for _, other := range r.jobs {
			if other.rec.Spec.ID == ji.rec.Spec.ID {
				return // the job's metrics are its next incarnation's now
			}
		}
		r.met.ForgetJob(ji.rec.Spec.ID)
	}
}

func splitPlacementKey(key string) (string, int, error) {
	for i := len(key) - 1; i >= 0; i-- {
		if key[i] == '.' {
			shard, ok := wire.ShardFromSubject(key)
			if !ok || i == 0 {
				break
			}
			return key[:i], shard, nil
		}
	}
	return "", 0, fmt.Errorf("placement key %q is not <job>.<shard>", key)
}

// Shards lists the keys (<job>.<shard>) of the shards this runtime serves now.
func (r *Runtime) Shards() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.shards))
	for k := range r.shards {
		keys = append(keys, k)
	}
	return keys
}

// ackTimeout is the least wait for JetStream to acknowledge an asynchronous publish before it is
// sent again (acker.wait), under the same message id: a publish lost in a stream leader's election
// is sent again after it. An election takes a few seconds; a healthy acknowledgement,
// milliseconds, large messages under load well under a second. The acker waits longer while
// acknowledgements come late (acker.rto); the client library's own timeout, which frees a
// publish's future, is the longest wait, ackAttemptMax.
const ackTimeout = 3 * time.Second
