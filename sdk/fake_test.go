package sdk_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// fakeJob is a job on a bare embedded NATS server with no runtime: its record in the jobs bucket
// and its streams as fanin creates them, the test acting as the runtime (it publishes the
// parameters messages). What a worker sends and receives is then the test's to choose and see.
type fakeJob struct {
	t   *testing.T
	url string
	nc  *nats.Conn
	js  jetstream.JetStream
	rec *job.Record
}

func newFakeJob(t *testing.T, s job.Spec) *fakeJob {
	t.Helper()
	url := testutil.NATS(t)
	nc, js := testutil.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.Normalize()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	rec := job.NewRecord(s, time.Now())
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.JobsBucket})
	if err != nil {
		t.Fatal(err)
	}
	val, _ := json.Marshal(rec)
	if _, err := kv.Put(ctx, s.ID, val); err != nil {
		t.Fatal(err)
	}
	if err := store.CreateJobStreams(ctx, js, &rec, nc.MaxPayload(), nil); err != nil {
		t.Fatal(err)
	}
	return &fakeJob{t: t, url: url, nc: nc, js: js, rec: &rec}
}

// publishParams stores (and so pushes) the parameters of shard i after step as a runtime does,
// vals encoded in dt. data, when not nil, is the payload as given instead (a malformed one).
func (f *fakeJob) publishParams(i int, step int64, dt wire.Dtype, vals []float32, data []byte) {
	f.t.Helper()
	if data == nil {
		data = make([]byte, dt.ElemSize()*len(vals))
		wire.Encode(data, vals, dt)
	}
	m := wire.ParamsMsg(f.rec.Spec.ID, "", f.rec.Layout.Shards[i].ID, step, uint64(step), data)
	wire.SetParamsHeaders(m.Header, f.rec.Spec.ID, "", f.rec.Layout.Shards[i].ID, step, uint64(step), dt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.js.PublishMsg(ctx, m); err != nil {
		f.t.Fatal(err)
	}
}

// publishAll publishes every shard's parameters after step from the flat vector p, in dt.
func (f *fakeJob) publishAll(step int64, dt wire.Dtype, p []float32) {
	f.t.Helper()
	for i, s := range f.rec.Layout.Shards {
		f.publishParams(i, step, dt, p[s.Off:s.Off+s.Len], nil)
	}
}

// startAtStepZero publishes the job's initial parameters as its step 0 (f32, as fanin does) and
// returns them, with a client and its worker of rank 0 (opts), both closed when the test ends.
func (f *fakeJob) startAtStepZero(ctx context.Context, opts ...sdk.WorkerOption) ([]float32, *sdk.Client, *sdk.Worker) {
	f.t.Helper()
	p := make([]float32, f.rec.Layout.Elements)
	f.rec.Spec.InitShard(0, p)
	f.publishAll(0, wire.F32, p)
	c, err := sdk.Connect(ctx, f.url)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(c.Close)
	w, err := c.Worker(ctx, f.rec.Spec.ID, 0, opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { w.Close() })
	return p, c, w
}

// waitGrads waits until the gradient stream holds step's gradient of every shard (of any rank).
func (f *fakeJob) waitGrads(ctx context.Context, step int64) {
	f.t.Helper()
	stream, err := f.js.Stream(ctx, wire.GradStream(f.rec.Spec.ID))
	if err != nil {
		f.t.Fatal(err)
	}
	for _, s := range f.rec.Layout.Shards {
		testutil.CheckFor(f.t, 20*time.Second, 2*time.Millisecond, func() error {
			m, err := stream.GetLastMsgForSubject(ctx, wire.GradSubject(f.rec.Spec.ID, s.ID))
			if err != nil {
				return err
			}
			if got, _ := wire.ParseStep(m.Header); got < step {
				return fmt.Errorf("shard %d: gradient of step %d, want %d", s.ID, got, step)
			}
			return nil
		})
	}
}
