package runtime

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/wire"
)

// Direct gradients (spec gradients: direct, bsp only). The workers send each gradient to the
// runtime that serves the shard as a core NATS request on the shard's gradient subject; nothing
// stores it. The reply is a receipt (an empty body, HdrStep the shard's last applied step) or the
// rejection. Exactly once rests on three rules (docs/PROTOCOL.md, "Direct gradients"):
//
//  1. The shard decides in memory, by (step, rank): a gradient of a step it applied, or one it
//     already holds, is answered with a receipt and ignored; one of the next step is folded; one of
//     the step after is held (a worker that saw the previous owner's parameters of step t+1 before
//     this owner restored step t sends step t+2 before the others have sent t+1 again); anything
//     further is refused (future_step).
//  2. The parameters of step t+1 are published only once JetStream stored the snapshot of step t
//     (the parameters message when it is one, else the checkpoint, written every step). So the
//     newest stored snapshot is never more than one step behind any parameters a worker has seen,
//     and a new owner that restores it needs gradients of at most the two steps after it, which
//     every worker still keeps (a worker keeps step t's gradients until it holds step t+1's
//     parameters).
//  3. An owner that takes the shard over (restore after a crash, a migration, a restart) asks
//     the workers, on ResendSubject, to send again from the step after its snapshot.
//
// Fencing reuses the handover: a new owner subscribes only once the previous one released the
// shard (or is gone), and an executor that stopped answers nothing, so a gradient is never
// receipted by a runtime that will not fold it.

// directState is what a direct-gradients shard keeps beside shardExec's gather state.
type directState struct {
	sub *nats.Subscription
	// held are the gradients of step+2 received while step+1 is gathered (rule 1), by rank; guarded
	// by shardExec.mu.
	held     []directHeld
	stored   chan struct{} // signalled when a snapshot is stored: a publish waiting on it looks again
	failed   chan error    // a snapshot JetStream did not store: the executor restores again
	paramsAt atomic.Int64  // the newest step whose parameters message JetStream stored
}

type directHeld struct {
	ok     bool
	weight float64
	dtype  wire.Dtype
	data   []byte
}

func newDirectState(ranks int) *directState {
	return &directState{held: make([]directHeld, ranks), stored: make(chan struct{}, 1), failed: make(chan error, 1)}
}

// noteStored records that the snapshot of step (a parameters message when params, else a
// checkpoint) was stored, or not (ok false: the executor must restore again).
func (d *directState) noteStored(step int64, params, ok bool) {
	if d == nil {
		return
	}
	if !ok {
		select {
		case d.failed <- fmt.Errorf("the snapshot of step %d was not stored", step):
		default:
		}
		return
	}
	if params {
		storeMax(&d.paramsAt, step)
	}
	select {
	case d.stored <- struct{}{}:
	default:
	}
}

// storedStep is the newest step whose snapshot JetStream stored.
func (x *shardExec) storedStep() int64 {
	if x.paramsSnap {
		return x.direct.paramsAt.Load()
	}
	return x.ckptAt.Load()
}

