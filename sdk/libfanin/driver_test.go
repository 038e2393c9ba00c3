package main

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// Every step's goroutine has ended when the tests do: a step is over once its done event is read.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRunner is an elastic worker as the driver sees it: each Step asks for the gradients of
// ranks, then reports gained through onAssign and asks for theirs (as Elastic.Step does for ranks
// it gains while it waits), and makes parameters[0] the step.
type fakeRunner struct {
	ranks, gained []int
	onAssign      func([]int)
	params        []float32
	grads         map[int][]float32 // what each rank's gradient was, last
	step          int64
	hold          bool // Step waits for the end of its context instead
}

func (f *fakeRunner) Step(ctx context.Context, grad sdk.GradFunc) ([]float32, error) {
	if f.hold {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	t := f.step + 1
	ask := func(ranks []int) error {
		for _, r := range ranks {
			g := make([]float32, len(f.params))
			if err := grad(ctx, r, t, f.params, g); err != nil {
				return err
			}
			f.grads[r] = g
		}
		return nil
	}
	if err := ask(f.ranks); err != nil {
		return nil, err
	}
	if len(f.gained) > 0 {
		f.onAssign(slices.Concat(f.ranks, f.gained))
		if err := ask(f.gained); err != nil {
			return nil, err
		}
	}
	f.step = t
	f.params[0] = float32(t)
	return f.params, nil
}

func (f *fakeRunner) StepCount() int64 { return f.step }
func (f *fakeRunner) OwnStep() int64   { return f.step }

func newDriver(ranks, gained []int) (*driver, *fakeRunner) {
	f := &fakeRunner{ranks: ranks, gained: gained, params: []float32{0, 7, 7}, grads: map[int][]float32{}}
	d := &driver{w: f, prev: make([]float32, 3)}
	f.onAssign = d.onAssign
	return d, f
}

// next is d.next, failing the test on an error.
func next(t *testing.T, d *driver) *event {
	t.Helper()
	v, err := d.next(0)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestDriverReportsAStepsEvents(t *testing.T) {
	t.Parallel()
	d, f := newDriver([]int{0, 2}, []int{1})
	for step := int64(1); step <= 2; step++ {
		var got []int
		for {
			v := next(t, d)
			if v.kind == eventDone {
				if v.step != step || v.own != step {
					t.Fatalf("done at step %d (own %d), want %d", v.step, v.own, step)
				}
				break
			}
			if v.kind == eventAssigned {
				got = append(got, -1)
				continue
			}
			if v.step != step || d.prev[0] != float32(step-1) || d.prev[1] != 7 {
				t.Fatalf("gradient of rank %d, step %d, from %v: want step %d from the parameters after %d", v.rank, v.step, d.prev, step, step-1)
			}
			got = append(got, v.rank)
			if err := d.grad([]float32{float32(v.rank), float32(step), 1}); err != nil {
				t.Fatal(err)
			}
		}
		if want := []int{0, 2, -1, 1}; !slices.Equal(got, want) {
			t.Fatalf("step %d: events %v, want gradients of 0 and 2, the assignment, then 1's: %v", step, got, want)
		}
		for _, r := range []int{0, 1, 2} {
			if g := f.grads[r]; !slices.Equal(g, []float32{float32(r), float32(step), 1}) {
				t.Fatalf("step %d: rank %d's gradient reached the worker as %v", step, r, g)
			}
		}
	}
}

func TestDriverRefusesEventsOutOfTurn(t *testing.T) {
	t.Parallel()
	d, _ := newDriver([]int{0}, nil)
	if err := d.grad([]float32{1, 2, 3}); err == nil {
		t.Fatal("a gradient taken with no step open")
	}
	if v := next(t, d); v.kind != eventGradient {
		t.Fatalf("event %d, want a gradient", v.kind)
	}
	if _, err := d.next(0); err == nil {
		t.Fatal("the next event given while a gradient was pending")
	}
	var rej *wire.Reject
	if err := d.grad([]float32{1}); !errors.As(err, &rej) || rej.Reason != wire.ReasonBadLength {
		t.Fatalf("a gradient of 1 float for 3 parameters: %v, want a bad_length rejection", err)
	}
	if err := d.grad([]float32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if v := next(t, d); v.kind != eventDone {
		t.Fatalf("event %d, want done", v.kind)
	}
}

func TestDriverAbortEndsTheStep(t *testing.T) {
	t.Parallel()
	for _, at := range []int{eventGradient, eventAssigned} {
		d, f := newDriver([]int{0}, []int{1})
		v := next(t, d)
		if at == eventAssigned {
			if err := d.grad([]float32{1, 2, 3}); err != nil {
				t.Fatal(err)
			}
			v = next(t, d)
		}
		if v.kind != at {
			t.Fatalf("event %d, want %d", v.kind, at)
		}
		d.abort()
		if d.run != nil || f.step != 0 {
			t.Fatalf("after abort at event %d: a step open %v, the worker at step %d", at, d.run != nil, f.step)
		}
		// The step runs again, whole.
		for v := next(t, d); v.kind != eventDone; v = next(t, d) {
			if v.kind == eventGradient {
				if err := d.grad([]float32{1, 2, 3}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if f.step != 1 {
			t.Fatalf("the step after abort ended at %d, want 1", f.step)
		}
		d.abort() // no step open: nothing to do
	}
}

func TestDriverStepErrorEndsTheStep(t *testing.T) {
	t.Parallel()
	d, f := newDriver(nil, nil)
	f.hold = true
	if _, err := d.next(time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a step past its timeout: %v, want the deadline's error", err)
	}
	if d.run != nil {
		t.Fatal("the step is still open after its error")
	}
	f.hold = false
	if v := next(t, d); v.kind != eventDone || v.step != 1 {
		t.Fatalf("the next step: event %d at step %d, want done at 1", v.kind, v.step)
	}
}
