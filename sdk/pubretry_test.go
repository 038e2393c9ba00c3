package sdk_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// A Step that fails while its gradients' publishes are refused (the job's gradient stream is gone:
// JetStream answers "no responders") leaves nothing behind that publishes later. Once it has
// returned, the caller may write its next gradient into the same memory and the worker may rewrite
// its messages; a retry of the step with the same gradients then publishes them under new ids and
// completes. Before the fix nats.go itself retried such a publish 250 ms later, from the worker's
// own *nats.Msg: for f32 the caller's memory, so the gradient the caller wrote after Step returned
// went out under the failed step's message id.
func TestFailedStepLeavesNoPublishBehind(t *testing.T) {
	t.Parallel()
	for _, dt := range []wire.Dtype{wire.F32, wire.BF16} {
		t.Run(dt.String(), func(t *testing.T) { t.Parallel(); failedStepLeavesNoPublishBehind(t, dt) }) // a server each
	}
}

func failedStepLeavesNoPublishBehind(t *testing.T, dt wire.Dtype) {
	f := newFakeJob(t, spec("stale", "sum", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, shards := f.rec.Spec.ID, f.rec.Layout.Shards
	if len(shards) < 2 {
		t.Fatalf("want several shards, got %d", len(shards))
	}
	grads, err := f.js.Stream(ctx, wire.GradStream(id))
	if err != nil {
		t.Fatal(err)
	}
	gradCfg := grads.CachedInfo().Config
	if err := f.js.DeleteStream(ctx, wire.GradStream(id)); err != nil {
		t.Fatal(err)
	}
	p0, c, w := f.startAtStepZero(ctx, sdk.WithGradDtype(dt))
	if _, _, err := w.Params(ctx); err != nil {
		t.Fatal(err)
	}
	g := make([]float32, len(p0))
	testutil.Gradient(g, p0, 1, 0)
	sent := slices.Clone(g)

	failed, stop := context.WithCancel(ctx)
	stop()
	if _, err := w.Step(failed, g); !errors.Is(err, context.Canceled) {
		t.Fatalf("Step with a cancelled context: %v, want context.Canceled", err)
	}
	for i := range g { // the caller's next gradient, in the same memory
		g[i] = -1 - g[i]
	}
	// The server has taken every publish of the failed Step (and answered "no responders"): from
	// here on, a message on the job's gradient subjects was sent after Step returned.
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	late, err := f.nc.SubscribeSync(wire.GradWildcard(id))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// nats.go's retry came 250 ms after the answer; wait four times that for one.
	if m, err := late.NextMsg(time.Second); err == nil {
		t.Fatalf("after the failed Step returned, the worker published %s, %s", m.Header.Get(wire.HdrMsgID), payloadOf(f, m, dt, sent, g))
	} else if !errors.Is(err, nats.ErrTimeout) {
		t.Fatal(err)
	}
	if err := late.Unsubscribe(); err != nil {
		t.Fatal(err)
	}

	// The step again, with the same gradients, once the stream is back: under new message ids,
	// every shard's gradient as first computed; then the parameters the "runtime" publishes.
	copy(g, sent)
	if _, err := f.js.CreateStream(ctx, gradCfg); err != nil {
		t.Fatal(err)
	}
	type result struct {
		p   []float32
		err error
	}
	done := make(chan result, 1)
	go func() { p, err := w.Step(ctx, g); done <- result{p, err} }()
	stream, err := f.js.Stream(ctx, wire.GradStream(id))
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range shards {
		var m *jetstream.RawStreamMsg
		testutil.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
			m, err = stream.GetLastMsgForSubject(ctx, wire.GradSubject(id, s.ID))
			return err
		})
		want := make([]byte, dt.ElemSize()*s.Len)
		wire.Encode(want, sent[s.Off:s.Off+s.Len], dt)
		if got, wantID := m.Header.Get(wire.HdrMsgID), wire.GradAttemptMsgID(id, s.ID, 1, 0, 1); got != wantID || !bytes.Equal(m.Data, want) {
			t.Fatalf("shard %d: the retried step stored %s (want %s), its gradient as computed: %v", i, got, wantID, bytes.Equal(m.Data, want))
		}
	}
	if n := stream.CachedInfo().State.Msgs; n > uint64(len(shards)) {
		t.Fatalf("the gradient stream holds %d messages for %d shards", n, len(shards))
	}
	p1 := make([]float32, len(p0))
	for i := range p1 {
		p1[i] = p0[i] + sent[i]
	}
	f.publishAll(1, wire.F32, p1)
	r := <-done
	if r.err != nil {
		t.Fatalf("the retried step: %v", r.err)
	}
	if !bytes.Equal(bits(r.p), bits(p1)) || w.StepCount() != 1 {
		t.Fatalf("the retried step returned other parameters than published (step %d)", w.StepCount())
	}
}

// payloadOf says what a gradient message published after its Step failed carries.
func payloadOf(f *fakeJob, m *nats.Msg, dt wire.Dtype, sent, next []float32) string {
	i, ok := wire.ShardFromSubject(m.Subject)
	if !ok || i >= len(f.rec.Layout.Shards) {
		return "on " + m.Subject
	}
	s := f.rec.Layout.Shards[i]
	enc := func(v []float32) []byte {
		b := make([]byte, dt.ElemSize()*s.Len)
		wire.Encode(b, v[s.Off:s.Off+s.Len], dt)
		return b
	}
	switch {
	case bytes.Equal(m.Data, enc(next)):
		return fmt.Sprintf("shard %d with the gradient the caller wrote after Step returned", i)
	case bytes.Equal(m.Data, enc(sent)):
		return fmt.Sprintf("shard %d with the failed step's gradient", i)
	}
	return fmt.Sprintf("shard %d with %d bytes of neither gradient", i, len(m.Data))
}

// A gradient stream that stays full (no runtime drains it) fails Step after a bounded number of
// publishes, with a quota_exceeded rejection that wraps JetStream's refusal; before, the worker
// retried "maximum messages exceeded" until its context ended (forty minutes in the field).
func TestFullStreamFailsStepAfterBoundedRetries(t *testing.T) {
	t.Parallel()
	f := newFakeJob(t, spec("full", "sum", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := f.rec.Spec.ID
	stream, err := f.js.Stream(ctx, wire.GradStream(id))
	if err != nil {
		t.Fatal(err)
	}
	bound := stream.CachedInfo().Config.MaxMsgs
	for i := range bound { // stored gradients nobody applies or purges
		m := nats.NewMsg(wire.GradSubject(id, 0))
		m.Header.Set(wire.HdrMsgID, fmt.Sprintf("junk-%d", i))
		if _, err := f.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	const retries = 3
	p0, _, w := f.startAtStepZero(ctx, sdk.WithFullStreamRetries(retries))
	sent, err := f.nc.SubscribeSync(wire.GradSubject(id, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	_, err = w.Step(ctx, make([]float32, len(p0)))
	var apiErr *jetstream.APIError
	if !errors.Is(err, wire.ErrReason(wire.ReasonQuotaExceeded)) || !errors.As(err, &apiErr) || apiErr.ErrorCode != 10077 {
		t.Fatalf("Step into a full stream: %v, want a quota_exceeded rejection wrapping JetStream's maximum messages exceeded (10077)", err)
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := sent.Pending(); n != 1+retries {
		t.Fatalf("shard 0's gradient was published %d times, want %d (once, then %d retries)", n, 1+retries, retries)
	}
}
