package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// shardExec serves one shard: it gathers the N ranks of each step in rank order, applies the
// function, publishes the parameters and checkpoints.
//
// Exactly once: a snapshot (the parameters message when it is one, see paramsSnap; a checkpoint
// message otherwise) carries the stream sequence of the last gradient message it covers. The executor
// restores the newest snapshot and replays the gradient stream from the next sequence; the
// decision on every message depends only on the state and the message, so replay reproduces the
// same steps bit for bit. Gradients are purged only up to a snapshot that JetStream acknowledged.
type shardExec struct {
	r      *Runtime
	ji     *jobInfo
	shard  job.Shard
	fn     functions.Func
	ranks  int
	epoch  uint64
	key    string
	log    *slog.Logger
	gradSj string
	grads  streamRef // the stream of the shard's gradients (jobInfo.gradRef); zero for direct gradients

	weighted bool
	finite   bool       // reject NaN and Inf
	paramsDt wire.Dtype // the dtype of the parameters messages after step 0 (the job's param_dtype)
	// paramsSnap: the parameters message is the shard's snapshot, an exact copy of its whole
	// state (a stateless function, f32 parameters). Otherwise (optimizer state, or parameters
	// published rounded to bf16 while the f32 master stays here) the shard writes checkpoints: it
	// restores from them, purges gradients only up to them, and writes a last one on handover.
	paramsSnap bool
	ckptEvery  int64 // a shard that checkpoints does so every ckptEvery steps

	cancel      context.CancelFunc
	done        chan struct{}  // closed when run returns
	placement   wire.Placement // the entry that placed the shard here
	prevLocal   *shardExec     // a previous executor of the shard on this runtime, maybe still stopping
	released    chan struct{}  // closed once this executor has stopped and released the shard
	releaseOnce sync.Once
	acquired    atomic.Bool // the previous owner released the shard to this executor

	mu      sync.Mutex // guards everything below; held by the message handler
	stopped bool
	params  []float32
	state   [][]float32
	acc     []float32
	step    int64  // last applied step
	seq     uint64 // stream sequence of the last message consumed
	stepSeq uint64 // stream sequence of the message that completed step
	next    int    // next rank to fold into acc
	have    []bool // ranks received for step+1
	pend    [][]byte
	last    []byte       // the last rank's f32 payload, summed by apply with the update (functions.AddApply)
	dts     []wire.Dtype // the element type of each rank's gradient for step+1 (ranks may differ)
	weights []float64
	wsum    float64

	sync syncState // ssp and asp (syncmodes.go)
	// direct is the state of a shard of a direct-gradients job (direct.go); nil when its gradients
	// are stored in the job's gradient stream.
	direct *directState

	// Load signals, averaged over recent steps (see load.go).
	stats shardStats

	// Telemetry of the open step (see telemetry.go).
	met     *metrics.JobMetrics // nil when metrics are off
	created int64               // the job's creation time, UnixNano: part of its steps' trace ids
	times   stepTimes
	trace   stepTrace

	outs    chan *outBuf // free parameter buffers: at most cap(outs) publishes in flight
	ckptBuf *outBuf

	// A user function's failure (functionFailed): written by the handler, read by serve, which
	// then stops to restore and replay. fnFailures counts failures in a row (guarded by mu).
	fnFailed   chan error
	fnFailures int

	// Written by ack callbacks, which must never take mu: the handler may hold mu while it waits
	// for a buffer that only the acker can free.
	ckptBusy atomic.Bool   // a checkpoint is in flight and owns ckptBuf
	ckptFree chan struct{} // signalled when an asynchronous checkpoint gives ckptBuf back
	ckptAt   atomic.Int64  // step of the newest stored checkpoint
}

// maxPullBytes bounds the gradient bytes one shard's consumer buffers. All the shards a runtime
// serves share its NATS connection, and the server cuts a connection with more than max_pending
// bytes in flight (a slow consumer), so the sum over a runtime's shards must stay under it: 16 MiB
// a shard keeps 30 shards under 512 MiB (docs/PROTOCOL.md, "Server requirements").
const maxPullBytes = 16 << 20

