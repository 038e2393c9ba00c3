package sdk

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/wire"
)

// SSP and ASP workers (docs/PROTOCOL.md, "Sync modes").
//
// In an ssp or asp job, Step does not wait for the parameters after the step it publishes. Each
// shard's gradient says which version of that shard's parameters it was computed from
// (wire.HdrVersion: the worker's parameters may mix versions, shard by shard). Parameters pushed
// meanwhile wait in a staging buffer, so the slice a caller computes with never changes under it;
// Step takes them in when it returns.
//
//	ssp  Step publishes step t, then waits until every shard has parameters of version >= t-s, so
//	     that step t+1 is within the staleness bound, and returns the newest it has.
//	asp  Step publishes step t and returns the newest parameters it has, without waiting.
//
// Versions tells which version of each shard the returned parameters are: record it with the
// gradients to replay a run (functions.Reference).

// asyncState is an ssp or asp worker's state beyond Worker's.
type asyncState struct {
	own       int64     // the last step this worker published (its ranks' steps)
	stage     []float32 // parameters pushed and not yet taken, per shard at stageStep
	stageStep []int64
	stageAt   chan struct{} // closed and replaced when a shard is staged
	rankSteps []int64       // asp: per shard, the lowest last applied step of the worker's ranks
}

func (w *Worker) async() bool { return w.rec.Spec.Sync == "ssp" || w.rec.Spec.Sync == "asp" }

func (w *Worker) initAsync() {
	n := w.rec.Layout.NumShards()
	w.as.stage = make([]float32, w.rec.Layout.Elements)
	w.as.stageStep = make([]int64, n)
	for i := range w.as.stageStep {
		w.as.stageStep[i] = -1
	}
	w.as.stageAt = make(chan struct{})
	w.as.rankSteps = make([]int64, n)
}

// Versions returns, per shard, the step of the parameters the worker holds (ssp and asp: they
// may differ from shard to shard; bsp: all StepCount).
func (w *Worker) Versions() []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.got)
}

// OwnStep is the last step this worker published (ssp and asp; bsp: StepCount).
func (w *Worker) OwnStep() int64 {
	if w.async() {
		return w.as.own
	}
	return w.step
}

// stageParams keeps parameters newer than the staged ones (ssp and asp), pushed or fetched. A
// message that is no parameters of the shard (wire.DecodeParams refuses it) is an error and
// stages nothing. w.mu is held.
func (w *Worker) stageParams(id int, step int64, m *nats.Msg) error {
	s := w.rec.Layout.Shards[id]
	if step <= w.as.stageStep[id] || step <= w.got[id] {
		return nil
	}
	if _, err := wire.DecodeParams(w.as.stage[s.Off:s.Off+s.Len], m.Header, m.Data); err != nil {
		return fmt.Errorf("job %q, shard %d, step %d: %w", w.rec.Spec.ID, s.ID, step, err)
	}
	w.as.stageStep[id] = step
	close(w.as.stageAt)
	w.as.stageAt = make(chan struct{})
	return nil
}

// noteRankSteps reads, from an asp shard's parameters, the last applied step of the worker's
// ranks: where a restarted worker resumes.
func (w *Worker) noteRankSteps(id int, h nats.Header) {
	v := h.Get(wire.HdrRankSteps)
	if v == "" || w.rec.Spec.Sync != "asp" {
		return
	}
	parts := strings.Split(v, ",")
	low := int64(-1)
	for _, r := range w.ranks {
		if r < len(parts) {
			if n, err := strconv.ParseInt(parts[r], 10, 64); err == nil && (low < 0 || n < low) {
				low = n
			}
		}
	}
	if low >= 0 {
		w.as.rankSteps[id] = low
	}
}

// stepAsync is StepRanks for ssp and asp jobs.
func (w *Worker) stepAsync(ctx context.Context, grads [][]float32) ([]float32, error) {
	if w.step < 0 {
		if _, _, err := w.Params(ctx); err != nil {
			return nil, err
		}
		w.mu.Lock()
		w.as.own = w.step // ssp: the job's step; asp: where this worker's ranks stand
		if w.rec.Spec.Sync == "asp" {
			w.as.own = slices.Min(w.as.rankSteps)
		}
		w.mu.Unlock()
	}
	t := w.as.own + 1
	w.pubVersions = w.Versions()
	start := time.Now()
	if err := w.publish(ctx, t, w.all, grads); err != nil {
		w.met.failed(err)
		w.attempt++
		return nil, err
	}
	w.met.published(start, 4*len(grads)*w.rec.Layout.Elements)
	need := int64(-1) // asp: take what is there
	if w.rec.Spec.Sync == "ssp" {
		need = t - int64(w.rec.Spec.Staleness)
	}
	if err := w.awaitVersions(ctx, t, need); err != nil {
		w.met.failed(err)
		w.attempt++
		return nil, err
	}
	w.met.stepped(start)
	w.as.own, w.attempt = t, 0
	return w.vec, nil
}

