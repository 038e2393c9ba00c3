package sdk

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// Worker acts as one logical rank of a job, or several (Client.WorkerRanks): Step publishes the
// rank's gradients for the next step and returns the parameters after it; StepRanks publishes
// each of its ranks' gradients and receives the parameters once. Which process holds which ranks
// does not change a bit of the result: the runtimes sum the gradients of a step in rank order. A
// Worker is not safe for concurrent use.
type Worker struct {
	c      *Client
	rec    *job.Record
	rank   int        // ranks[0]
	ranks  []int      // the logical ranks it publishes for, in the order of StepRanks' gradients
	weight float64    // HdrWeight, or 0 for unweighted (wire.Grad)
	fb     fallback   // when a waiting Step fetches what was not pushed (WithFetchAfter)
	full   int        // WithFullStreamRetries
	dtype  wire.Dtype // the element type of the gradients it publishes (WithGradDtype)

	step    int64 // step of the parameters held in w.vec; -1 before the first fetch
	vec     []float32
	attempt int         // Step calls for the same step after a failure: makes the message ids new
	msgs    []*nats.Msg // the gradient messages: rank ranks[j]'s of shard i at j*shards+i
	all     []int       // 0..len(ranks)-1: publish every rank
	enc     []byte      // encoding buffer: 16-bit gradients, and f32 ones on big-endian machines
	inbox   string
	psub    *nats.Subscription
	rsub    *nats.Subscription
	rejects chan *wire.Reject // written by the reject subscription, read by Step
	trace   *stepTrace        // the open Step's tracing; nil when not traced
	met     workerMeters      // this worker's metrics; no-ops when off

	// Elastic workers (elastic.go): waitHook runs every reconnectPoll while Step waits for step
	// t, and a duplicate of this step's gradient is no failure (its rank's new owner and its old
	// one may both have published it). newest is the newest step of any parameters pushed.
	as asyncState // ssp and asp (sync.go)

	// direct sends the gradients of a direct-gradients job (direct.go); nil for other jobs.
	direct *directSender

	waitHook func(ctx context.Context, t int64) error
	elastic  bool
	// pubVersions (ssp and asp): per shard, the version the gradients publish computes from
	// (HdrVersion); with skipApplied, publish leaves out the shards whose version is t or later.
	// onGrad is told of each gradient message (rank, step, shard index, message id) before it
	// is published (RecordIntended), and once JetStream has acknowledged it (RecordStored, or
	// RecordDuplicate when JetStream held a message of that id already: another owner's).
	pubVersions []int64
	skipApplied bool
	onGrad      func(rank int, t int64, i int, msgID string, o RecordOutcome)
	newest      atomic.Int64

	mu      sync.Mutex // guards the fields below, written by the parameter subscription
	want    int64      // the step Step waits for; 0 when not waiting
	got     []int64    // per shard: step of the parameters copied into vec
	ahead   []bool     // per shard: the stream already holds the next step's parameters (Params)
	missing int
	ready   chan struct{} // closed when missing reaches 0
	// The awaited step's first and latest push received (zero before one is): the fallback
	// fetches only when pushes do not come, and learns how long a step's first push takes.
	firstPush, lastPush time.Time
}

// WorkerOption configures a Worker.
type WorkerOption func(*Worker) error

// WithWeight sets the rank's weight for weighted functions (fedavg: its sample count), in
// wire.MinWeight..wire.MaxWeight (float32's normal numbers > 0).
func WithWeight(w float64) WorkerOption {
	return func(wk *Worker) error {
		if !(w >= wire.MinWeight && w <= wire.MaxWeight) {
			return fmt.Errorf("weight must be in %g..%g (a float32 > 0, not subnormal), got %v", wire.MinWeight, wire.MaxWeight, w)
		}
		wk.weight = w
		return nil
	}
}

// WithFetchAfter sets how long Step waits for pushed parameters before it fetches them from the
// stream (default 1s): the fallback for a worker that missed a push. It is the least wait: once a
// step's pushes have begun, Step fetches when they stop for this long and twice the longest
// recent spread of a step's pushes has passed since its first (on a slow link they come in
// waves); before the first push, it waits twice the longest recent wait for one (a step's first
// push waits for the slowest rank); each at most 10s. After a reconnect or a dropped push it
// fetches at once. It must be positive: the fetches of a worker still short back off from it.
func WithFetchAfter(d time.Duration) WorkerOption {
	return func(wk *Worker) error {
		if d <= 0 {
			return fmt.Errorf("fetch after must be > 0 (the least wait for a push, and the fetches' first backoff), got %v", d)
		}
		wk.fb.after = d
		return nil
	}
}