// checkpointEvery is how many steps a shard with slots state vectors and ranks ranks applies between
// two checkpoints: about as many as make the checkpoint's bytes (1+slots vectors) those of the
// gradients it lets go (ranks vectors a step), and at most maxCheckpointEvery.
//
// The bound keeps every gradient a shard still needs within its stream's window (BSP; ssp's window
// adds what its held steps need). When the checkpoint of step c+k is written, the gradients of steps
// c+1..c+k are needed (the stored checkpoint is c's), and before JetStream acknowledges it the
// workers may send steps up to c+k+3: the parameters of c+k and c+k+1 are published without waiting
// (two buffers), and that of c+k+2 waits only for c+k's acknowledgement, which the checkpoint's
// follows. So k+3 steps <= store.StorageWindow: then the stream refuses a gradient only while the
// purge of gradients a stored checkpoint covers is due. A user function may declare 8 state
// vectors: with 1 rank the unbounded interval is 9 steps, and the stream would fill with 8 steps no
// checkpoint covers, refuse the ninth, and no checkpoint would ever come.
func checkpointEvery(slots, ranks int) int64 {
	return min(max(1, int64((1+slots)/ranks)), maxCheckpointEvery)
}

const maxCheckpointEvery = store.StorageWindow - 3

// outBuf is a reusable outgoing message; it returns to its pool when JetStream acknowledges it.
type outBuf struct {
	msg  *nats.Msg
	data []byte
}

func newShardExec(r *Runtime, ji *jobInfo, shard int, epoch uint64) (*shardExec, error) {
	fn, err := r.newFunc(&ji.rec.Spec)
	if err != nil {
		return nil, err
	}
	s := ji.rec.Layout.Shards[shard]
	n := ji.rec.Spec.Ranks
	x := &shardExec{
		r: r, ji: ji, shard: s, fn: fn, ranks: n, epoch: epoch,
		key:       wire.PlacementKey(ji.rec.Spec.ID, shard),
		log:       r.log.With("job", ji.rec.Spec.ID, "shard", shard),
		gradSj:    wire.GradSubject(ji.rec.Spec.ID, shard),
		grads:     ji.gradRef(shard),
		weighted:  functions.IsWeighted(fn),
		finite:    !ji.rec.Spec.AllowNonFinite,
		paramsDt:  ji.rec.Spec.ParamsDtype(),
		done:      make(chan struct{}),
		released:  make(chan struct{}),
		params:    make([]float32, s.Len),
		acc:       make([]float32, s.Len),
		have:      make([]bool, n),
		pend:      make([][]byte, n),
		dts:       make([]wire.Dtype, n),
		weights:   make([]float64, n),
		outs:      make(chan *outBuf, 2),
		ckptFree:  make(chan struct{}, 1),
		fnFailed:  make(chan error, 1),
		ckptEvery: checkpointEvery(fn.Slots(), n),
		met:       r.met.Job(ji.rec.Spec.ID),
		created:   ji.rec.Created.UnixNano(),
	}
	x.paramsSnap = fn.Slots() == 0 && x.paramsDt == wire.F32
	if ji.rec.Spec.DirectGradients() {
		x.direct = newDirectState(n)
		x.ckptEvery = 1 // its snapshots bound what the workers must keep (direct.go, rule 2)
	}
	x.initSync(ji.rec.Spec.Sync, ji.rec.Spec.Staleness)
	for range 2 {
		x.outs <- &outBuf{msg: nats.NewMsg(wire.ParamsSubject(ji.rec.Spec.ID, shard)), data: make([]byte, s.Len*x.paramsDt.ElemSize())}
	}
	if fn.Slots() > 0 {
		x.state = make([][]float32, fn.Slots())
		for i := range x.state {
			x.state[i] = make([]float32, s.Len)
		}
	}
	if !x.paramsSnap {
		x.ckptBuf = &outBuf{msg: nats.NewMsg(wire.CkptSubject(ji.rec.Spec.ID, shard)), data: make([]byte, (1+fn.Slots())*s.Bytes())}
	}
	return x, nil
}

