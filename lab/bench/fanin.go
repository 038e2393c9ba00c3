package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/sdk"
)

// startFanin brings up fanin in this process (embedded NATS with JetStream, gateway, placer,
// w.Runtimes runtimes), creates the workload's job and connects w.Ranks SDK workers, each over
// its own NATS connection.
func startFanin(ctx context.Context, rs *runState, w workload, dir string) (*system, error) {
	return startFaninAs(ctx, rs, w, dir, false)
}

// startFaninSecured is startFanin with security on, as `fanin dev` runs: the NATS server in
// operator mode, the job's workers users of the job's own account (its credentials).
func startFaninSecured(ctx context.Context, rs *runState, w workload, dir string) (*system, error) {
	return startFaninAs(ctx, rs, w, dir, true)
}

func startFaninAs(ctx context.Context, rs *runState, w workload, dir string, secured bool) (_ *system, err error) {
	st, err := devstack.Start(ctx, devstack.Config{DataDir: dir, NATSPort: -1, Runtimes: w.Runtimes, Logger: rs.stackLog, Auth: secured})
	if err != nil {
		return nil, fmt.Errorf("start fanin: %w", err)
	}
	var clients []*sdk.Client
	var workers []*sdk.Worker
	closeAll := func() {
		for _, wk := range workers {
			_ = wk.Close()
		}
		for _, c := range clients {
			c.Close()
		}
		st.Close()
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	created, err := st.Gateway.SubmitJob(ctx, w.spec("bench"))
	if err != nil {
		return nil, fmt.Errorf("create job: %w", err)
	}
	rec := &created.Record
	var creds []sdk.Option
	if created.Credentials != nil {
		creds = append(creds, sdk.WithJobCredentials(created.Credentials))
	}
	sys := &system{close: closeAll}
	var retries atomic.Int64
	for r := range w.Ranks {
		c, err := sdk.Connect(ctx, st.URL, creds...)
		if err != nil {
			return nil, err
		}
		clients = append(clients, c)
		wk, err := c.Worker(ctx, rec.Spec.ID, r)
		if err != nil {
			return nil, err
		}
		workers = append(workers, wk)
		sys.ranks = append(sys.ranks, &retrying{w: wk, retries: &retries})
	}
	sys.funcTime = func() time.Duration {
		var d time.Duration
		for _, rt := range st.AllRuntimes() {
			d += rt.Stats().FuncTime
		}
		return d
	}
	// fanin recovers from what these count (redelivery, retries), so they do not make a run
	// invalid; they are reported with the figure, as they explain it.
	sys.observe = func() string {
		var notes []string
		if n := retries.Load(); n > 0 {
			notes = append(notes, fmt.Sprintf("%d Step call(s) failed and were retried", n))
		}
		if n := st.NATS.NumSlowConsumers(); n > 0 {
			notes = append(notes, fmt.Sprintf("the NATS server cut %d slow consumer(s) (max_pending exceeded)", n))
		}
		for _, rt := range st.AllRuntimes() {
			for reason, n := range rt.Stats().Rejects {
				notes = append(notes, fmt.Sprintf("runtime %s rejected %d gradient(s): %s", rt.ID(), n, reason))
			}
		}
		return strings.Join(notes, "; ")
	}
	sys.notes = fmt.Sprintf("%d shards, %d runtimes, JetStream memory storage", rec.Layout.NumShards(), w.Runtimes)
	return sys, nil
}

// stepRetries is how many times a rank retries a failed Step before the measurement fails.
const stepRetries = 3

// retrying is a worker driven as a training loop drives one: a Step that fails (JetStream
// refused a gradient with 429 Too Many Requests, say) is retried; Worker.Step makes a retry safe
// (new message ids; the runtime refuses a second gradient of a rank for a step). Retries are
// counted and reported with the figure.
type retrying struct {
	w       *sdk.Worker
	retries *atomic.Int64
}

func (r *retrying) Step(ctx context.Context, grads []float32) ([]float32, error) {
	var errs []error
	for range 1 + stepRetries {
		p, err := r.w.Step(ctx, grads)
		if err == nil {
			return p, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
		r.retries.Add(1)
	}
	return nil, errors.Join(errs...)
}