// serveDirect serves a restored shard of a direct-gradients job until ctx is done: it subscribes
// to the shard's gradient subject, asks the workers to send again what the snapshot does not
// cover, and answers every gradient.
func (x *shardExec) serveDirect(ctx context.Context, released time.Time) error {
	x.mu.Lock()
	if x.paramsSnap {
		x.direct.paramsAt.Store(x.step) // the snapshot just restored
	}
	from := x.step + 1
	clear(x.direct.held)
	x.mu.Unlock()
	select { // a failure of the executor's previous run is not this one's
	case <-x.direct.failed:
	default:
	}
	// Before subscribing: the notice should follow the subscription at once, or a worker whose
	// gradient the new subscription already folded is asked for it again (harmless, but bytes).
	if err := x.republishRestored(ctx); err != nil {
		return err
	}
	sub, err := x.r.nc.Subscribe(x.gradSj, x.handleDirect)
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", x.gradSj, err)
	}
	x.direct.sub = sub
	defer func() { _ = sub.Unsubscribe() }()
	// Two steps of every rank's gradient may arrive at once (rule 1), and a worker has at most
	// its window of requests unanswered: room for them all, never a dropped message.
	msgBytes := x.shard.Bytes() + wire.Headroom
	_ = sub.SetPendingLimits(-1, max(2*x.ranks*msgBytes, 64<<20))
	fctx, cancel := context.WithTimeout(ctx, createTimeout)
	err = x.r.nc.FlushWithContext(fctx) // subscribed before the workers are asked
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("subscribe to %s: %w", x.gradSj, err)
	}
	resend := nats.NewMsg(wire.ResendSubject(x.ji.rec.Spec.ID, x.shard.ID))
	resend.Header.Set(wire.HdrStep, strconv.FormatInt(from, 10))
	if err := x.r.nc.PublishMsg(resend); err != nil {
		return fmt.Errorf("ask the workers to send again: %w", err)
	}
	x.log.Debug("serving shard (direct gradients)", "from_step", from)
	if !released.IsZero() {
		pause := x.r.now().Sub(released)
		x.r.stats.addPause(pause)
		x.r.met.Migration(pause)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-x.direct.failed:
		return err
	case err := <-x.fnFailed:
		return err
	}
}

// republishRestored publishes the parameters of the step a checkpoint restored when the stream
// lacks them: the previous owner may have applied a step and checkpointed it at its stop without
// publishing its parameters (it waited for the snapshot before, rule 2), and the workers wait for
// them. A shard whose parameters message is its snapshot restored from that very message.
func (x *shardExec) republishRestored(ctx context.Context) error {
	if x.paramsSnap {
		return nil
	}
	id := x.ji.rec.Spec.ID
	pm, err := lastFromLeader(ctx, x.r.nc, wire.ParamsStream(id), wire.ParamsSubject(id, x.shard.ID))
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("read the shard's parameters: %w", err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.step > 0 && (pm == nil || snapStep(pm) < x.step) {
		x.publishParams()
	}
	return nil
}

// handleDirect is the gradient subscription's callback: it runs once per request, one at a time.
func (x *shardExec) handleDirect(m *nats.Msg) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.stopped { // no longer (or not yet) the owner: no receipt, the worker asks the next one
		return
	}
	meta, rej := wire.ParseGradHeaders(m.Header)
	fold, hold := false, false
	if rej == nil {
		fold, hold, rej = x.admitDirect(&meta, m.Data)
	}
	if rej != nil {
		x.refuseDirect(m, &meta, rej)
		return
	}
	x.receipt(m)
	switch {
	case hold:
		x.direct.held[meta.Rank] = directHeld{ok: true, weight: meta.Weight, dtype: meta.Dtype, data: m.Data}
		return
	case !fold:
		return // applied or held already: a re-send
	}
	x.r.stats.bytesIn.Add(int64(len(m.Data)))
	x.stats.received(len(m.Data))
	x.met.Gradient(len(m.Data))
	x.foldDirect(meta.Rank, meta.Weight, meta.Dtype, m.Data)
}

// admitDirect decides on a gradient by (step, rank) against the shard's state (rule 1): fold it,
// hold it, answer it and ignore it (neither), or refuse it.
func (x *shardExec) admitDirect(meta *wire.GradMeta, data []byte) (fold, hold bool, rej *wire.Reject) {
	switch {
	case meta.Rank >= x.ranks:
		return false, false, wire.Rejectf(wire.ReasonRankRange, "rank %d is not in 0..%d (the job has %d ranks)", meta.Rank, x.ranks-1, x.ranks)
	case meta.Step <= x.step:
		return false, false, nil
	case meta.Step == x.step+1 && x.have[meta.Rank]:
		return false, false, nil
	case meta.Step == x.step+2 && x.direct.held[meta.Rank].ok:
		return false, false, nil
	case meta.Step > x.step+2:
		return false, false, wire.Rejectf(wire.ReasonFutureStep, "step %d is beyond the shard's next two (shard %d is at step %d): a worker sends step t+1 only once it holds step t's parameters", meta.Step, x.shard.ID, x.step)
	}
	if rej := wire.CheckPayload(data, meta.Dtype, x.shard.Len, x.shard.ID, x.finite); rej != nil {
		return false, false, rej
	}
	return meta.Step == x.step+1, meta.Step == x.step+2, nil
}

