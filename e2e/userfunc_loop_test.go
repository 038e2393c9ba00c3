package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/lab/wasmbuild"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// stepStats describes step durations: their count, median, 90th percentile and maximum.
func stepStats(d []time.Duration) string {
	if len(d) == 0 {
		return "no steps"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))].Round(time.Millisecond) }
	return fmt.Sprintf("%d steps, median %v, p90 %v, max %v", len(s), q(0.5), q(0.9), s[len(s)-1].Round(time.Millisecond))
}

// On one runtime process, a job trains while another job's user function loops until its time
// limit (2 s, the default) at every call, until that job is paused after three failures in a row.
// The test checks what must hold (the looping job is refused with function_failed at its time
// limit and paused; the other job stays bit-exact) and reports the other job's step times before
// and during the loop: the measurement of whether other jobs keep their step time. It asserts
// nothing about the times, which depend on the machine's load.
func TestUserFunctionLoopNeighbour(t *testing.T) {
	skipShort(t)
	attack := wasmbuild.ForTest(t, "../functions/wasmfn/testdata/attack")
	c := startCluster(t, "rt-0")
	admin := sdk.NewAdmin(c.api)
	loopFn := uploadFunction(t, c.api, "attack", attack)

	steady, err := admin.CreateJob(context.Background(), clusterSpec("steady", "sgd"))
	if err != nil {
		t.Fatal(err)
	}
	tt := &timedTrainer{trainer: newTrainer(t, c.url, steady), rec: steady}
	tt.run(40) // the first steps include placement and warm-up: only the last 30 count
	before := gaps(tt.done[len(tt.done)-31:])

	loopSpec := job.Spec{ID: "looper", Tensors: []job.Tensor{{Name: "w", Shape: []int{256}}}, Ranks: 1,
		Function: job.Function{Name: loopFn, Hyper: map[string]float64{"mode": 1}}, // mode 1: for {}
		Init:     job.Init{Kind: "zeros"}, ShardSize: 4 << 10, Storage: "memory"}
	if _, err := admin.CreateJob(context.Background(), loopSpec); err != nil {
		t.Fatal(err)
	}
	conn, err := sdk.Connect(context.Background(), c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w, err := conn.Worker(context.Background(), loopSpec.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	stepCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stepDone := make(chan error, 1)
	go func() { // the step never completes: its function never returns
		_, err := w.Step(stepCtx, make([]float32, 256))
		stepDone <- err
	}()

	// Train the steady job until the looping job is paused (3 calls of 2 s and the backoffs).
	start := time.Now()
	first := len(tt.done)
	state := ""
	for state != api.StatePaused {
		if time.Since(start) > 90*time.Second {
			t.Fatalf("the looping job is not paused after %v (state %q)", time.Since(start).Round(time.Second), state)
		}
		tt.run(tt.step + 1)
		ctx, cancelStatus := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := admin.JobStatus(ctx, loopSpec.ID)
		cancelStatus()
		if err != nil {
			t.Fatal(err)
		}
		state = st.State
	}
	loopFor := time.Since(start)
	during := gaps(tt.done[first-1:])
	tt.run(tt.step + 20)
	after := gaps(tt.done[len(tt.done)-21:])
	tt.checkUpdates(c.url)

	var rej *api.Rejects
	testutil.CheckFor(t, 15*time.Second, 200*time.Millisecond, func() (err error) { // the count is kept apart from the pause
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if rej, err = admin.Rejects(ctx, loopSpec.ID, 10); err == nil && rej.Counts[wire.ReasonFunctionFailed] < 3 {
			err = fmt.Errorf("the looping job's rejects: %+v", rej.Counts)
		}
		return err
	})
	for _, r := range rej.Recent {
		if r.Reason == wire.ReasonFunctionFailed && !strings.Contains(r.Detail, "time limit") {
			t.Fatalf("a looping call failed otherwise than at its time limit: %s", r.Detail)
		}
	}
	t.Logf("steady job (sgd, 4 ranks, 7 shards) on the runtime that runs the looping function:\n"+
		"  before the loop:            %s\n  while it loops (%v, %d failed calls): %s\n  after its pause:             %s",
		stepStats(before), loopFor.Round(100*time.Millisecond), rej.Counts[wire.ReasonFunctionFailed], stepStats(during), stepStats(after))
	cancel()
	<-stepDone
}

// gaps returns the durations between consecutive completion times.
func gaps(done []time.Time) []time.Duration {
	var d []time.Duration
	for i := 1; i < len(done); i++ {
		d = append(d, done[i].Sub(done[i-1]))
	}
	return d
}