// WithFullStreamRetries sets how many times a gradient whose publish JetStream refused because
// the job's gradient stream (or the server's storage) is full is sent again before Step fails
// (default 240, about a minute with the 250 ms backoff). A full stream is backpressure that passes
// once the runtimes apply and purge older steps; one that stays full means no runtime is draining
// it, and Step then fails with a wire.ReasonQuotaExceeded rejection that wraps JetStream's error.
func WithFullStreamRetries(n int) WorkerOption {
	return func(wk *Worker) error {
		if n < 0 {
			return fmt.Errorf("full stream retries must be >= 0, got %d", n)
		}
		wk.full = n
		return nil
	}
}

// WithParamsBuffer makes the worker write the parameters it receives straight into buf (one element
// per parameter of the job, in layout order) instead of a vector of its own: Step and Params then
// return buf. The worker writes buf only during Step and Params; between calls it is the caller's.
// A Step that fails may leave buf partly at the next step: retry it with the same gradients, or
// call Params. This is how a caller whose parameters live elsewhere (a numpy array, a PyTorch
// module's flattened weights, through the C library) receives them without a copy.
func WithParamsBuffer(buf []float32) WorkerOption {
	return func(wk *Worker) error {
		if len(buf) != wk.rec.Layout.Elements {
			return fmt.Errorf("parameters buffer has %d elements, job %q has %d parameters", len(buf), wk.rec.Spec.ID, wk.rec.Layout.Elements)
		}
		wk.vec = buf
		return nil
	}
}

// WithGradDtype makes the worker publish its gradients as dt: wire.F32 (the default), wire.BF16
// or wire.F16, half the bytes on the wire. Step still takes []float32 gradients; each is rounded
// to dt (round to nearest even, see wire.F32ToBF16 and wire.F32ToF16) into a buffer the worker
// reuses from step to step, and the runtime converts it back to float32 exactly before the
// float32 rank-order sum: the result is the reference's for the rounded gradients (wire.Round).
// Parameters are float32 whatever the gradients' dtype (a job's param_dtype sets what the
// workers receive: see the package doc). Ranks of one job may use different dtypes. Elastic
// workers: WithElasticGradDtype.
func WithGradDtype(dt wire.Dtype) WorkerOption {
	return func(wk *Worker) error {
		if !dt.Valid() {
			return fmt.Errorf("gradient dtype %v: %w", dt, wire.Rejectf(wire.ReasonBadDtype, "dtype %v is not %s, %s or %s", dt, wire.DtypeF32, wire.DtypeBF16, wire.DtypeF16))
		}
		wk.dtype = dt
		return nil
	}
}

// Worker joins job id as rank. Options: WithWeight, WithFetchAfter, WithParamsBuffer,
// WithGradDtype, WithFullStreamRetries.
func (c *Client) Worker(ctx context.Context, id string, rank int, opts ...WorkerOption) (*Worker, error) {
	return c.WorkerRanks(ctx, id, []int{rank}, opts...)
}

// WorkerRanks joins job id as the logical ranks given, in one worker: StepRanks publishes a
// gradient for each of them and receives the parameters once, so a process can serve any number
// of a job's ranks, and the ranks can move between processes from one step to the next (close the
// worker that had them; the next one resumes with Params). A weight (WithWeight) applies to every
// rank of the worker. The worker's metrics and traces name its first rank.
func (c *Client) WorkerRanks(ctx context.Context, id string, ranks []int, opts ...WorkerOption) (*Worker, error) {
	w, err := c.workerRanks(ctx, id, ranks, opts...)
	if err != nil {
		return nil, err
	}
	for j := range w.ranks { // every message now: the step's traceparent is set on all of them
		for i := range w.rec.Layout.Shards {
			w.msg(j, i)
		}
	}
	return w, nil
}

