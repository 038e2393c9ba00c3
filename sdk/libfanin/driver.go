package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// Events of a step, as fanin_elastic_next reports them (elastic.go).
const (
	eventDone     = 0 // FANIN_EVENT_DONE
	eventGradient = 1 // FANIN_EVENT_GRADIENT
	eventAssigned = 2 // FANIN_EVENT_ASSIGNED
)

// errAborted fails the gradient function of a step that its caller aborted.
var errAborted = errors.New("the step was aborted by its caller")

// stepRunner is what a driver needs of an elastic worker: sdk.Elastic.
type stepRunner interface {
	Step(ctx context.Context, grad sdk.GradFunc) ([]float32, error)
	StepCount() int64
	OwnStep() int64
}

// driver runs the steps of an elastic worker for a caller that asks for each step's next event
// and answers it, instead of being called: the step runs in a goroutine of its own, and its
// gradient function (and the worker's on-assign hook) hand their work to the caller and wait for
// the answer. A driver is used by one caller at a time (elastic.busy); onAssign runs on the
// step's goroutine.
type driver struct {
	w    stepRunner
	prev []float32 // the caller's buffer of the parameters a gradient is computed from
	run  *elasticStep
}

// elasticStep is an open step: Step running in its goroutine, which sends the step's events on
// events (unbuffered) and ends with a done event, read by next or abort.
type elasticStep struct {
	ctx     context.Context
	cancel  context.CancelFunc
	events  chan *event
	pending *event // the gradient or assignment event the caller has not answered yet
	copied  int64  // the step whose parameters are in prev (-1: none in this step)
}

// event is one event of an open step.
type event struct {
	kind   int
	rank   int
	step   int64     // gradient: its step; done: the step of the parameters held
	own    int64     // done: the worker's own step
	params []float32 // gradient: the parameters it is computed from
	grad   []float32 // gradient: where it goes
	err    error     // done: the step's error
	answer chan error
}

// next opens a step if none is open (timeout bounds the whole step; 0: no bound), answers the
// pending assignment event if there is one, and waits for the step's next event. For a gradient,
// the parameters it is computed from are in prev when it returns. A step that failed returns its
// error, and is over.
func (d *driver) next(timeout time.Duration) (*event, error) {
	r := d.run
	switch {
	case r == nil:
		r = d.open(timeout)
	case r.pending != nil && r.pending.kind == eventGradient:
		return nil, fmt.Errorf("give rank %d's gradient of step %d before the next event", r.pending.rank, r.pending.step)
	case r.pending != nil:
		r.pending.answer <- nil
		r.pending = nil
	}
	v := <-r.events
	switch v.kind {
	case eventDone:
		d.run = nil
		r.cancel()
		if v.err != nil {
			return nil, v.err
		}
	case eventGradient:
		if r.copied != v.step { // one copy per step: its ranks' gradients share the parameters
			copy(d.prev, v.params)
			r.copied = v.step
		}
		r.pending = v
	case eventAssigned:
		r.pending = v
	}
	return v, nil
}

// open starts a step: Step in a goroutine of its own, which ends after sending its done event.
func (d *driver) open(timeout time.Duration) *elasticStep {
	ctx, cancel := context.WithCancel(context.Background())
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), timeout)
	}
	r := &elasticStep{ctx: ctx, cancel: cancel, events: make(chan *event), copied: -1}
	d.run = r // read by onAssign on the step's goroutine, which starts after this write
	grad := func(_ context.Context, rank int, step int64, params, g []float32) error {
		return r.ask(&event{kind: eventGradient, rank: rank, step: step, params: params, grad: g})
	}
	go func() {
		_, err := d.w.Step(ctx, grad)
		r.events <- &event{kind: eventDone, step: d.w.StepCount(), own: d.w.OwnStep(), err: err}
	}()
	return r
}

// onAssign is the worker's sdk.WithOnAssign when the caller asked for assignment events: it runs
// on the open step's goroutine, inside Step.
func (d *driver) onAssign([]int) {
	if r := d.run; r != nil {
		_ = r.ask(&event{kind: eventAssigned})
	}
}

// ask sends v to the caller and waits for its answer, or for the step's end.
func (r *elasticStep) ask(v *event) error {
	v.answer = make(chan error, 1)
	select {
	case r.events <- v:
	case <-r.ctx.Done():
		return r.ctx.Err()
	}
	select {
	case err := <-v.answer:
		return err
	case <-r.ctx.Done():
		return r.ctx.Err()
	}
}

// grad answers the pending gradient event with g (copied).
func (d *driver) grad(g []float32) error {
	r := d.run
	if r == nil || r.pending == nil || r.pending.kind != eventGradient {
		return errors.New("no gradient was asked for")
	}
	v := r.pending
	if len(g) != len(v.grad) {
		return wire.Rejectf(wire.ReasonBadLength, "rank %d, step %d: %d gradients, the job has %d parameters", v.rank, v.step, len(g), len(v.grad))
	}
	copy(v.grad, g)
	r.pending = nil
	v.answer <- nil
	return nil
}

// abort ends the open step, if any: its context is cancelled and every event it still sends is
// answered with errAborted, up to its done event.
func (d *driver) abort() {
	r := d.run
	if r == nil {
		return
	}
	r.cancel()
	if r.pending != nil {
		r.pending.answer <- errAborted
	}
	for v := range r.events {
		if v.kind == eventDone {
			break
		}
		v.answer <- errAborted
	}
	d.run = nil
}
