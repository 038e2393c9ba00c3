package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/fanin-ml/fanin/wire"
)

// GradFunc computes logical rank's gradient for step from params (the parameters after step-1)
// into grad, which has one element per parameter of the job. It must depend on nothing but rank,
// step and params (rank's data partition, its batch number step): then whichever worker computes
// it, and however often, the bytes are the same, and a job trained on any number of workers,
// changing during training, ends bit-identical to the job on a fixed set (EasyScale's rule).
type GradFunc func(ctx context.Context, rank int, step int64, params []float32, grad []float32) error

// Elastic is a physical worker of a job whose logical ranks fanin assigns: it beats to the
// autoscaler, holds whatever ranks the current wire.Assignment gives it, and computes their
// gradients with the GradFunc its Step is given. Workers join (Client.Elastic), leave (Leave) or
// die at any time; a dead worker's ranks move to the others within a step of its death being
// known (wire.WorkerLapse after its last beat). An Elastic is not safe for concurrent use.
type Elastic struct {
	c        *Client
	w        *Worker // holds every rank of the job; publishes the assigned ones
	id       string
	onAssign func(ranks []int)
	host     string

	prev  []float32         // the parameters the step's gradients are computed from
	grads map[int][]float32 // gradient buffers of the ranks held, reused

	// The open Step's: its gradient function and the ranks published in it.
	curGrad   GradFunc
	published map[int]bool

	// ssp: the ranks published in the previous step (the others held now were gained, and catch
	// up from the oldest missing step); the record callback. The versions of prev, per shard,
	// are w.pubVersions.
	heldBefore map[int]bool
	record     func(GradRecord)

	mu    sync.Mutex // guards the fields below, read by the beat loop
	ranks []int      // the ranks held, from the newest assignment read
	epoch uint64
	step  int64

	stop     context.CancelFunc
	beatDone chan struct{}
}

// ElasticOption configures an Elastic worker.
type ElasticOption func(*Elastic) error

// WithWorkerID names the worker (default: a random id). 1-64 of a-z, A-Z, 0-9, '_' and '-'.
func WithWorkerID(id string) ElasticOption {
	return func(e *Elastic) error {
		if !wire.ValidWorkerID(id) {
			return fmt.Errorf("worker id %q: use 1-64 of a-z, A-Z, 0-9, '_' and '-'", id)
		}
		e.id = id
		return nil
	}
}

// WithOnAssign calls f with the worker's ranks whenever they change, before it computes a gradient
// with them: where a training loop learns which data partitions it now owns.
func WithOnAssign(f func(ranks []int)) ElasticOption {
	return func(e *Elastic) error { e.onAssign = f; return nil }
}

// WithRecord calls f for every gradient message of this worker: before it is published
// (RecordIntended), and once JetStream has acknowledged it (RecordStored or RecordDuplicate). In
// an ssp job the versions are what a replay needs (functions.Reference): RecordedVersions reads
// them from the records of all the job's workers. The intent comes first so that a worker killed
// between its publish and the acknowledgement still leaves a record of what it stored; f must
// have written it (durably, if the replay is to survive the worker's process) when it returns.
func WithRecord(f func(GradRecord)) ElasticOption {
	return func(e *Elastic) error { e.record = f; return nil }
}

// GradRecord is one entry of an elastic worker's record of its gradient messages (WithRecord).
type GradRecord struct {
	Worker  string        `json:"worker"` // the worker's id (WithWorkerID)
	Rank    int           `json:"rank"`
	Step    int64         `json:"step"`
	Shard   int           `json:"shard"`   // the shard's index in the job's layout
	Version int64         `json:"version"` // the step of the shard's parameters the gradient was computed from
	MsgID   string        `json:"msg_id"`  // the message's Nats-Msg-Id: one attempt of one worker
	Outcome RecordOutcome `json:"outcome"`
}

// RecordOutcome says what a GradRecord knows of its message.
type RecordOutcome string

// Outcomes of a gradient message.
const (
	// RecordIntended is written before the publish: the message may or may not be stored (the
	// worker can die before or after the publish, or the publish can fail).
	RecordIntended RecordOutcome = "intended"
	// RecordStored: JetStream stored the message.
	RecordStored RecordOutcome = "stored"
	// RecordDuplicate: JetStream already held a message of that id, stored first by another
	// worker that held the rank (its own record names it): this one is void.
	RecordDuplicate RecordOutcome = "duplicate"
)