// workerRanks is WorkerRanks making the gradient messages on first use (an elastic worker holds
// every rank of its job and publishes a few).
func (c *Client) workerRanks(ctx context.Context, id string, ranks []int, opts ...WorkerOption) (*Worker, error) {
	rec, err := c.Job(ctx, id)
	if err != nil {
		return nil, err
	}
	if len(ranks) == 0 {
		return nil, fmt.Errorf("job %q: a worker needs at least one rank", id)
	}
	seen := map[int]bool{}
	for _, rank := range ranks {
		if rank < 0 || rank >= rec.Spec.Ranks {
			return nil, fmt.Errorf("job %q: %w", id, wire.Rejectf(wire.ReasonRankRange, "rank %d is not in 0..%d", rank, rec.Spec.Ranks-1))
		}
		if seen[rank] {
			return nil, fmt.Errorf("job %q: rank %d given twice", id, rank)
		}
		seen[rank] = true
	}
	n := rec.Layout.NumShards()
	w := &Worker{
		c: c, rec: rec, rank: ranks[0], ranks: slices.Clone(ranks), fb: fallback{after: time.Second}, step: -1, full: fullStreamRetries,
		got:     make([]int64, n),
		ahead:   make([]bool, n),
		msgs:    make([]*nats.Msg, len(ranks)*n),
		inbox:   wire.InboxPrefix(id) + "." + nuid.Next(), // rejections are sent only inside the job's reply namespace
		rejects: make(chan *wire.Reject, 64),
		met:     meterOf(c.meter, id, ranks[0]),
	}
	for _, o := range opts {
		if err := o(w); err != nil {
			return nil, err
		}
	}
	if w.vec == nil {
		w.vec = make([]float32, rec.Layout.Elements)
	}
	for j := range ranks {
		w.all = append(w.all, j)
	}
	if w.async() {
		w.initAsync()
	}
	if w.psub, err = c.nc.Subscribe(wire.ParamsWildcard(id), w.onParams); err != nil {
		return nil, err
	}
	// A push is never lost silently: a slow worker falls back to fetching. Allow a whole model.
	_ = w.psub.SetPendingLimits(-1, max(64<<20, 2*4*rec.Layout.Elements))
	if w.rsub, err = c.nc.Subscribe(w.inbox, w.onReject); err != nil {
		w.psub.Unsubscribe()
		return nil, err
	}
	if rec.Spec.DirectGradients() {
		if w.direct, err = newDirectSender(w); err != nil {
			_ = w.Close()
			return nil, err
		}
	}
	return w, nil
}

// Job is the job's record.
func (w *Worker) Job() *job.Record { return w.rec }

// Rank is the worker's logical rank (its first, if it holds several).
func (w *Worker) Rank() int { return w.rank }

// Ranks are the worker's logical ranks, in the order StepRanks takes their gradients.
func (w *Worker) Ranks() []int { return slices.Clone(w.ranks) }

// StepCount is the step of the parameters the worker holds (0 = initial), -1 before it has any.
func (w *Worker) StepCount() int64 { return w.step }

// Close stops the worker's subscriptions.
func (w *Worker) Close() error {
	err := errors.Join(w.psub.Unsubscribe(), w.rsub.Unsubscribe())
	if w.direct != nil {
		err = errors.Join(err, w.direct.close())
	}
	return err
}