// run restores the shard and consumes its gradients until ctx is done, retrying on failure.
func (x *shardExec) run(ctx context.Context) {
	defer close(x.done)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		began := time.Now()
		err := x.serve(ctx)
		if err == nil || ctx.Err() != nil {
			break
		}
		if time.Since(began) > 30*time.Second {
			backoff = 100 * time.Millisecond // served a while: a new failure, not the same one again
		}
		x.log.Warn("shard executor failed; retrying", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	x.finish()
}

func (x *shardExec) serve(ctx context.Context) error {
	if prev := x.prevLocal; prev != nil {
		select { // this runtime's previous executor of the shard must have released it
		case <-prev.released:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	prev, err := x.awaitRelease(ctx)
	if err != nil {
		return err
	}
	released := prev.Stopped
	x.acquired.Store(true)
	if err := x.restore(ctx); err != nil {
		return err
	}
	x.mu.Lock()
	start, fromStep := x.seq+1, x.step
	// The previous owner decided on the gradients up to prev.Decided and reported its refusals:
	// replay decides them again, the same way (the same state and messages), and reports nothing.
	x.sync.quietTo = max(x.sync.quietTo, prev.Decided)
	x.stopped = false
	x.mu.Unlock()
	select { // a failure of the function before this restore is behind us
	case <-x.fnFailed:
	default:
	}
	if x.direct != nil {
		return x.serveDirect(ctx, released)
	}
	// Pull room for at least two of the largest messages the job's stream accepts: a message the
	// consumer could not pull would stall the shard for good.
	msgBytes := max(x.shard.Bytes()+wire.Headroom, int(store.GradMaxMsgSize(x.ji.rec)))
	gc := newGradConsumer(x.grads, x.gradSj, start, x.handle,
		// Buffer up to two steps of this shard's gradients in the client, within maxPullBytes (and
		// at least two messages): flow control, never a slow-consumer drop. (Were one to happen,
		// the consumer starts over from the last sequence seen: a replay, not a loss.)
		jetstream.PullMaxBytes(max(min(2*x.ranks*msgBytes, maxPullBytes), 2*msgBytes)))
	cctx, stopConsumer := context.WithCancel(ctx)
	failed := make(chan error, 1)
	consuming := make(chan struct{})
	go func() {
		defer close(consuming)
		if err := gc.run(cctx, x.log.Warn); err != nil {
			failed <- err
		}
	}()
	defer func() { stopConsumer(); <-consuming }()
	select {
	case <-gc.started:
	case err := <-failed:
		return err
	case <-ctx.Done():
		return nil
	}
	x.log.Debug("serving shard", "from_step", fromStep, "from_seq", start)
	if !released.IsZero() {
		pause := x.r.now().Sub(released)
		x.r.stats.addPause(pause)
		x.r.met.Migration(pause)
		x.log.Debug("shard taken over", "from", x.placement.From, "pause", pause)
	}

	var sweep <-chan time.Time
	if x.shard.ID == 0 { // one shard per job sweeps messages addressed to shards that do not exist
		t := time.NewTicker(x.r.sweep)
		defer t.Stop()
		sweep = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case err := <-x.fnFailed:
			return err
		case <-sweep:
			x.sweepUnknownShards(ctx)
		}
	}
}

// restore loads the newest snapshot of the shard (restoreSnapshot) and asks for the gradients
// before its replay start to be purged.
//
// The owner before may have stopped before its purger carried out the purge of that snapshot (a
// SIGKILL, a purge still pending or failing at its stop). Its gradients hold places in the
// stream's bound, and no later snapshot comes to purge them if they fill it: this owner would
// wait for the next step's gradients, which the full stream refuses, for good. Purging them here
// relies on the invariant every purge relies on: the gradients of a shard's subject below the
// replay start of a stored snapshot are never read again, by this owner or any later one (each
// restores the newest stored snapshot, whose replay start is no lower).
func (x *shardExec) restore(ctx context.Context) error {
	if err := x.useCkptHome(ctx); err != nil {
		return err
	}
	if err := x.restoreSnapshot(ctx); err != nil {
		return err
	}
	x.mu.Lock()
	from := x.seq + 1 // the snapshot's replay start (load)
	x.mu.Unlock()
	if from > 1 {
		x.r.purger.schedule(x.grads, x.gradSj, from)
	}
	return nil
}

// restoreSnapshot loads the newest snapshot of the shard: its checkpoint, or when the parameters
// message is a snapshot (paramsSnap) its latest parameters if newer. A shard that checkpoints
// restores from parameters only at step 0 (always f32), and then writes its first checkpoint.
// With neither (init "upload"), it waits for the step-0 parameters.
func (x *shardExec) restoreSnapshot(ctx context.Context) error {
	for {
		stream := wire.ParamsStream(x.ji.rec.Spec.ID) // read from its leader (lastFromLeader says why)
		ck, ckErr := x.lastCkpt(ctx)
		pm, pmErr := lastFromLeader(ctx, x.r.nc, stream, wire.ParamsSubject(x.ji.rec.Spec.ID, x.shard.ID))
		for _, err := range []error{ckErr, pmErr} {
			if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				return fmt.Errorf("read snapshot: %w", err)
			}
		}
		if m := x.foreignSnapshot(ck, pm); m != nil {
			if err := x.dropForeign(ctx, m); err != nil {
				return err
			}
			continue // the message before it on its subject, if any, is the newest again
		}
		// A parameters message is a snapshot when it is exact: f32, of a stateless function. That
		// is every one of an f32 job, and of a bf16 job its step 0, or one that a runtime of before
		// param_dtype wrote while it served the shard (a rolling upgrade: it purged the gradients
		// behind it and wrote no checkpoint).
		pmSnap := pm != nil && x.fn.Slots() == 0 && snapDtype(pm) == wire.DtypeF32
		switch {
		case ck != nil && (pm == nil || !pmSnap || snapStep(ck) >= snapStep(pm)):
			return x.load(ck, true)
		case pm != nil && (pmSnap || snapStep(pm) == 0):
			if err := x.load(pm, false); err != nil {
				return err
			}
			if !x.paramsSnap { // the first checkpoint: replay needs it once step 0 is overwritten
				return x.checkpointSync(ctx, false)
			}
			return nil
		case pm != nil:
			return fmt.Errorf("shard has parameters at step %d but no checkpoint (of its optimizer state, or of the f32 parameters behind its %s ones)", snapStep(pm), x.paramsDt)
		}
		if x.ji.init != nil { // init "upload": the step 0 a worker uploaded, once checked
			done, err := x.adoptUpload(ctx)
			if err != nil {
				return err
			}
			if done { // restore from the step 0 just published, as from any (first checkpoint included)
				continue
			}
		}
		select { // wait for the upload
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// foreignSnapshot returns whichever of ck and pm is a snapshot of an earlier incarnation of the
// job, or nil. The executor of a deleted job may still be stopping when the job is created again:
// a checkpoint or parameters message it sent just then (its send delayed on a loaded node, after it
// checked the stream) lands in the new incarnation's parameter stream, under the same subject, as
// its newest message. Its message id gives it away: it names the incarnation that sent it
// (wire.Incarnation), whatever the step or the job's gradients. A stray of a runtime of before
// incarnations (no name in the id) may still be told by its gradient sequence: every snapshot
// after step 0 covers a gradient of its own incarnation's stream, whose sequences start at that
// stream's FirstSeq, above every sequence of an earlier incarnation (store.FirstSeq). A
// checkpoint from a node's stream (ckpthome.go) is checked as lastCkpt reads it, and deleted from
// that stream: dropForeign deletes from the parameter stream.
func (x *shardExec) foreignSnapshot(ck, pm *jetstream.RawStreamMsg) *jetstream.RawStreamMsg {
	id := x.ji.rec.Spec.ID
	for _, m := range []*jetstream.RawStreamMsg{ck, pm} {
		if m != nil && (m == pm || m.Subject == wire.CkptSubject(id, x.shard.ID)) && x.ji.namesAnother(m) {
			return m
		}
	}
	if x.direct != nil || x.grads.stream == nil || x.grads.first <= 1 {
		return nil
	}
	for _, m := range []*jetstream.RawStreamMsg{ck, pm} {
		if m == nil || snapStep(m) == 0 {
			continue
		}
		if seq, err := wire.ParseSeq(m.Header); err == nil && seq > 0 && seq < x.grads.first {
			return m
		}
	}
	return nil
}

// dropForeign deletes m, a snapshot of an earlier incarnation (foreignSnapshot), from the
// incarnation's parameter stream: left there, it would be every restore's newest snapshot.
func (x *shardExec) dropForeign(ctx context.Context, m *jetstream.RawStreamMsg) error {
	params := x.ji.streams[len(x.ji.streams)-1]
	x.log.Warn("a snapshot of an earlier incarnation of the job is in its parameter stream; deleting it",
		"subject", m.Subject, "stream_seq", m.Sequence, "step", snapStep(m), "seq", m.Header.Get(wire.HdrSeq))
	if err := params.current(ctx); err != nil {
		return fmt.Errorf("delete a snapshot of an earlier incarnation: %w", err)
	}
	if err := params.stream.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("delete a snapshot of an earlier incarnation: %w", err)
	}
	return nil
}

// adoptUpload makes the shard's uploaded initial parameters its step-0 parameters: parameters are
// written only by runtimes, so a worker's upload goes to the job's init stream, and the runtime
// that serves the shard checks it (length, dtype, finite values where the job forbids others) and
// publishes it as step 0. An upload it refuses is reported like a bad gradient and deleted, so
// that the worker can upload again; an accepted one stays, written once (the stream refuses a
// second message on the subject). It reports whether step 0 is published; restore then reads it.
func (x *shardExec) adoptUpload(ctx context.Context) (bool, error) {
	id := x.ji.rec.Spec.ID
	m, err := x.ji.init.GetLastMsgForSubject(ctx, wire.InitSubject(id, x.shard.ID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the uploaded parameters: %w", err)
	}
	var rej *wire.Reject
	switch step, perr := wire.ParseStep(m.Header); {
	case perr != nil:
		rej = wire.Rejectf(wire.ReasonBadHeader, "upload of shard %d: %v", x.shard.ID, perr)
	case step != 0:
		rej = wire.Rejectf(wire.ReasonBadHeader, "upload of shard %d: %s must be 0, got %d", x.shard.ID, wire.HdrStep, step)
	case m.Header.Get(wire.HdrDtype) != "" && m.Header.Get(wire.HdrDtype) != wire.DtypeF32:
		rej = wire.Rejectf(wire.ReasonBadDtype, "upload of shard %d: dtype %q, want %s", x.shard.ID, m.Header.Get(wire.HdrDtype), wire.DtypeF32)
	case len(m.Data) != x.shard.Bytes():
		rej = wire.Rejectf(wire.ReasonBadLength, "upload of shard %d: %d bytes, the shard has %d", x.shard.ID, len(m.Data), x.shard.Bytes())
	case x.finite && functions.NonFinite(m.Data) >= 0:
		rej = wire.Rejectf(wire.ReasonNonFinite, "upload of shard %d holds NaN or Inf", x.shard.ID)
	}
	if rej != nil {
		rej.Job, rej.Shard, rej.MsgID = id, x.shard.ID, m.Header.Get(wire.HdrMsgID)
		x.r.reject(rej, m.Header.Get(wire.HdrReplyTo), x.ji.incarnation)
		if err := x.ji.init.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, fmt.Errorf("delete the refused upload: %w", err)
		}
		return false, nil
	}
	if err := store.PublishParams(ctx, x.r.js, id, x.ji.inc, x.shard.ID, 0, 0, m.Data); err != nil {
		return false, err
	}
	return true, nil
}

// snapDtype is the dtype of a stored parameters message: its Fanin-Dtype, f32 when absent.
func snapDtype(m *jetstream.RawStreamMsg) string {
	if dt := m.Header.Get(wire.HdrDtype); dt != "" {
		return dt
	}
	return wire.DtypeF32
}

func snapStep(m *jetstream.RawStreamMsg) int64 {
	s, _ := wire.ParseStep(m.Header)
	return s
}

func (x *shardExec) load(m *jetstream.RawStreamMsg, withState bool) error {
	step, err := wire.ParseStep(m.Header)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	seq, err := wire.ParseSeq(m.Header)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	vecs := 1
	if withState {
		vecs += len(x.state)
	}
	if len(m.Data) != vecs*x.shard.Bytes() {
		return fmt.Errorf("snapshot at step %d has %d bytes, want %d", step, len(m.Data), vecs*x.shard.Bytes())
	}
	if dt := snapDtype(m); dt != wire.DtypeF32 {
		return fmt.Errorf("snapshot at step %d is %s, not f32", step, dt) // a rounded copy is no snapshot
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.shard.Bytes()
	wire.Decode(x.params, m.Data[:b], wire.F32)
	if withState {
		for i, s := range x.state {
			wire.Decode(s, m.Data[(i+1)*b:(i+2)*b], wire.F32)
		}
		x.ckptAt.Store(step)
	} else if len(x.state) > 0 {
		if err := functions.InitStateErr(x.fn, x.state); err != nil {
			x.reportFunctionFailure(err) // counted like a failed step: it may pause the job
			return fmt.Errorf("initial state: %w", err)
		}
	}
	from, err := x.loadSync(m.Header, seq)
	if err != nil {
		return fmt.Errorf("snapshot at step %d: %w", step, err)
	}
	x.step, x.seq, x.stepSeq = step, from-1, seq
	x.resetGather()
	return nil
}

// handle is the consumer callback: it runs once per gradient message, in stream order.
func (x *shardExec) handle(m jetstream.Msg) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.stopped {
		return
	}
	seq, pending, ok := wire.AckInfo(m.Reply())
	if !ok {
		x.log.Error("message without stream sequence", "reply", m.Reply())
		return
	}
	x.stats.pending = pending
	x.times.stored = ackStamp(m.Reply())
	x.handleSeq(m, seq)
}

// handleSeq decides on the message at stream sequence seq. x.mu is held.
func (x *shardExec) handleSeq(m jetstream.Msg, seq uint64) {
	if seq <= x.seq { // redelivered after a consumer reset: already decided
		return
	}
	x.seq = seq
	data := m.Data()
	meta, rej := wire.ParseGradHeaders(m.Headers())
	if rej == nil {
		rej = x.admit(&meta, data, seq)
	}
	if rej != nil {
		// A refusal is never applied, and the message goes at once: it must not hold a place in
		// the stream's bound (purger says why that is safe).
		x.r.purger.remove(x.grads, x.gradSj, seq)
	}
	if rej != nil && seq <= x.sync.quietTo {
		return // decided (and reported) before the restore this replay follows
	}
	if rej != nil {
		rej.Job, rej.Shard = x.ji.rec.Spec.ID, x.shard.ID
		if h := m.Headers(); h != nil {
			rej.MsgID = h.Get(wire.HdrMsgID)
		}
		if rej.Step == 0 {
			rej.Step = meta.Step
		}
		if rej.Rank < 0 && meta.Rank < x.ranks { // -1 when it did not parse
			rej.Rank = meta.Rank
		}
		x.r.reject(rej, meta.ReplyTo, x.ji.incarnation)
		return
	}
	x.r.stats.bytesIn.Add(int64(len(data)))
	x.stats.received(len(data))
	x.met.Gradient(len(data))
	switch {
	case x.sync.mode == modeSSP && meta.Step > x.step+1:
		x.hold(&meta, data, seq)
		return
	case x.sync.mode == modeSSP:
		x.sync.curSeq[meta.Rank] = seq
	case x.sync.mode == modeASP:
		x.takeCore()
		ok := x.applyOne(&meta, data)
		x.giveCore()
		if ok {
			x.snapshot()
		}
		return
	}
	queued := time.Now()
	first := x.next == 0 && !x.anyRank()
	if first {
		x.stats.stepStart = queued
	}
	x.observeGradient(m, meta.Step, meta.Rank, first, queued)
	x.takeCore()
	started := time.Now()
	x.times.folding, x.times.lastRank = started, meta.Rank
	x.fold(meta.Rank, meta.Weight, meta.Dtype, data)
	complete := x.next == x.ranks
	var apply time.Duration
	if complete {
		var ok bool
		if apply, ok = x.applyTimed(); !ok {
			x.giveCore()
			return
		}
	}
	x.giveCore()
	work := time.Since(started)
	x.stats.addWork(started.Sub(queued), work, apply)
	x.r.stats.workNanos.Add(int64(work))
	if complete {
		if x.stats.stepDone(time.Now()) {
			x.r.reportSoon()
		}
		x.snapshot()
		for x.sync.mode == modeSSP && x.promote() { // the next step was held whole: apply it too
			x.takeCore()
			ok := x.apply()
			x.giveCore()
			if !ok {
				return
			}
			x.snapshot()
		}
	}
}

// applyTimed applies the step (apply) and says how long the update took, for the load reports.
func (x *shardExec) applyTimed() (time.Duration, bool) {
	t0 := time.Now()
	ok := x.apply()
	return time.Since(t0), ok
}

// snapshot publishes the parameters of the step just applied, and a checkpoint when one is due.
func (x *shardExec) snapshot() {
	x.publishParams()
	if !x.paramsSnap && x.step-x.ckptAt.Load() >= x.ckptEvery {
		x.checkpointAsync()
	}
}

// admit checks a gradient against the shard's state and returns why it is refused, or nil.
func (x *shardExec) admit(meta *wire.GradMeta, data []byte, seq uint64) *wire.Reject {
	if meta.Rank >= x.ranks {
		return wire.Rejectf(wire.ReasonRankRange, "rank %d is not in 0..%d (the job has %d ranks)", meta.Rank, x.ranks-1, x.ranks)
	}
	if rej := x.admitStep(meta, seq); rej != nil {
		return rej
	}
	return wire.CheckPayload(data, meta.Dtype, x.shard.Len, x.shard.ID, x.finite)
}

// fold adds rank's gradient to the running sum if it is the next rank in order, then every buffered
// rank that follows it; a rank that arrives early waits in pend (its payload, not a copy). A
// 16-bit payload is converted exactly to float32 as it is added (functions.AddLE16): the sum is
// the f32 rank-order sum of the converted values.
func (x *shardExec) fold(rank int, w float64, dt wire.Dtype, data []byte) {
	x.have[rank] = true
	x.weights[rank] = w
	x.dts[rank] = dt
	if rank != x.next {
		x.pend[rank] = data
		return
	}
	x.foldOne(data)
	for x.next < x.ranks && x.have[x.next] {
		data, x.pend[x.next] = x.pend[x.next], nil
		x.foldOne(data)
	}
}

func (x *shardExec) foldOne(data []byte) {
	w, dt := x.weights[x.next], x.dts[x.next]
	switch {
	case x.weighted && x.next == 0:
		functions.ScaleLE16(x.acc, float32(w), data, dt)
	case x.weighted:
		functions.AxpyLE16(x.acc, float32(w), data, dt)
	case x.next == 0:
		functions.CopyLE16(x.acc, data, dt)
	case x.next == x.ranks-1 && dt == wire.F32:
		x.last = data // apply adds it in the same pass as the function's update
	default:
		functions.AddLE16(x.acc, data, dt)
	}
	if x.weighted {
		x.wsum += w
	} else {
		x.wsum++
	}
	x.next++
}

// apply runs the function on the gathered sum. It reports false when a user function failed
// (functionFailed has stopped the executor; the shard is unchanged).
func (x *shardExec) apply() bool {
	start := time.Now()
	u := &functions.Update{
		Params: x.params, Grad: x.acc, State: x.state,
		Step: x.step + 1, Ranks: x.ranks, WeightSum: x.wsum,
	}
	if _, fallible := x.fn.(functions.Fallible); fallible {
		if x.last != nil {
			functions.AddLE(x.acc, x.last)
			x.last = nil
		}
		if err := functions.ApplyErr(x.fn, u); err != nil {
			x.functionFailed(err)
			return false
		}
		x.fnFailures = 0
	} else if x.last != nil {
		functions.AddApply(x.fn, u, x.last)
	} else {
		x.fn.Apply(u)
	}
	end := time.Now()
	x.step++
	x.stepSeq = x.seq
	x.noteApplied()
	x.resetGather()
	x.r.stats.invocations.Add(1)
	x.r.stats.fnNanos.Add(int64(end.Sub(start)))
	x.times.fnStart, x.times.fnEnd = start, end
	return true
}

func (x *shardExec) anyRank() bool {
	for _, h := range x.have {
		if h {
			return true
		}
	}
	return false
}

func (x *shardExec) resetGather() {
	x.next, x.wsum, x.last = 0, 0, nil
	clear(x.have)
	clear(x.pend)
}

// publishParams publishes the parameters after x.step (x.step >= 1), in the job's param_dtype:
// the f32 parameters, or their bf16 rounding (nearest even) while x.params stays the f32 master.
// It blocks only when two earlier publishes of this shard are still unacknowledged.
func (x *shardExec) publishParams() {
	ob := <-x.outs
	wire.Encode(ob.data, x.params, x.paramsDt)
	ob.msg.Data = ob.data
	wire.SetParamsHeaders(ob.msg.Header, x.ji.rec.Spec.ID, x.ji.inc, x.shard.ID, x.step, x.stepSeq, x.paramsDt)
	x.setSyncHeaders(ob.msg.Header)
	done := x.completeStep(ob.msg)
	purgeTo := uint64(0)
	if x.paramsSnap { // the parameters are the snapshot: once stored, older gradients can go
		purgeTo = x.replayFrom()
	}
	step := x.step
	x.r.acks.submit(ob.msg, x.current, func(ok bool) {
		done.acked(ok)
		if ok {
			x.purgeGrads(purgeTo)
		}
		x.direct.noteStored(step, true, ok)
		x.outs <- ob
	})
}

// checkpointAsync writes parameters and optimizer state unless a checkpoint is still in flight;
// the hot path never waits for it.
func (x *shardExec) checkpointAsync() {
	if !x.ckptBusy.CompareAndSwap(false, true) {
		return
	}
	x.fillCkpt()
	purgeTo := x.replayFrom()
	step := x.step
	x.r.acks.submit(x.ckptBuf.msg, x.current, func(ok bool) {
		if ok {
			x.purgeGrads(purgeTo)
			storeMax(&x.ckptAt, step)
		}
		x.direct.noteStored(step, false, ok)
		x.ckptBusy.Store(false)
		select { // wake a checkpointSync waiting for the buffer
		case x.ckptFree <- struct{}{}:
		default:
		}
	})
}

func (x *shardExec) fillCkpt() {
	b := x.shard.Bytes()
	wire.Encode(x.ckptBuf.data[:b], x.params, wire.F32)
	for i, s := range x.state {
		wire.Encode(x.ckptBuf.data[(i+1)*b:(i+2)*b], s, wire.F32)
	}
	h := x.ckptBuf.msg.Header
	wire.SetCheckpointHeaders(h, x.ji.rec.Spec.ID, x.ji.inc, x.shard.ID, x.step, x.stepSeq)
	x.setSyncHeaders(h)
	x.ckptBuf.msg.Data = x.ckptBuf.data
}

// checkpointSync writes a checkpoint and waits for JetStream to store it. With onlyNewer, it
// writes nothing when the newest stored checkpoint (an asynchronous one it may have waited for)
// already covers the last applied step.
func (x *shardExec) checkpointSync(ctx context.Context, onlyNewer bool) error {
	for !x.ckptBusy.CompareAndSwap(false, true) { // an asynchronous checkpoint owns the buffer
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-x.ckptFree:
		case <-time.After(5 * time.Millisecond): // in case the wake-up went to an earlier waiter
		}
	}
	defer x.ckptBusy.Store(false)
	x.mu.Lock()
	if onlyNewer && x.step <= x.ckptAt.Load() {
		x.mu.Unlock()
		return nil
	}
	x.fillCkpt()
	step, purgeTo := x.step, x.replayFrom()
	x.mu.Unlock()
	// Written when the shard starts or stops, perhaps long after its job was deleted and created
	// again: the checkpoint must not land in the new incarnation's stream.
	if err := x.current(ctx); err != nil {
		return fmt.Errorf("checkpoint at step %d: %w", step, err)
	}
	if _, err := x.r.js.PublishMsg(ctx, x.ckptBuf.msg, noResend); err != nil { // checked just now: no resend later (noResend)
		return fmt.Errorf("checkpoint at step %d: %w", step, err)
	}
	storeMax(&x.ckptAt, step)
	x.purgeGrads(purgeTo)
	x.direct.noteStored(step, false, true)
	return nil
}

// purgeGrads asks for the shard's gradients below sequence upTo to be purged from the job's
// gradient stream; a direct-gradients job has none.
func (x *shardExec) purgeGrads(upTo uint64) {
	if x.direct == nil && upTo > 0 {
		x.r.purger.schedule(x.grads, x.gradSj, upTo)
	}
}

func storeMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// finish runs when the executor stops: no more messages are handled, in-flight publishes are
// awaited, and a shard that checkpoints writes a final checkpoint so the next owner replays nothing.
func (x *shardExec) finish() {
	if l, ok := x.fn.(*lazyFunc); ok {
		defer l.close()
	}
	x.mu.Lock()
	x.stopped = true
	dirty := !x.paramsSnap && x.step > x.ckptAt.Load()
	x.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range cap(x.outs) { // wait until every parameter publish is acknowledged
		select {
		case ob := <-x.outs:
			defer func() { x.outs <- ob }()
		case <-ctx.Done():
			x.log.Warn("parameters still unacknowledged at stop; the next owner will replay them")
			return
		}
	}
	if dirty {
		if err := x.checkpointSync(ctx, true); err != nil {
			x.log.Warn("final checkpoint failed; the next owner will replay from the previous one", "err", err)
		}
	}
}