// RecordedVersions reads, from the records of every worker of a job (WithRecord, in the order
// each worker wrote them), the version each rank's gradient of each step and shard was computed
// from. For one rank, step and shard: the version of a message recorded as stored; without one,
// that of an intent no later record of its worker resolved (its worker died between publish and
// acknowledgement, the one case where the message may be stored unacknowledged). Intents resolved
// as duplicates, and intents of a worker that later recorded the message stored, do not count.
// A message whose publish never happened is harmless: another worker (or the same one, retrying)
// publishes that rank's gradient again and records it stored.
func RecordedVersions(records []GradRecord) func(rank int, step int64, shard int) (int64, bool) {
	type key struct {
		rank  int
		step  int64
		shard int
	}
	type attempt struct{ worker, msgID string }
	resolved := map[attempt]bool{}
	stored := map[key]int64{}
	for _, r := range records {
		k := key{r.Rank, r.Step, r.Shard}
		switch r.Outcome {
		case RecordStored:
			if _, ok := stored[k]; !ok {
				stored[k] = r.Version
			}
			resolved[attempt{r.Worker, r.MsgID}] = true
		case RecordDuplicate:
			resolved[attempt{r.Worker, r.MsgID}] = true
		}
	}
	open := map[key]int64{}
	for _, r := range records {
		k := key{r.Rank, r.Step, r.Shard}
		if _, ok := open[k]; !ok && r.Outcome == RecordIntended && !resolved[attempt{r.Worker, r.MsgID}] {
			open[k] = r.Version
		}
	}
	return func(rank int, step int64, shard int) (int64, bool) {
		k := key{rank, step, shard}
		if v, ok := stored[k]; ok {
			return v, true
		}
		v, ok := open[k]
		return v, ok
	}
}

// WithElasticGradDtype makes the worker publish its gradients as dt (see WithGradDtype).
func WithElasticGradDtype(dt wire.Dtype) ElasticOption {
	return func(e *Elastic) error { return WithGradDtype(dt)(e.w) }
}

// WithElasticParamsBuffer makes Step write the parameters after each step straight into buf
// (see WithParamsBuffer): Step then returns buf. The gradient function's params are a copy the
// worker keeps, never buf: buf is written while Step waits, when gradients of ranks gained
// meanwhile are still computed from the step before.
func WithElasticParamsBuffer(buf []float32) ElasticOption {
	return func(e *Elastic) error { return WithParamsBuffer(buf)(e.w) }
}

// Elastic joins job id as an elastic worker and starts beating. Its ranks come with the first
// assignment that names it (see Step). Options: WithWorkerID, WithOnAssign, WithRecord,
// WithElasticGradDtype, WithElasticParamsBuffer.
func (c *Client) Elastic(ctx context.Context, id string, opts ...ElasticOption) (*Elastic, error) {
	rec, err := c.Job(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.Spec.Sync == "asp" {
		return nil, fmt.Errorf("job %q is asp: it never waits for a worker, so there is nothing to assign; use Worker", id)
	}
	if rec.Spec.DirectGradients() {
		return nil, fmt.Errorf("job %q: %w", id, errDirectElastic)
	}
	all := make([]int, rec.Spec.Ranks)
	for r := range all {
		all[r] = r
	}
	w, err := c.workerRanks(ctx, id, all)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	e := &Elastic{c: c, w: w, id: uuid.NewString(), host: host, grads: map[int][]float32{}, step: -1, beatDone: make(chan struct{})}
	for _, o := range opts {
		if err := o(e); err != nil {
			w.Close()
			return nil, err
		}
	}
	w.elastic = true
	w.waitHook = e.whileWaiting
	if e.record != nil {
		w.onGrad = func(rank int, t int64, i int, msgID string, o RecordOutcome) {
			v := t - 1 // bsp: the step before
			if w.pubVersions != nil {
				v = w.pubVersions[i]
			}
			e.record(GradRecord{Worker: e.id, Rank: rank, Step: t, Shard: i, Version: v, MsgID: msgID, Outcome: o})
		}
	}
	bctx, stop := context.WithCancel(context.Background())
	e.stop = stop
	e.beat(false)
	go e.beatLoop(bctx)
	return e, nil
}

// ID is the worker's id.
func (e *Elastic) ID() string { return e.id }

// Ranks are the logical ranks the worker holds now.
func (e *Elastic) Ranks() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.ranks)
}

// Epoch is the epoch of the assignment the worker follows (0 before the first).
func (e *Elastic) Epoch() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.epoch
}

// OwnStep is the last step the worker published: StepCount in a bsp job; in an ssp job its own
// step, up to s ahead of the parameters.
func (e *Elastic) OwnStep() int64 { return e.w.OwnStep() }

// StepCount is the step of the parameters the worker holds, -1 before it has any.
func (e *Elastic) StepCount() int64 { return e.w.StepCount() }