// Params fetches the parameters of every shard from the stream, all of one step: how a worker that
// joins late or restarts catches up. It returns that step and the flattened vector, which the
// worker owns and overwrites on the next call to Params or Step.
//
// In BSP the shards of a job are never more than one step apart, and the stream keeps two versions
// of every shard's parameters: where some shards are already at step t+1 (the other ranks, or this
// rank before a crash, published step t+1 of them), Params returns step t, reading the previous
// version of those shards. The next Step then publishes step t+1 again with the same message ids
// (JetStream drops the copies it stored; a shard that applied them answers stale_step, and Step
// takes its parameters from the stream), so a worker restarted in the middle of publishing a step
// ends byte-identical to an uninterrupted run.
//
// Until the job has its initial parameters (init "upload": until they are uploaded and checked),
// Params waits for them, until ctx ends.
func (w *Worker) Params(ctx context.Context) (int64, []float32, error) {
	if w.async() {
		return w.paramsAsync(ctx)
	}
	latest := make([]int64, len(w.rec.Layout.Shards))
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		t, ok, err := w.readConsistent(ctx, latest)
		if err != nil && !errors.Is(err, errNoMessage) {
			return 0, nil, err
		}
		if err == nil && ok {
			w.step = t
			w.mu.Lock()
			for i, l := range latest {
				w.ahead[i] = l > t
			}
			w.mu.Unlock()
			return t, w.vec, nil
		}
		select { // no parameters yet, or training moved on while we read: again
		case <-ctx.Done():
			if err != nil {
				return 0, nil, fmt.Errorf("job %q has no parameters yet: %w", w.rec.Spec.ID, ctx.Err())
			}
			return 0, nil, fmt.Errorf("job %q: no consistent parameters: %w", w.rec.Spec.ID, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// readConsistent reads every shard's parameters at the lowest step t among their newest versions
// into vec, recording each shard's newest step in latest. ok is false when the shards are more than
// one step apart, or a previous version is gone: the caller reads again.
func (w *Worker) readConsistent(ctx context.Context, latest []int64) (t int64, ok bool, err error) {
	t, hi := int64(-1), int64(-1)
	for i, s := range w.rec.Layout.Shards {
		if latest[i], err = w.fetchShard(ctx, s, -1); err != nil {
			return 0, false, err
		}
		if t < 0 || latest[i] < t {
			t = latest[i]
		}
		hi = max(hi, latest[i])
	}
	if hi > t+1 {
		return 0, false, nil
	}
	for i, s := range w.rec.Layout.Shards {
		if latest[i] == t {
			continue
		}
		// The oldest version the stream keeps of a shard at t+1: step t, unless it moved on.
		id := w.rec.Spec.ID
		body := `{"next_by_subj":"` + wire.ParamsSubject(id, s.ID) + `"}`
		m, err := w.c.directGet(ctx, wire.DirectGet(wire.ParamsStream(id)), []byte(body))
		if err != nil {
			return 0, false, fmt.Errorf("fetch parameters of shard %d: %w", s.ID, err)
		}
		if step, err := w.copyShard(s, m, t); err != nil || step != t {
			return 0, false, err
		}
	}
	return t, true, nil
}

// fetchShard copies the shard's latest parameters into vec if they are for step want (any step if
// want < 0) and returns their step.
func (w *Worker) fetchShard(ctx context.Context, s job.Shard, want int64) (int64, error) {
	id := w.rec.Spec.ID
	m, err := w.c.directGet(ctx, wire.DirectGetLast(wire.ParamsStream(id), wire.ParamsSubject(id, s.ID)), nil)
	if err != nil {
		return 0, fmt.Errorf("fetch parameters of shard %d: %w", s.ID, err)
	}
	return w.copyShard(s, m, want)
}

// copyShard copies a parameters message of shard s into vec if it is for step want (any step if
// want < 0) and returns its step. A message that is no parameters of s (an unknown Fanin-Dtype, a
// payload of another length than the shard in its dtype) is an error, and vec is left as it was.
func (w *Worker) copyShard(s job.Shard, m *nats.Msg, want int64) (int64, error) {
	step, err := wire.ParseStep(m.Header)
	if err != nil {
		return 0, fmt.Errorf("shard %d: %w", s.ID, err)
	}
	dt, err := wire.ParamsDtype(m.Header, m.Data, s.Len)
	if err != nil {
		return 0, fmt.Errorf("job %q, shard %d, step %d: %w", w.rec.Spec.ID, s.ID, step, err)
	}
	w.noteRankSteps(s.ID, m.Header)
	if want < 0 || step == want {
		w.mu.Lock()
		wire.Decode(w.vec[s.Off:s.Off+s.Len], m.Data, dt)
		w.got[s.ID] = step
		w.mu.Unlock()
	}
	return step, nil
}

// Step publishes the rank's gradient of the whole model for the next step and waits for the
// parameters after it. The returned slice is owned by the worker and overwritten by the next call.
// grads is only read, and is no longer referenced when Step returns, whether it succeeded or
// failed: a failed Step leaves no publish behind that could still send it.
//
// A retry cannot apply anything twice: each message carries an id that JetStream de-duplicates,
// and the runtime refuses a second gradient from the same rank for the same step.
func (w *Worker) Step(ctx context.Context, grads []float32) ([]float32, error) {
	if len(w.ranks) != 1 {
		return nil, fmt.Errorf("step: the worker holds ranks %v: give each its gradient with StepRanks", w.ranks)
	}
	return w.StepRanks(ctx, [][]float32{grads})
}

// StepRanks is Step for a worker of several ranks: grads[j] is the gradient of rank Ranks()[j].
// Every rank's gradient is published before the parameters are awaited, once for all of them.
func (w *Worker) StepRanks(ctx context.Context, grads [][]float32) ([]float32, error) {
	if len(grads) != len(w.ranks) {
		return nil, fmt.Errorf("step: %d gradients for the %d ranks %v", len(grads), len(w.ranks), w.ranks)
	}
	for j, g := range grads {
		if len(g) != w.rec.Layout.Elements {
			return nil, fmt.Errorf("step: %d gradients for rank %d, job %q has %d parameters", len(g), w.ranks[j], w.rec.Spec.ID, w.rec.Layout.Elements)
		}
	}
	if w.async() {
		return w.stepAsync(ctx, grads)
	}
	if w.step < 0 {
		if _, _, err := w.Params(ctx); err != nil {
			return nil, err
		}
	}
	t := w.step + 1
	w.expect(t)
	defer w.expect(0)
	w.trace = w.traceStep(ctx, t)
	start := time.Now()
	var err error
	if w.direct != nil {
		err = w.stepDirect(ctx, t, grads) // publishes and awaits, sending again on a gap
		w.trace.published(err)
	} else {
		err = w.publish(ctx, t, w.all, grads)
		w.trace.published(err)
		if err == nil {
			w.met.published(start, 4*len(grads)*w.rec.Layout.Elements)
			err = w.await(ctx, t)
		}
	}
	w.trace.done(err)
	w.trace = nil
	if err != nil {
		w.met.failed(err)
		w.attempt++
		return nil, err
	}
	w.met.stepped(start)
	w.step, w.attempt = t, 0
	return w.vec, nil
}

func (w *Worker) expect(t int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.want = t
	w.firstPush, w.lastPush = time.Time{}, time.Time{}
	if t == 0 {
		return
	}
	w.missing = 0
	for _, g := range w.got {
		if g < t {
			w.missing++
		}
	}
	w.ready = make(chan struct{})
	if w.missing == 0 {
		close(w.ready)
	}
}

// msg is the gradient message of rank w.ranks[j] for shard i, made on first use: an elastic
// worker holds every rank of the job and publishes few of them. publish sets its headers.
func (w *Worker) msg(j, i int) *nats.Msg {
	k := j*w.rec.Layout.NumShards() + i
	if m := w.msgs[k]; m != nil {
		return m
	}
	m := nats.NewMsg(wire.GradSubject(w.rec.Spec.ID, w.rec.Layout.Shards[i].ID))
	w.msgs[k] = m
	return m
}

// publish publishes the gradients of the ranks w.ranks[which[k]], grads[k] each, for step t.
func (w *Worker) publish(ctx context.Context, t int64, which []int, grads [][]float32) error {
	n := w.rec.Layout.NumShards()
	futs := make([]jetstream.PubAckFuture, len(w.msgs))
	for k, j := range which {
		rank := w.ranks[j]
		for i, s := range w.rec.Layout.Shards {
			if w.skipApplied && w.pubVersions[i] >= t {
				continue
			}
			m := w.msg(j, i)
			g := wire.Grad{Job: w.rec.Spec.ID, Shard: s.ID, Step: t, Rank: rank, Dtype: w.dtype,
				Weight: w.weight, ReplyTo: w.inbox, Attempt: w.attempt}
			if w.pubVersions != nil {
				g.Version, g.Versioned = w.pubVersions[i], true
			}
			wire.SetGradHeaders(m.Header, g)
			id := m.Header.Get(wire.HdrMsgID)
			m.Data = w.bytesOf(grads[k][s.Off:s.Off+s.Len], j*w.rec.Layout.Elements+s.Off)
			if w.onGrad != nil { // before the publish: a worker killed after it leaves a record
				w.onGrad(rank, t, i, id, RecordIntended)
			}
			f, err := w.c.js.PublishMsgAsync(m, asyncPublish...)
			if err != nil {
				return w.pubError(s, rank, err)
			}
			futs[j*n+i] = f
		}
	}
	for k, f := range futs {
		if f == nil { // a rank not published this time
			continue
		}
		select {
		case ack := <-f.Ok():
			if w.onGrad != nil {
				o := RecordStored
				if ack.Duplicate {
					o = RecordDuplicate
				}
				w.onGrad(w.ranks[k/n], t, k%n, w.msgs[k].Header.Get(wire.HdrMsgID), o)
			}
		case err := <-f.Err():
			// Retry synchronously with the same id: JetStream drops it if the first one landed.
			if err := w.publishRetrying(ctx, w.rec.Layout.Shards[k%n], w.ranks[k/n], w.msgs[k], err); err != nil {
				return err
			}
			if w.onGrad != nil { // stored by this attempt or the first: ours either way
				w.onGrad(w.ranks[k/n], t, k%n, w.msgs[k].Header.Get(wire.HdrMsgID), RecordStored)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// asyncPublish are the options of every asynchronous gradient publish: no retry by nats.go. On a
// "no responders" answer nats.go would publish the same *nats.Msg again from a timer, 250 ms later
// and again after that, reading its Header and Data as they are then. A Step that failed (its ctx
// ended, or another shard's publish failed) returns with such a retry pending, and by then the
// caller may be writing its next gradient into the same memory (f32 payloads are the caller's
// gradient itself), or the next Step rewriting the message's headers and w.enc: the retry sent the
// new bytes under the old message id, or a mix of steps. Without it, nats.go has copied header and
// payload into its write buffer when PublishMsgAsync returns and never reads the message again: a
// pending future of a failed attempt holds nothing that changes, and is dropped. publish retries
// itself, synchronously and with the same id, while the message is still its own
// (publishRetrying treats "no responders" as transient while the job exists).
var asyncPublish = []jetstream.PublishOpt{jetstream.WithRetryAttempts(0)}

// publishRetrying publishes m (a gradient whose asynchronous publish failed with first) until
// JetStream stores it or ctx ends. It retries at once, then, with a backoff, for as long as the
// refusal is one that passes (transient); anything else is returned at once, as a rejection where
// it has a reason. A full stream passes only while the runtimes drain it: after w.full retries
// refused as full, it is returned too (quota_exceeded).
func (w *Worker) publishRetrying(ctx context.Context, s job.Shard, rank int, m *nats.Msg, first error) error {
	full := 0
	if storageFull(first) {
		full++
	}
	attempt := pubAttempt
	if unanswered(first) { // the asynchronous publish got no answer in ackTimeout: wait longer
		attempt = 2 * pubAttempt
	}
	err := w.publishOnce(ctx, m, attempt)
	for wait := 20 * time.Millisecond; err != nil; wait = min(2*wait, pubBackoff) {
		if ctx.Err() != nil { // not the refusal's fault: say so, whatever it was
			return fmt.Errorf("publish gradient of shard %d (refused: %v): %w", s.ID, errors.Join(first, err), ctx.Err())
		}
		if storageFull(err) {
			if full++; full > w.full {
				return w.pubError(s, rank, err)
			}
		} else if !w.transient(ctx, err) {
			return w.pubError(s, rank, errors.Join(first, err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		if unanswered(err) {
			attempt = max(min(2*attempt, pubAttemptMax), attempt)
		}
		err = w.publishOnce(ctx, m, attempt)
	}
	return nil
}

// unanswered says whether err is a publish that got no acknowledgement in its time (rather than a
// refusal).
func unanswered(err error) bool {
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrAsyncPublishTimeout)
}

// fullStreamRetries is how many times a publish refused as full is sent again by default
// (WithFullStreamRetries): about a minute at pubBackoff, far beyond the few seconds a runtime's
// failover or a stream leader's election holds back the purges.
const fullStreamRetries = 240

// publishOnce publishes m and waits for its acknowledgement for at most attempt.
func (w *Worker) publishOnce(ctx context.Context, m *nats.Msg, attempt time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, attempt)
	defer cancel()
	_, err := w.c.js.PublishMsg(ctx, m)
	return err
}

// storageFull reports whether JetStream refused a publish for want of room: the job's gradient
// stream holds its bound of messages or bytes until the runtimes purge what they applied
// (store.CreateJobStreams), or the server's JetStream storage is exhausted.
func storageFull(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (strings.Contains(apiErr.Description, "maximum bytes exceeded") ||
		strings.Contains(apiErr.Description, "maximum messages exceeded") || strings.Contains(apiErr.Description, "resource limits exceeded"))
}

// transient reports whether a refused publish may pass if retried: the job exists but its account
// refuses gradients for now (paused or throttled for its quota: no responders), a stream leader is
// being elected, or the acknowledgement was lost. A job that no longer exists is not transient; a
// full stream is retried a bounded number of times (publishRetrying).
func (w *Worker) transient(ctx context.Context, err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse):
		_, jerr := w.c.Job(ctx, w.rec.Spec.ID) // only a job known not to exist is final
		return !errors.Is(jerr, ErrUnknownJob)
	case errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrAsyncPublishTimeout):
		return true
	case errors.As(err, &apiErr):
		return apiErr.Code == 503 || apiErr.Code == 429
	}
	return false
}

// pubError names why NATS or JetStream refused a gradient. A refusal for a full stream is a
// quota_exceeded rejection that also wraps JetStream's error (errors.As finds the APIError).
func (w *Worker) pubError(s job.Shard, rank int, err error) error {
	var rej *wire.Reject
	switch {
	case errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse):
		rej = wire.Rejectf(wire.ReasonUnknownJob, "no stream stores job %q: the job does not exist or was deleted", w.rec.Spec.ID)
	case errors.Is(err, nats.ErrMaxPayload):
		rej = wire.Rejectf(wire.ReasonOversized, "shard %d is %d bytes, more than the NATS server's max_payload %d", s.ID, s.Bytes(), w.c.nc.MaxPayload())
	case storageFull(err):
		rej = wire.Rejectf(wire.ReasonQuotaExceeded, "the gradient stream of job %q stayed full through %d retries of shard %d's gradient: it holds a few steps of every rank's gradients, and no runtime applied and purged older ones (is every shard served?)",
			w.rec.Spec.ID, w.full, s.ID)
		rej.Job, rej.Shard, rej.Rank = w.rec.Spec.ID, s.ID, rank
		return fmt.Errorf("%w (%w)", rej, err)
	default:
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum {
			rej = wire.Rejectf(wire.ReasonOversized, "shard %d: %v", s.ID, apiErr)
		}
	}
	if rej != nil {
		rej.Job, rej.Shard, rej.Rank = w.rec.Spec.ID, s.ID, rank
		return rej
	}
	return fmt.Errorf("publish gradient of shard %d: %w", s.ID, err)
}

// reconnectPoll is how often a waiting worker looks whether its connection reconnected.
const reconnectPoll = 250 * time.Millisecond

// await waits until every shard's parameters for step t are in, fetching from the stream what was
// not pushed in time, and fails on a rejection of this step.
func (w *Worker) await(ctx context.Context, t int64) error {
	w.mu.Lock()
	ready := w.ready
	var ahead []job.Shard // shards whose step-t parameters the stream held before we published
	for i, a := range w.ahead {
		if a {
			ahead = append(ahead, w.rec.Layout.Shards[i])
			w.ahead[i] = false
		}
	}
	w.mu.Unlock()
	for _, s := range ahead {
		if _, err := w.fetchShard(ctx, s, t); err != nil {
			return err
		}
	}
	if len(ahead) > 0 {
		w.markIfComplete(t)
	}
	began := time.Now()
	timer := time.NewTimer(w.fb.initial())
	defer timer.Stop()
	backoff := w.fb.after // between fetches, once the fallback has fetched
	fetched := false
	// Parameters pushed while the connection was reconnecting (a server restarted or died), or
	// dropped by a subscription that fell behind, are lost to this worker: it fetches at once
	// rather than at its next look.
	lost := w.lossMark()
	force := false
	poll := time.NewTicker(reconnectPoll)
	defer poll.Stop()
	for {
		select {
		case <-poll.C:
			if w.waitHook != nil {
				if err := w.waitHook(ctx, t); err != nil {
					return err
				}
			}
			if m := w.lossMark(); m != lost {
				lost, force = m, true
				backoff = w.fb.after
				timer.Reset(0)
			}
		case <-ready:
			w.notePushWaits(began)
			return nil
		case rej := <-w.rejects:
			if rej.Step != t || wire.GradAttempt(rej.MsgID) != w.attempt ||
				(w.attempt > 0 && (rej.Reason == wire.ReasonDuplicate || rej.Reason == wire.ReasonStaleStep)) ||
				(w.elastic && rej.Reason == wire.ReasonDuplicate) {
				// An old step's or an earlier attempt's report, or the echo of a retry: a shard that
				// took our earlier message answers duplicate (step still open) or stale (applied).
				continue
			}
			if rej.Reason == wire.ReasonStaleStep && rej.Shard >= 0 && rej.Shard < len(w.rec.Layout.Shards) {
				// The shard applied step t with this rank's gradient already: sent before a
				// restart, under the same message id. Its parameters are in the stream.
				if _, err := w.fetchShard(ctx, w.rec.Layout.Shards[rej.Shard], t); err != nil {
					return err
				}
				w.markIfComplete(t)
				continue
			}
			return rej
		case <-timer.C:
			if !force && !fetched {
				w.mu.Lock()
				first, last := w.firstPush, w.lastPush
				w.mu.Unlock()
				if due, left := w.fb.due(began, first, last, time.Now()); !due {
					timer.Reset(left) // pushes are late, not missing
					continue
				}
			}
			forced, stopped := force, false
			force, fetched = false, true
			for _, s := range w.rec.Layout.Shards {
				w.mu.Lock()
				have := w.got[s.ID] >= t
				w.mu.Unlock()
				if have {
					continue
				}
				span := w.trace.fetch(s.ID)
				w.met.fetched()
				got, err := w.fetchShard(ctx, s, t)
				telemetry.EndSpan(span, err)
				if err != nil {
					return err
				}
				if got < t && !forced {
					// The stream has not got this shard's step yet: its push is not lost but to
					// come, and the other missing shards' most likely too. Fetching them all would
					// bring a step's parameters the worker has again (a whole step's bytes on a slow
					// link); it looks again later, by the same rules. After a known loss (forced)
					// the others' pushes may be gone: it fetches them all.
					stopped = true
					break
				}
				w.markIfComplete(t)
			}
			if stopped {
				fetched = false
				timer.Reset(backoff) // no doubling: the step is under way, nothing failed
				continue
			}
			timer.Reset(backoff)
			backoff = min(2*backoff, maxFetchAfter)
		case <-ctx.Done():
			return fmt.Errorf("step %d: waiting for parameters of shards %s (%d shards): %w", t, w.lacking(t), len(w.rec.Layout.Shards), ctx.Err())
		}
	}
}

// lacking lists the shards whose parameters of step t the worker does not have, as "3, 7" (at most
// ten, then how many more), to say what a step waited for.
func (w *Worker) lacking(t int64) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ids []string
	n := 0
	for _, s := range w.rec.Layout.Shards {
		if w.got[s.ID] >= t {
			continue
		}
		if n++; n <= 10 {
			ids = append(ids, strconv.Itoa(s.ID))
		}
	}
	if n > 10 {
		ids = append(ids, fmt.Sprintf("and %d more", n-10))
	}
	return strings.Join(ids, ", ")
}

// notePushLocked records a push of the awaited step received at. w.mu is held.
func (w *Worker) notePushLocked(at time.Time) {
	if w.firstPush.IsZero() {
		w.firstPush = at
	}
	w.lastPush = at
}

// notePushWaits tells the fallback how long the step that began at began waited for its first
// push, and how long after it its last came, if a push came.
func (w *Worker) notePushWaits(began time.Time) {
	w.mu.Lock()
	first, last := w.firstPush, w.lastPush
	w.mu.Unlock()
	if !first.IsZero() {
		w.fb.note(max(0, first.Sub(began)), max(0, last.Sub(first)))
	}
}

// lossMark counts what may have lost pushes: the connection's reconnects and the messages the
// parameters subscription dropped. A change while a worker waits means a push may be gone.
func (w *Worker) lossMark() int64 {
	n := int64(w.c.nc.Stats().Reconnects)
	if d, err := w.psub.Dropped(); err == nil {
		n += int64(d)
	}
	return n
}

func (w *Worker) markIfComplete(t int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.want != t || w.missing == 0 {
		return
	}
	w.missing = 0
	for _, g := range w.got {
		if g < t {
			w.missing++
		}
	}
	if w.missing == 0 {
		close(w.ready)
	}
}

// onParams copies pushed parameters of the awaited step into vec.
func (w *Worker) onParams(m *nats.Msg) {
	received := time.Now()
	id, ok := wire.ShardFromSubject(m.Subject)
	if !ok || id >= len(w.got) {
		return
	}
	step, err := wire.ParseStep(m.Header)
	s := w.rec.Layout.Shards[id]
	dt, dtErr := wire.ParamsDtype(m.Header, m.Data, s.Len)
	if err != nil || dtErr != nil {
		// Not parameters this worker can read: ignored, as if lost. Step fetches the shard from
		// the stream after WithFetchAfter, and fails naming what is wrong if it is this message.
		return
	}
	storeMax(&w.newest, step)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.async() {
		_ = w.stageParams(id, step, m) // checked above
		w.notePushLocked(received)
		return
	}
	if w.want == 0 || step != w.want || w.got[id] >= step {
		return
	}
	wire.Decode(w.vec[s.Off:s.Off+s.Len], m.Data, dt)
	w.got[id] = step
	w.notePushLocked(received)
	w.traceReceive(m, id, step, received)
	if w.missing--; w.missing == 0 {
		close(w.ready)
	}
}

func (w *Worker) onReject(m *nats.Msg) {
	rej, err := wire.UnmarshalReject(m.Data)
	if err != nil {
		return
	}
	select {
	case w.rejects <- rej:
	default: // Step reads them; if nobody does, old reports are not worth blocking for
	}
}

// bytesOf returns the little-endian bytes of v in the worker's gradient dtype: for f32 on
// little-endian machines the memory itself; otherwise an encoding at element off of the worker's
// buffer (rank j's gradient at j*elements), made once and reused by every step.
func (w *Worker) bytesOf(v []float32, off int) []byte {
	if len(v) == 0 {
		return nil
	}
	if littleEndian && w.dtype == wire.F32 {
		return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
	}
	es := w.dtype.ElemSize()
	if n := es * len(w.vec) * len(w.ranks); len(w.enc) < n {
		w.enc = make([]byte, n)
	}
	b := w.enc[es*off : es*(off+len(v))]
	wire.Encode(b, v, w.dtype)
	return b
}

var littleEndian = func() bool { x := uint16(1); return *(*byte)(unsafe.Pointer(&x)) == 1 }()

func storeMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}
