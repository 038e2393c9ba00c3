package sdk_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
)

// elasticRun is a set of elastic workers of one job in this process, each on its own connection,
// recording the parameters every step returned.
type elasticRun struct {
	t        *testing.T
	url      string
	job      string
	elements int

	mu    sync.Mutex
	steps map[int64][]byte // step -> the parameters' bits (every worker must agree)
	held  map[string]int   // worker -> the most ranks it held after a step
	end   int64            // the last step: 5 after e and f both held ranks
	errs  []error
	wg    sync.WaitGroup
}

func (r *elasticRun) record(id string, step int64, p []float32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := bits(p)
	if old, ok := r.steps[step]; ok && !bytes.Equal(old, b) {
		r.errs = append(r.errs, fmt.Errorf("worker %s: step %d differs from another worker's", id, step))
	}
	r.steps[step] = b
}

// grad is every rank's gradient: a function of rank, step and parameters only.
func grad(_ context.Context, rank int, step int64, params, g []float32) error {
	testutil.Gradient(g, params, step, rank)
	time.Sleep(2 * time.Millisecond) // a little compute: membership changes land between steps
	return nil
}

// start runs worker id until stop returns true after a step; then it leaves (graceful) or, with
// kill, closes its connection without a word, as a process killed would.
func (r *elasticRun) start(id string, stop func(step int64) bool, kill bool) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c, err := sdk.Connect(ctx, r.url)
		if err != nil {
			r.fail(err)
			return
		}
		defer c.Close()
		opts := []sdk.ElasticOption{sdk.WithWorkerID(id)}
		var buf []float32
		if id == "a" { // a's parameters land in a buffer of its own
			buf = make([]float32, r.elements)
			opts = append(opts, sdk.WithElasticParamsBuffer(buf))
		}
		e, err := c.Elastic(ctx, r.job, opts...)
		if err != nil {
			r.fail(err)
			return
		}
		for {
			p, err := e.Step(ctx, grad)
			if err != nil {
				r.fail(fmt.Errorf("worker %s: %w", id, err))
				return
			}
			if buf != nil && &p[0] != &buf[0] {
				r.fail(fmt.Errorf("worker %s: Step returned a slice other than its parameters buffer", id))
				return
			}
			r.record(id, e.StepCount(), p)
			r.mu.Lock()
			r.held[id] = max(r.held[id], len(e.Ranks()))
			r.mu.Unlock()
			if stop(e.StepCount()) {
				break
			}
		}
		if kill {
			c.Close() // no Leave: the beats stop, the assignment moves the ranks after the lapse
			return
		}
		if err := e.Leave(ctx); err != nil {
			r.fail(err)
		}
	}()
}

// untilEnd stops a worker at the last step, set once e and f (the late joiners) hold ranks.
func (r *elasticRun) untilEnd(step int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.end == 0 && r.held["e"] > 0 && r.held["f"] > 0 {
		r.end = step + 5
	}
	return r.end != 0 && step >= r.end
}

func (r *elasticRun) fail(err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
}

// reached reports whether a worker has returned step's parameters; if not, it says so with the
// workers' errors so far.
func (r *elasticRun) reached(step int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.steps[step]; !ok {
		return fmt.Errorf("step %d not reached: %v", step, r.errs)
	}
	return nil
}