// Versions returns, per shard, the step of the parameters the worker holds (see Worker.Versions):
// in an ssp job they may differ from shard to shard.
func (e *Elastic) Versions() []int64 { return e.w.Versions() }

// Params fetches the job's newest parameters (all of one step) and returns their step.
func (e *Elastic) Params(ctx context.Context) (int64, []float32, error) {
	t, p, err := e.w.Params(ctx)
	if err == nil {
		e.setStep(t)
	}
	return t, p, err
}

// Step runs the next step: it reads the assignment, computes with grad the gradient of every rank
// it holds from the parameters it has, publishes them, and returns the parameters after the step.
// While it waits it keeps reading the assignment, and computes and publishes the ranks it is given
// meanwhile (those of a worker that died or left): a training loop never sees a rank move except
// through WithOnAssign. A worker that holds no ranks (standing by, or not yet assigned) follows
// the steps. The returned slice is the worker's, overwritten by the next call.
func (e *Elastic) Step(ctx context.Context, grad GradFunc) ([]float32, error) {
	for {
		p, err := e.step1(ctx, grad)
		if !errors.Is(err, errBehind) {
			return p, err
		}
		// The job went past the step this worker waited for: take the newest parameters.
	}
}

// errBehind ends a wait for a step that the job has completed without this worker.
var errBehind = errors.New("the job is past this step")

func (e *Elastic) step1(ctx context.Context, grad GradFunc) ([]float32, error) {
	w := e.w
	if w.async() {
		return e.stepSSP(ctx, grad)
	}
	if w.step < 0 || w.newest.Load() > w.step {
		// First step, or the job went on without this worker (it joined, or stood by): start
		// from the newest parameters.
		if _, _, err := e.Params(ctx); err != nil {
			return nil, err
		}
	}
	if err := e.refresh(ctx); err != nil {
		return nil, err
	}
	t := w.step + 1
	e.prev = append(e.prev[:0], w.vec...)
	e.curGrad = grad
	e.published = map[int]bool{}
	defer func() { e.curGrad, e.published = nil, nil }()
	w.expect(t)
	defer w.expect(0)
	if err := e.publishHeld(ctx, t); err != nil {
		w.attempt++
		return nil, err
	}
	if err := w.await(ctx, t); err != nil {
		if !errors.Is(err, errBehind) {
			w.attempt++
		}
		return nil, err
	}
	w.step, w.attempt = t, 0
	e.setStep(t)
	return w.vec, nil
}

// stepSSP is Step for an ssp job: the step is the worker's own (Worker.stepAsync), and a rank
// gained from a worker that died or left catches up from the oldest step it is missing.
func (e *Elastic) stepSSP(ctx context.Context, grad GradFunc) ([]float32, error) {
	w := e.w
	if w.step < 0 {
		if _, _, err := e.Params(ctx); err != nil {
			return nil, err
		}
		w.as.own = w.step
	}
	if err := e.refresh(ctx); err != nil {
		return nil, err
	}
	if len(e.Ranks()) == 0 { // standing by: follow the job
		w.as.own = max(w.as.own, w.step)
	}
	t := w.as.own + 1
	e.prev = append(e.prev[:0], w.vec...)
	w.pubVersions = w.Versions()
	e.curGrad = grad
	e.published = map[int]bool{}
	defer func() { e.curGrad = nil }()
	if err := e.publishHeld(ctx, t); err != nil {
		w.attempt++
		return nil, err
	}
	if err := w.awaitVersions(ctx, t, t-int64(w.rec.Spec.Staleness)); err != nil {
		w.attempt++
		return nil, err
	}
	w.as.own, w.attempt = t, 0
	e.heldBefore = e.published
	e.setStep(w.step)
	return w.vec, nil
}

// publishHeld computes and publishes, for step t, the gradient of every rank held and not yet
// published in this step.
func (e *Elastic) publishHeld(ctx context.Context, t int64) error {
	if e.w.async() {
		return e.publishHeldSSP(ctx, t)
	}
	var which []int
	var grads [][]float32
	for _, r := range e.Ranks() {
		if e.published[r] {
			continue
		}
		g := e.grads[r]
		if g == nil {
			g = make([]float32, len(e.prev))
			e.grads[r] = g
		}
		if err := e.curGrad(ctx, r, t, e.prev, g); err != nil {
			return fmt.Errorf("step %d: gradient of rank %d: %w", t, r, err)
		}
		which, grads = append(which, r), append(grads, g) // w holds every rank: index r is rank r
		e.published[r] = true
	}
	if len(which) == 0 {
		return nil
	}
	return e.w.publish(ctx, t, which, grads)
}

