package sdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/sdk/prom"
	"github.com/fanin-ml/fanin/wire"
)

func spec(id, fn string, ranks int) job.Spec {
	return job.Spec{
		ID: id, Ranks: ranks, ShardSize: 4 << 10,
		Tensors:  []job.Tensor{{Name: "w", Shape: []int{3000}}},
		Function: job.Function{Name: fn, Hyper: map[string]float64{}},
		Init:     job.Init{Kind: "uniform", Seed: 5, Scale: 1},
	}
}

func bits(v []float32) []byte {
	b := make([]byte, 4*len(v))
	functions.EncodeLE(b, v)
	return b
}

// A rank's non-finite gradient fails its Step with the runtime's reason; a corrected retry of the
// same step then succeeds and the result is the reference's. The worker metrics count it all.
func TestStepReportsRejectionThenRetrySucceeds(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := spec("nan", "sgd", 2)
	s.Function.Hyper["lr"] = 0.1
	rec, err := sdk.NewAdmin(st.HTTPURL).CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	c, err := sdk.Connect(ctx, st.URL, prom.WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w0, _ := c.Worker(ctx, rec.Spec.ID, 0)
	w1, _ := c.Worker(ctx, rec.Spec.ID, 1)
	_, init, err := w0.Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 2, rec.Layout.Ranges(), init)

	g0, g1 := make([]float32, len(init)), make([]float32, len(init))
	testutil.Gradient(g0, init, 1, 0)
	testutil.Gradient(g1, init, 1, 1)
	bad := append([]float32(nil), g1...)
	bad[1500] = float32(math.Inf(1))

	var wg sync.WaitGroup
	var p0 []float32
	var err0 error
	wg.Add(1)
	go func() { defer wg.Done(); p0, err0 = w0.Step(ctx, g0) }()
	_, err = w1.Step(ctx, bad)
	if !errors.Is(err, wire.ErrReason(wire.ReasonNonFinite)) {
		t.Fatalf("Step with Inf: %v, want a non_finite rejection", err)
	}
	p1, err := w1.Step(ctx, g1) // the same step again, corrected
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	wg.Wait()
	if err0 != nil {
		t.Fatal(err0)
	}
	ref.Step([][]float32{g0, g1}, nil)
	if !bytes.Equal(bits(p0), bits(ref.Params())) || !bytes.Equal(bits(p1), bits(ref.Params())) {
		t.Fatal("parameters after the retried step differ from the reference")
	}

	grad := float64(4 * len(init))
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{prom.WorkerSteps, map[string]string{"fanin_job": "nan", "rank": "0"}, 1},
		{prom.WorkerSteps, map[string]string{"fanin_job": "nan", "rank": "1"}, 1},
		{prom.WorkerStepErrors, map[string]string{"fanin_job": "nan", "rank": "1", "reason": "non_finite"}, 1},
		{prom.WorkerGradientBytes, map[string]string{"fanin_job": "nan", "rank": "1"}, 2 * grad}, // the bad one and its retry
		{prom.WorkerGradientBytes, map[string]string{"fanin_job": "nan", "rank": "0"}, grad},
		{prom.WorkerStepSeconds, map[string]string{"fanin_job": "nan", "rank": "1"}, 1}, // observations
		{prom.WorkerPublishSeconds, map[string]string{"fanin_job": "nan", "rank": "1"}, 2},
	} {
		if got := gathered(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// gathered is the value of the series name{labels} in reg: a counter's value, a histogram's count.
func gathered(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// FedAvg weights each rank by its WithWeight; the result equals the weighted reference.
func TestFedAvgWeights(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec, err := st.Gateway.CreateJob(ctx, spec("fed", "fedavg", 3))
	if err != nil {
		t.Fatal(err)
	}
	weights := []float64{100, 250, 50}
	c, _ := sdk.Connect(ctx, st.URL)
	defer c.Close()
	ws := make([]*sdk.Worker, 3)
	for r := range ws {
		if ws[r], err = c.Worker(ctx, rec.Spec.ID, r, sdk.WithWeight(weights[r])); err != nil {
			t.Fatal(err)
		}
	}
	_, init, _ := ws[0].Params(ctx)
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 3, rec.Layout.Ranges(), init)
	params := append([]float32(nil), init...)
	for step := int64(1); step <= 5; step++ {
		models := make([][]float32, 3)
		out := make([][]float32, 3)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for r := range ws {
			models[r] = make([]float32, len(params))
			testutil.Gradient(models[r], params, step, r) // a rank's local model
			wg.Add(1)
			go func() { defer wg.Done(); out[r], errs[r] = ws[r].Step(ctx, models[r]) }()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		ref.Step(models, weights)
		if !bytes.Equal(bits(out[0]), bits(ref.Params())) {
			t.Fatalf("step %d: fedavg differs from the weighted reference", step)
		}
		params = append(params[:0], out[0]...)
	}
}

func TestWorkerErrors(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _ := sdk.Connect(ctx, st.URL)
	defer c.Close()
	if _, err := c.Worker(ctx, "nope", 0); !errors.Is(err, sdk.ErrUnknownJob) {
		t.Fatalf("unknown job: %v", err)
	}
	s := spec("gone", "sum", 1)
	rec, err := st.Gateway.CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Worker(ctx, rec.Spec.ID, 1); !errors.Is(err, wire.ErrReason(wire.ReasonRankRange)) {
		t.Fatalf("rank 1 of a 1-rank job: %v", err)
	}
	if _, err := c.WorkerRanks(ctx, rec.Spec.ID, []int{0, 1}); !errors.Is(err, wire.ErrReason(wire.ReasonRankRange)) {
		t.Fatalf("ranks 0 and 1 of a 1-rank job: %v", err)
	}
	for _, ranks := range [][]int{nil, {0, 0}} {
		if _, err := c.WorkerRanks(ctx, rec.Spec.ID, ranks); err == nil {
			t.Fatalf("a worker of ranks %v was made", ranks)
		}
	}
	for _, d := range []time.Duration{0, -time.Second} { // a worker still short would fetch without pause
		if _, err := c.Worker(ctx, rec.Spec.ID, 0, sdk.WithFetchAfter(d)); err == nil || !strings.Contains(err.Error(), "fetch after must be > 0") {
			t.Fatalf("WithFetchAfter(%v): %v, want an error naming it", d, err)
		}
	}
	w, _ := c.Worker(ctx, rec.Spec.ID, 0)
	if _, err := w.StepRanks(ctx, [][]float32{make([]float32, 3000), make([]float32, 3000)}); err == nil {
		t.Fatal("StepRanks with two gradients for one rank succeeded")
	}
	if _, err := w.Step(ctx, make([]float32, 10)); err == nil {
		t.Fatal("Step with 10 gradients for 3000 parameters succeeded")
	}
	if _, _, err := w.Params(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Gateway.DeleteJob(ctx, rec.Spec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Step(ctx, make([]float32, 3000)); !errors.Is(err, sdk.ErrUnknownJob) {
		t.Fatalf("Step after the job was deleted: %v, want unknown_job", err)
	}
}

// A worker killed in the middle of publishing a step, then restarted, resumes it: Params returns
// every shard at the last complete step (not a mix of steps), Step publishes the step again under
// the same message ids, and training ends byte-identical to the reference with each step applied
// once.
func TestRestartMidStepResumes(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := spec("resume", "adam", 2)
	s.Function.Hyper["lr"] = 0.01
	rec, err := sdk.NewAdmin(st.HTTPURL).CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Layout.NumShards() < 3 {
		t.Fatalf("want several shards, got %d", rec.Layout.NumShards())
	}
	connect := func() *sdk.Client {
		c, err := sdk.Connect(ctx, st.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	w0, _ := connect().Worker(ctx, rec.Spec.ID, 0)
	w1, _ := connect().Worker(ctx, rec.Spec.ID, 1)
	_, init, err := w0.Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := w1.Params(ctx); err != nil {
		t.Fatal(err)
	}
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 2, rec.Layout.Ranges(), init)
	params := append([]float32(nil), init...)
	g := [][]float32{make([]float32, len(init)), make([]float32, len(init))}
	step := func(t0 int64, ws ...*sdk.Worker) {
		var wg sync.WaitGroup
		errs := make([]error, len(ws))
		for r, w := range ws {
			wg.Add(1)
			go func() { defer wg.Done(); _, errs[r] = w.Step(ctx, g[r]) }()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("step %d: %v", t0, err)
		}
	}
	const steps, crashAt = 8, 4
	for t0 := int64(1); t0 < crashAt; t0++ {
		for r := range g {
			testutil.Gradient(g[r], params, t0, r)
		}
		step(t0, w0, w1)
		ref.Step(g, nil)
		params = append(params[:0], ref.Params()...)
	}

	// Step crashAt: rank 1 publishes shard 0 only, as the SDK would have (same message id), then
	// dies; rank 0 publishes everything, so shard 0 completes step crashAt and the others wait.
	for r := range g {
		testutil.Gradient(g[r], params, crashAt, r)
	}
	done0 := make(chan error, 1)
	go func() { _, err := w0.Step(ctx, g[0]); done0 <- err }()
	sh := rec.Layout.Shards[0]
	raw := connect()
	js, _ := jetstream.New(raw.Conn())
	half := wire.GradMsg(wire.Grad{Job: rec.Spec.ID, Shard: sh.ID, Step: crashAt, Rank: 1}, bits(g[1][sh.Off:sh.Off+sh.Len]))
	if _, err := js.PublishMsg(ctx, half); err != nil {
		t.Fatal(err)
	}
	params0 := testutil.DirectGetter(raw.Conn(), wire.ParamsStream(rec.Spec.ID))
	testutil.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		m, err := params0.GetLastMsgForSubject(ctx, wire.ParamsSubject(rec.Spec.ID, sh.ID))
		if err != nil {
			return err
		}
		if step, _ := wire.ParseStep(m.Header); step != crashAt {
			return fmt.Errorf("shard 0 at step %d", step)
		}
		return nil
	})

	// The restarted rank 1 reads one step for every shard: crashAt-1, shard 0's previous version.
	w1b, err := connect().Worker(ctx, rec.Spec.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	got, vec, err := w1b.Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got != crashAt-1 || !bytes.Equal(bits(vec), bits(params)) {
		t.Fatalf("restarted worker's parameters: step %d, equal to step %d's: %v", got, crashAt-1, bytes.Equal(bits(vec), bits(params)))
	}
	if _, err := w1b.Step(ctx, g[1]); err != nil {
		t.Fatalf("the resumed step: %v", err)
	}
	if err := <-done0; err != nil {
		t.Fatal(err)
	}
	ref.Step(g, nil)
	params = append(params[:0], ref.Params()...)
	for t0 := int64(crashAt + 1); t0 <= steps; t0++ {
		for r := range g {
			testutil.Gradient(g[r], params, t0, r)
		}
		step(t0, w0, w1b)
		ref.Step(g, nil)
		params = append(params[:0], ref.Params()...)
	}
	final := testutil.ParamsAt(t, params0, rec, steps)
	if !bytes.Equal(bits(final), bits(ref.Params())) {
		t.Fatal("after a restart in the middle of a step, the parameters differ from the reference")
	}
	var applied int64
	for _, rt := range st.AllRuntimes() {
		applied += rt.Stats().Invocations
	}
	if want := int64(steps * rec.Layout.NumShards()); applied != want {
		t.Fatalf("%d shard updates applied, want %d", applied, want)
	}
}

// Connect dials with its context: a cancelled one fails at once and returns no client.
func TestConnectHonoursContext(t *testing.T) {
	t.Parallel()
	url := testutil.NATS(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if c, err := sdk.Connect(ctx, url); err == nil || c != nil {
		t.Fatalf("Connect with a cancelled context: %v, %v", c, err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sdk.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// A job record whose bucket answers "no responders" for a moment (a stream electing its leader; a
// job account's imports re-added while its first connections register it) is read once it
// answers, not reported as missing.
func TestJobWaitsOutNoResponders(t *testing.T) {
	t.Parallel()
	url := testutil.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := sdk.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	rec := job.Record{Spec: spec("late", "sum", 1)}
	val, _ := json.Marshal(rec)
	type result struct {
		rec *job.Record
		err error
	}
	asked := c.Conn().Stats().OutMsgs
	done := make(chan result, 1)
	go func() {
		rec, err := c.Job(ctx, "late")
		done <- result{rec, err}
	}()
	// No responders until the client has asked twice: its first request was answered so, and it
	// asked again.
	testutil.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		if n := c.Conn().Stats().OutMsgs - asked; n < 2 {
			return fmt.Errorf("%d reads of the record so far", n)
		}
		return nil
	})
	if _, err := nc.Subscribe(wire.JobRecordGet("late"), func(m *nats.Msg) { _ = m.Respond(val) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.rec.Spec.ID != "late" {
		t.Fatalf("read a job whose bucket answered \"no responders\" at first: %+v, %v", r.rec, r.err)
	}
}

// A direct get whose reply is lost (the stream's leader died before it answered) is asked again:
// with a context that has no deadline, as a worker's Step has, the read returns the second
// attempt's answer instead of waiting forever.
func TestJobAsksAgainForALostReply(t *testing.T) {
	t.Parallel()
	url := testutil.NATS(t)
	c, err := sdk.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	val, _ := json.Marshal(job.Record{Spec: spec("lost", "sum", 1)})
	var asked atomic.Int32
	if _, err := nc.Subscribe(wire.JobRecordGet("lost"), func(m *nats.Msg) {
		if asked.Add(1) > 1 { // the first request goes unanswered
			_ = m.Respond(val)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rec *job.Record
		err error
	}
	done := make(chan result, 1)
	go func() {
		rec, err := c.Job(context.Background(), "lost")
		done <- result{rec, err}
	}()
	select {
	case r := <-done:
		if r.err != nil || r.rec.Spec.ID != "lost" || asked.Load() != 2 {
			t.Fatalf("read %v, %v after %d requests", r.rec, r.err, asked.Load())
		}
	case <-time.After(20 * time.Second): // a guard, not a measure: one attempt lasts 2 s
		t.Fatalf("the read still waits for the lost reply after %d requests", asked.Load())
	}
}

// WithParamsBuffer: Params and Step write into the caller's buffer and return it, bit-identical to
// the reference; a buffer of the wrong size is refused, naming both sizes.
func TestParamsBuffer(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := spec("buf", "adam", 1)
	rec, err := sdk.NewAdmin(st.HTTPURL).CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	c, err := sdk.Connect(ctx, st.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Worker(ctx, "buf", 0, sdk.WithParamsBuffer(make([]float32, 5))); err == nil ||
		!strings.Contains(err.Error(), "has 5 elements") || !strings.Contains(err.Error(), "3000 parameters") {
		t.Fatalf("a buffer of 5 elements: %v", err)
	}
	buf := make([]float32, rec.Layout.Elements)
	w, err := c.Worker(ctx, "buf", 0, sdk.WithParamsBuffer(buf))
	if err != nil {
		t.Fatal(err)
	}
	_, init, err := w.Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if &init[0] != &buf[0] {
		t.Fatal("Params did not return the caller's buffer")
	}
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 1, rec.Layout.Ranges(), init)
	g := make([]float32, len(buf))
	for step := 0; step < 3; step++ {
		testutil.Gradient(g, buf, 1, 0)
		ref.Step([][]float32{g}, nil)
		p, err := w.Step(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		if &p[0] != &buf[0] || !bytes.Equal(bits(buf), bits(ref.Params())) {
			t.Fatalf("step %d: the buffer does not hold the reference's parameters", step+1)
		}
	}
}