// receipt answers a gradient the shard holds (or held): an empty body, and the shard's last
// applied step.
func (x *shardExec) receipt(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	r := nats.NewMsg(m.Reply)
	r.Header.Set(wire.HdrStep, strconv.FormatInt(x.step, 10))
	_ = x.r.nc.PublishMsg(r) // best effort: a worker with no receipt sends again
}

// refuseDirect reports a refused gradient to its sender (the request's reply) and, as every
// rejection, on the job's rejects subject.
func (x *shardExec) refuseDirect(m *nats.Msg, meta *wire.GradMeta, rej *wire.Reject) {
	rej.Job, rej.Shard = x.ji.rec.Spec.ID, x.shard.ID
	rej.MsgID = m.Header.Get(wire.HdrMsgID)
	if rej.Step == 0 {
		rej.Step = meta.Step
	}
	if rej.Rank < 0 && meta.Rank < x.ranks {
		rej.Rank = meta.Rank
	}
	x.r.reject(rej, "", x.ji.incarnation)
	if m.Reply != "" {
		_ = x.r.nc.PublishMsg(rej.ReplyMsg(m.Reply))
	}
}

// foldDirect folds rank's gradient of step+1 and, when the step is complete, applies it,
// publishes its parameters (rule 2) and folds the next step's held gradients.
func (x *shardExec) foldDirect(rank int, w float64, dt wire.Dtype, data []byte) {
	now := time.Now()
	if x.next == 0 && !x.anyRank() {
		x.stats.stepStart = now
		x.times.first = now
	}
	x.times.lastStored = now
	x.takeCore()
	started := time.Now()
	x.times.folding, x.times.lastRank = started, rank
	x.fold(rank, w, dt, data)
	complete := x.next == x.ranks
	var apply time.Duration
	if complete {
		var ok bool
		if apply, ok = x.applyTimed(); !ok { // a user function failed: the executor restores and asks again
			x.giveCore()
			return
		}
	}
	x.giveCore()
	work := time.Since(started)
	x.stats.addWork(started.Sub(now), work, apply)
	x.r.stats.workNanos.Add(int64(work))
	if !complete {
		return
	}
	if x.stats.stepDone(time.Now()) {
		x.r.reportSoon()
	}
	if !x.awaitStored(x.step - 1) {
		return // stopped: the next owner restores and asks for the gradients again
	}
	x.publishParams()
	if !x.paramsSnap {
		x.checkpointEveryStep()
	}
	for r := range x.direct.held { // step+1's gradients that came early
		if h := x.direct.held[r]; h.ok {
			x.direct.held[r] = directHeld{}
			x.r.stats.bytesIn.Add(int64(len(h.data)))
			x.stats.received(len(h.data))
			x.met.Gradient(len(h.data))
			x.foldDirect(r, h.weight, h.dtype, h.data)
		}
	}
}

// awaitStored waits until the snapshot of step t is stored (rule 2). x.mu is held, and released
// while it waits: a stop must not wait for a snapshot that may never be stored. It returns false if
// the executor stopped meanwhile.
func (x *shardExec) awaitStored(t int64) bool {
	for x.storedStep() < t {
		if x.stopped {
			return false
		}
		x.mu.Unlock()
		select {
		case <-x.direct.stored:
		case <-time.After(10 * time.Millisecond): // in case the signal went to an earlier look
		}
		x.mu.Lock()
	}
	return !x.stopped
}

// checkpointEveryStep writes the checkpoint of the step just applied, asynchronously: a shard
// whose parameters message is no snapshot checkpoints every step in this mode (rule 2). The
// previous step's checkpoint is stored (awaitStored), so the buffer is free but for the moment its
// acknowledgement takes to give it back.
func (x *shardExec) checkpointEveryStep() {
	for x.ckptBusy.Load() {
		if x.stopped {
			return
		}
		x.mu.Unlock()
		select {
		case <-x.ckptFree:
		case <-time.After(time.Millisecond):
		}
		x.mu.Lock()
	}
	x.checkpointAsync()
}