// publishHeldSSP publishes, for step t, every rank held and not yet published in it; a rank not
// published in the previous step was gained, and first catches up every step from the oldest
// version any shard is at, shard by shard where that shard has not applied it.
func (e *Elastic) publishHeldSSP(ctx context.Context, t int64) error {
	w := e.w
	for _, r := range e.Ranks() {
		if e.published[r] {
			continue
		}
		from := t
		if !e.heldBefore[r] {
			from = slices.Min(w.pubVersions) + 1
		}
		g := e.grads[r]
		if g == nil {
			g = make([]float32, len(e.prev))
			e.grads[r] = g
		}
		for k := from; k <= t; k++ {
			if err := e.curGrad(ctx, r, k, e.prev, g); err != nil {
				return fmt.Errorf("step %d: gradient of rank %d: %w", k, r, err)
			}
			w.skipApplied = true // a catch-up step: not to the shards that applied it
			err := w.publish(ctx, k, []int{r}, [][]float32{g})
			w.skipApplied = false
			if err != nil {
				return err
			}
		}
		e.published[r] = true
	}
	return nil
}

// whileWaiting runs while Step waits for step t: ranks given to this worker meanwhile are
// computed and published.
func (e *Elastic) whileWaiting(ctx context.Context, t int64) error {
	if e.curGrad == nil {
		return nil
	}
	if !e.w.async() && e.w.newest.Load() > t {
		return errBehind
	}
	if err := e.refresh(ctx); err != nil {
		return nil // the assignment is unreadable for now (a leader election): try again
	}
	return e.publishHeld(ctx, t)
}

// refresh reads the job's assignment and takes its ranks if it is newer than the one held.
func (e *Elastic) refresh(ctx context.Context) error {
	m, err := e.c.directGet(ctx, wire.AssignmentGet(e.w.rec.Spec.ID), nil)
	if errors.Is(err, errNoMessage) {
		return nil // no assignment yet: the autoscaler has not seen a beat of this job
	}
	if err != nil {
		return fmt.Errorf("read the assignment of job %q: %w", e.w.rec.Spec.ID, err)
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return nil
	}
	var a wire.Assignment
	if err := json.Unmarshal(m.Data, &a); err != nil {
		return fmt.Errorf("decode the assignment of job %q: %w", e.w.rec.Spec.ID, err)
	}
	e.mu.Lock()
	if a.Epoch < e.epoch {
		e.mu.Unlock()
		return nil
	}
	ranks := slices.Clone(a.RanksOf(e.id))
	slices.Sort(ranks)
	changed := !slices.Equal(ranks, e.ranks)
	e.ranks, e.epoch = ranks, a.Epoch
	e.mu.Unlock()
	if changed {
		for _, r := range ranks {
			if r < 0 || r >= e.w.rec.Spec.Ranks {
				return fmt.Errorf("the assignment of job %q gives rank %d, not in 0..%d", e.w.rec.Spec.ID, r, e.w.rec.Spec.Ranks-1)
			}
		}
		if e.onAssign != nil {
			e.onAssign(slices.Clone(ranks))
		}
	}
	return nil
}

func (e *Elastic) setStep(t int64) {
	e.mu.Lock()
	e.step = t
	e.mu.Unlock()
}

// beat publishes one beat (core NATS: a lost one is covered by the next).
func (e *Elastic) beat(leaving bool) {
	e.mu.Lock()
	b := wire.WorkerBeat{ID: e.id, Host: e.host, PID: os.Getpid(), Step: e.step, Ranks: slices.Clone(e.ranks), Epoch: e.epoch, Leaving: leaving}
	e.mu.Unlock()
	if b.Ranks == nil {
		b.Ranks = []int{}
	}
	data, _ := json.Marshal(b)
	_ = e.c.nc.Publish(wire.WorkersSubject(e.w.rec.Spec.ID), data)
}

func (e *Elastic) beatLoop(ctx context.Context) {
	defer close(e.beatDone)
	t := time.NewTicker(wire.BeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if e.c.nc.IsClosed() {
				return
			}
			e.beat(false)
		}
	}
}

// Leave leaves the job gracefully: the worker's ranks move to the others at once. Call it between
// steps; the worker is closed after it.
func (e *Elastic) Leave(ctx context.Context) error {
	e.stop()
	<-e.beatDone
	e.beat(true)
	if _, ok := ctx.Deadline(); !ok { // FlushWithContext needs one
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
	}
	err := e.c.nc.FlushWithContext(ctx)
	e.w.Close()
	return err
}

// Close is Leave (with its default timeout of 2 s).
func (e *Elastic) Close() error { return e.Leave(context.Background()) }