// TestElasticWorkersComeAndGo trains a job of 4 logical ranks on elastic workers: 4, then 3 (one
// leaves), then 2 (one dies), then 1 (one leaves), then 3 (two join). Every step's parameters,
// whichever worker returned them, are byte-identical to the reference of 4 fixed ranks.
func TestElasticWorkersComeAndGo(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := spec("elastic", "adam", 4)
	s.Function.Hyper["lr"] = 0.01
	rec, err := sdk.NewAdmin(st.HTTPURL).CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	r := &elasticRun{t: t, url: st.URL, job: rec.Spec.ID, elements: rec.Layout.Elements, steps: map[int64][]byte{}, held: map[string]int{}}
	r.start("a", r.untilEnd, false)
	r.start("b", func(t int64) bool { return t >= 30 }, false)
	r.start("c", func(t int64) bool { return t >= 20 }, true)
	r.start("d", func(t int64) bool { return t >= 10 }, false)
	testutil.CheckFor(t, time.Minute, 20*time.Millisecond, func() error { return r.reached(38) })
	r.start("e", r.untilEnd, false)
	r.start("f", r.untilEnd, false)
	r.wg.Wait()
	for _, err := range r.errs {
		t.Error(err)
	}
	// a held one rank among four workers, and all four once alone; e and f held some after joining.
	if r.held["a"] != 4 || r.held["e"] == 0 || r.held["f"] == 0 {
		t.Errorf("most ranks held: %v, want a 4 (alone from step 30) and e, f some", r.held)
	}

	c, err := sdk.Connect(ctx, st.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, err := c.Worker(ctx, rec.Spec.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ref := testutil.Reference(t, rec)
	grads := make([][]float32, 4)
	for i := range grads {
		grads[i] = make([]float32, rec.Layout.Elements)
	}
	last := r.end
	for step := int64(1); step <= last; step++ {
		for rank := range grads {
			testutil.Gradient(grads[rank], ref.Params(), step, rank)
		}
		ref.Step(grads, nil)
		got, ok := r.steps[step]
		if !ok {
			continue // no worker returned this step (a worker that joined late skips to the newest)
		}
		if !bytes.Equal(got, bits(ref.Params())) {
			t.Fatalf("step %d differs from the reference", step)
		}
	}
	step, final, err := w.Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if step != last || !bytes.Equal(bits(final), bits(ref.Params())) {
		t.Fatalf("final parameters at step %d (want %d) differ from the reference", step, last)
	}
}

// TestElasticSSPWorkerDies: an ssp job (s = 2) of 3 logical ranks on 3 elastic workers; one
// worker's connection is dropped between two steps. Its rank moves, the new owner catches up the
// steps it misses, and the others, which could run only 2 steps ahead of it, go on to step 40.
// The result is byte-identical to the reference recomputing every stored gradient from the version
// its worker recorded.
func TestElasticSSPWorkerDies(t *testing.T) {
	t.Parallel()
	elasticSSPWorkerDies(t, nil)
}

// TestElasticSSPWorkerKilledMidPublish: as TestElasticSSPWorkerDies, but worker b dies inside a
// step, at a fault point around one of its gradient messages: after its record of the intent and
// before the publish (nothing stored: the record is of a message that never was), or after the
// publish and before its acknowledgement is recorded (stored, and b never learns it: the case
// that left a stored gradient with no record while the record was written after the
// acknowledgement). Either way a replay from the records reproduces the run bit for bit.
func TestElasticSSPWorkerKilledMidPublish(t *testing.T) {
	t.Parallel()
	for _, at := range []sdk.RecordOutcome{sdk.RecordIntended, sdk.RecordStored} {
		t.Run("at "+string(at), func(t *testing.T) {
			t.Parallel() // a stack each
			elasticSSPWorkerDies(t, &killPoint{outcome: at})
		})
	}
}

// killPoint kills worker b (closes its connection) at its first record of outcome at step 15 or
// later: the record of the intent is kept, the record of the acknowledgement is lost with it.
type killPoint struct {
	outcome sdk.RecordOutcome
	killed  bool
}

func elasticSSPWorkerDies(t *testing.T, kill *killPoint) {
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := spec("elastic-ssp", "adam", 3)
	s.Function.Hyper["lr"] = 0.01
	s.Sync, s.Staleness = "ssp", 2
	rec, err := sdk.NewAdmin(st.HTTPURL).CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	const last, dies = 40, 15
	var mu sync.Mutex // guards records and kill
	var records []sdk.GradRecord
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, id := range []string{"a", "b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := sdk.Connect(ctx, st.URL)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			e, err := c.Elastic(ctx, rec.Spec.ID, sdk.WithWorkerID(id), sdk.WithRecord(func(r sdk.GradRecord) {
				mu.Lock()
				defer mu.Unlock()
				if kill != nil && id == "b" && r.Step >= dies && (kill.killed || r.Outcome == kill.outcome) {
					if !kill.killed && r.Outcome == sdk.RecordIntended {
						records = append(records, r) // written, then the process dies
					}
					kill.killed = true
					c.Close() // the fault point: b's connection dies here, the publish (or the rest) with it
					return
				}
				records = append(records, r)
			}))
			if err != nil {
				errs <- err
				return
			}
			for e.OwnStep() < last {
				if _, err := e.Step(ctx, func(_ context.Context, rank int, step int64, p, g []float32) error {
					testutil.Gradient(g, p, step, rank)
					if id == "c" {
						time.Sleep(5 * time.Millisecond)
					}
					return nil
				}); err != nil {
					mu.Lock()
					dead := kill != nil && kill.killed && id == "b"
					mu.Unlock()
					if !dead {
						errs <- fmt.Errorf("worker %s: %w", id, err)
					}
					return
				}
				if v := slices.Min(e.Versions()); v < e.OwnStep()-2 {
					errs <- fmt.Errorf("worker %s: after its step %d it holds version %d, beyond the bound", id, e.OwnStep(), v)
					return
				}
				if kill == nil && id == "b" && e.OwnStep() >= dies && len(e.Ranks()) > 0 {
					c.Close() // between two steps: nothing of b's in flight
					return
				}
			}
			if err := e.Leave(ctx); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if kill != nil && !kill.killed {
		t.Fatal("worker b never reached the fault point")
	}
	got := finalParams(t, st.URL, rec, last)

	mu.Lock()
	defer mu.Unlock()
	want := testutil.ReplaySSP(t, rec, last, sdk.RecordedVersions(records))
	if !bytes.Equal(bits(got), bits(want)) {
		t.Fatal("the ssp run with a worker lost differs from the reference replayed from the records")
	}
}
