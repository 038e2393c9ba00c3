package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// A job that aggregates faster than its bytes/s quota is throttled: paused with a quota_exceeded
// rejection that says by how much, then resumed by itself. Nothing is lost or changed: it ends
// with the reference's parameters.
func TestQuotaBytesPerSecond(t *testing.T) {
	t.Parallel()
	const quota = 100_000 // bytes/s; the job aggregates 8040 bytes per step
	st := authStack(t, 1, gateway.WithQuotaBurst(time.Second), gateway.WithGovernorInterval(250*time.Millisecond))
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	var team api.TeamCreated
	c.call("POST", "/v1/tokens", "application/json", fmt.Sprintf(`{"name":"fast","quota":{"bytes_per_second":%d}}`, quota), 201, &team)
	var created api.JobCreated
	c.with(team.Token).call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("fast")), 201, &created)
	if created.Quota.BytesPerSecond != quota {
		t.Fatalf("the job's quota: %+v", created.Quota)
	}

	const steps = 120
	ctx := context.Background()
	done := make(chan error, 1)
	var final []float32
	start := time.Now()
	go func() {
		cl, err := sdk.Connect(ctx, st.URL, sdk.WithJobCredentials(created.Credentials))
		if err != nil {
			done <- err
			return
		}
		defer cl.Close()
		w, err := cl.Worker(ctx, "fast", 0)
		if err != nil {
			done <- err
			return
		}
		defer w.Close()
		step, params, err := w.Params(ctx)
		if err != nil {
			done <- err
			return
		}
		g := make([]float32, len(params))
		for ; step < steps; step++ {
			testutil.Gradient(g, params, step+1, 0)
			if params, err = w.Step(ctx, g); err != nil {
				done <- err
				return
			}
			time.Sleep(30 * time.Millisecond) // the job's pace: 8040 bytes a step, over twice its quota
		}
		final = append([]float32(nil), params...)
		done <- nil
	}()

	// Throttled, then running again by itself.
	jc := c.with(created.Token)
	var st0 api.JobStatus
	testutil.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		jc.call("GET", "/v1/jobs/fast", "", "", 200, &st0)
		if st0.State != api.StateThrottled {
			return fmt.Errorf("state %s at step %d", st0.State, st0.Step)
		}
		return nil
	})
	throttledAt := st0.Step
	testutil.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		jc.call("GET", "/v1/jobs/fast", "", "", 200, &st0)
		if st0.State != api.StateRunning || st0.Step <= throttledAt {
			return fmt.Errorf("state %s at step %d", st0.State, st0.Step)
		}
		return nil
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	if !bytes.Equal(f32bytes(final), f32bytes(reference(t, &created.Record, steps))) {
		t.Fatal("a throttled job's parameters differ from the reference")
	}
	var rj api.Rejects
	jc.call("GET", "/v1/jobs/fast/rejects", "", "", 200, &rj)
	if rj.Counts[wire.ReasonQuotaExceeded] < 1 || !strings.Contains(rj.Recent[0].Detail, "beyond its quota of 100000 bytes/s") {
		t.Fatalf("rejects: %+v", rj)
	}
	// The governor meters with load reports a second apart and a pause takes effect once the
	// runtimes let go, so a job overshoots by a few seconds of its own rate before it is paused;
	// the overshoot is debited, and over a long run the rate converges to the quota.
	total := float64(steps * created.Layout.Elements * 4)
	t.Logf("%d steps (%.0f bytes) in %v (%.0f bytes/s) under a quota of %d bytes/s; throttled %d times", steps, total,
		elapsed.Round(time.Millisecond), total/elapsed.Seconds(), quota, rj.Counts[wire.ReasonQuotaExceeded])
}

// The bytes/s quota counts what a job sends, not only what the runtimes aggregate: a job that
// floods its stream with gradients no runtime applies (steps far ahead) is throttled, and while it
// is throttled the NATS servers refuse its publishes (its account imports no gradient subjects).
// Its stream never holds more than its storage bound.
func TestQuotaCountsWhatIsSent(t *testing.T) {
	t.Parallel()
	const quota = 50_000 // bytes/s
	st := authStack(t, 1, gateway.WithQuotaBurst(time.Second), gateway.WithGovernorInterval(250*time.Millisecond))
	c := client{t: t, base: st.HTTPURL, token: st.AdminToken}
	var team api.TeamCreated
	c.call("POST", "/v1/tokens", "application/json", fmt.Sprintf(`{"name":"flood","quota":{"bytes_per_second":%d}}`, quota), 201, &team)
	var created api.JobCreated
	c.with(team.Token).call("POST", "/v1/jobs", "application/json", specJSON(smallSpec("flood")), 201, &created)
	nc := natsAs(t, st.URL, created.Credentials, nil)
	js, _ := jetstream.New(nc)
	shard := created.Layout.Shards[0]
	payload := make([]byte, shard.Bytes())

	// Far-future steps: stored (until the bound), never aggregated.
	ctx := context.Background()
	jc := c.with(created.Token)
	var status api.JobStatus
	refused := 0
	for step := int64(100); step < 100_000 && status.State != api.StateThrottled; step++ {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		if _, err := js.PublishMsg(pctx, gradMsg("flood", shard.ID, step, 0, payload)); err != nil {
			refused++
		}
		cancel()
		if step%10 == 0 {
			jc.call("GET", "/v1/jobs/flood", "", "", 200, &status)
		}
	}
	if status.State != api.StateThrottled {
		t.Fatalf("a job sending far beyond its quota is %s", status.State)
	}
	// Throttled: its publishes are refused by the server, not stored.
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := js.PublishMsg(pctx, gradMsg("flood", shard.ID, 1, 0, payload))
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, jetstream.ErrNoStreamResponse) {
			return fmt.Errorf("a throttled job's publish: %v", err)
		}
		// Nor does the server pass on its elastic workers' beats: no responders, where a running
		// job's beat sent as a request reaches the autoscaler, which does not answer a good one.
		if _, err := nc.Request(wire.WorkersSubject("flood"), []byte(`{"id":"w0","step":-1}`), 200*time.Millisecond); !errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("a throttled job's beat: %v", err)
		}
		return nil
	})
	comp, err := st.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer comp.Close()
	cjs, _ := jetstream.New(comp)
	gs, err := cjs.Stream(ctx, wire.GradStream("flood"))
	if err != nil {
		t.Fatal(err)
	}
	bound, _ := store.JobStorageBound(&created.Record)
	if got := gs.CachedInfo().State.Bytes; got > uint64(bound) {
		t.Fatalf("the stream holds %d bytes, beyond the job's bound %d", got, bound)
	}
	var rj api.Rejects
	jc.call("GET", "/v1/jobs/flood/rejects", "", "", 200, &rj)
	// The runtime refuses the far-future steps it takes before the throttle (future_step): the
	// quota's rejection is among the recent ones, not necessarily the first.
	said := slices.ContainsFunc(rj.Recent, func(r api.RejectRecord) bool {
		return r.Reason == wire.ReasonQuotaExceeded && strings.Contains(r.Detail, "sent or aggregated")
	})
	if rj.Counts[wire.ReasonQuotaExceeded] < 1 || !said {
		t.Fatalf("rejects: %+v", rj)
	}
	t.Logf("throttled after %d refused publishes; stream holds %d bytes (bound %d)", refused, gs.CachedInfo().State.Bytes, bound)
}