// awaitVersions waits until every shard has parameters of version need or newer (staged or
// held), fetching what was not pushed in time, fails on a rejection of step t, and takes the
// staged parameters into vec.
func (w *Worker) awaitVersions(ctx context.Context, t, need int64) error {
	w.mu.Lock()
	w.firstPush, w.lastPush = time.Time{}, time.Time{}
	w.mu.Unlock()
	began := time.Now()
	timer := time.NewTimer(w.fb.initial())
	backoff, fetched, force := w.fb.after, false, false
	lost := w.lossMark()
	defer timer.Stop()
	poll := time.NewTicker(reconnectPoll)
	defer poll.Stop()
	for {
		// A rejection of this step fails Step before any staged parameters are taken: the
		// caller's parameters and Versions stay those its gradient was computed from, so that a
		// retry publishes the same Fanin-Version.
		select {
		case rej := <-w.rejects:
			if w.failsStep(rej, t) {
				return rej
			}
			continue
		default:
		}
		w.mu.Lock()
		short := false
		for i := range w.got {
			if max(w.got[i], w.as.stageStep[i]) < need {
				short = true
			}
		}
		at := w.as.stageAt
		if !short {
			w.takeStagedLocked()
		}
		first, last := w.firstPush, w.lastPush
		w.mu.Unlock()
		if !short {
			w.notePushWaits(began)
			return nil
		}
		select {
		case <-at:
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
		case rej := <-w.rejects:
			if w.failsStep(rej, t) {
				return rej
			}
		case <-timer.C:
			if !force && !fetched {
				if due, left := w.fb.due(began, first, last, time.Now()); !due {
					timer.Reset(left) // pushes are late, not missing
					continue
				}
			}
			force, fetched = false, true
			for _, s := range w.rec.Layout.Shards {
				w.mu.Lock()
				short := max(w.got[s.ID], w.as.stageStep[s.ID]) < need
				w.mu.Unlock()
				if !short {
					continue // its push came: fetching it again would only repeat its bytes
				}
				id := w.rec.Spec.ID
				w.met.fetched()
				m, err := w.c.directGet(ctx, wire.DirectGetLast(wire.ParamsStream(id), wire.ParamsSubject(id, s.ID)), nil)
				if err != nil {
					return fmt.Errorf("fetch parameters of shard %d: %w", s.ID, err)
				}
				step, err := wire.ParseStep(m.Header)
				if err != nil {
					return fmt.Errorf("fetch parameters of shard %d: %w", s.ID, err)
				}
				w.mu.Lock()
				err = w.stageParams(s.ID, step, m)
				w.mu.Unlock()
				if err != nil {
					return fmt.Errorf("fetch parameters: %w", err)
				}
			}
			timer.Reset(backoff)
			backoff = min(2*backoff, maxFetchAfter)
		case <-ctx.Done():
			return fmt.Errorf("step %d: waiting for parameters of step %d or later: %w", t, need, ctx.Err())
		}
	}
}

// failsStep reports whether a rejection fails step t of an ssp or asp worker: it is this step's
// and this attempt's, and neither stale (the shard applied it already) nor the echo of a retry.
func (w *Worker) failsStep(rej *wire.Reject, t int64) bool {
	return rej.Step == t && wire.GradAttempt(rej.MsgID) == w.attempt && rej.Reason != wire.ReasonStaleStep &&
		!(w.attempt > 0 && rej.Reason == wire.ReasonDuplicate)
}

// takeStagedLocked copies every staged shard newer than vec's into vec. w.mu is held.
func (w *Worker) takeStagedLocked() {
	for i, s := range w.rec.Layout.Shards {
		if st := w.as.stageStep[i]; st > w.got[i] {
			copy(w.vec[s.Off:s.Off+s.Len], w.as.stage[s.Off:s.Off+s.Len])
			w.got[i] = st
		}
	}
	w.step = slices.Min(w.got)
}

// paramsAsync is Params for ssp and asp jobs: every shard's newest parameters, whatever their
// versions (Versions); the step returned is the oldest of them.
func (w *Worker) paramsAsync(ctx context.Context) (int64, []float32, error) {
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		var err error
		for _, s := range w.rec.Layout.Shards {
			if _, err = w.fetchShard(ctx, s, -1); err != nil {
				break
			}
		}
		if err == nil {
			w.mu.Lock()
			w.step = slices.Min(w.got)
			for i, st := range w.as.stageStep { // staged versions older than what was fetched
				if st <= w.got[i] {
					w.as.stageStep[i] = -1
				}
			}
			t := w.step
			w.mu.Unlock()
			return t, w.vec, nil
		}
		if !errors.Is(err, errNoMessage) {
			return 0, nil, err
		}
		select {
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("job %q has no parameters yet: %w", w.rec.Spec.ID, ctx.Err())
		case <-time.After(wait):
		}
	}
}
