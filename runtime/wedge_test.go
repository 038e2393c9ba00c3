package runtime_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// TestRefusedGradientsDoNotWedgeTheJob: a job's gradient stream holds at most ranks x shards x
// GradWindow messages. Five times that many refused gradients (NaN, a wrong dtype, a stale step, a
// rank's second gradient for a step, a future step) arrive while a step is open; then the job
// trains on, its parameters equal to the reference's byte for byte, one update per step and shard.
// Before the fix the refused messages stayed until a purge that never came (the open step could
// not complete): the stream refused the valid gradient that would complete it, for good.
func TestRefusedGradientsDoNotWedgeTheJob(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, err := st.Gateway.CreateJob(ctx, job.Spec{
		ID:        "wedge",
		Tensors:   []job.Tensor{{Name: "w", Shape: []int{1024}}},
		Ranks:     2,
		Function:  job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}},
		Init:      job.Init{Kind: "normal", Seed: 7, Scale: 0.1},
		ShardSize: 4 << 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, js := testutil.Connect(t, st.URL)
	ps, _ := js.Stream(ctx, wire.ParamsStream(rec.Spec.ID))
	gs, _ := js.Stream(ctx, wire.GradStream(rec.Spec.ID))
	bound := int64(rec.Spec.Ranks*rec.Layout.NumShards()) * store.GradWindow(&rec.Spec)
	if got := gs.CachedInfo().Config.MaxMsgs; got != bound {
		t.Fatalf("the gradient stream holds %d messages, want %d", got, bound)
	}

	shard := rec.Layout.Shards[0]
	msg := func(step int64, rank int, id string, data []byte) *nats.Msg {
		m := nats.NewMsg(wire.GradSubject(rec.Spec.ID, shard.ID))
		m.Header.Set(wire.HdrStep, strconv.FormatInt(step, 10))
		m.Header.Set(wire.HdrRank, strconv.Itoa(rank))
		m.Header.Set(wire.HdrDtype, wire.DtypeF32)
		m.Header.Set(wire.HdrMsgID, id)
		m.Data = data
		return m
	}
	// publish stores m, retrying while the stream is full (the runtime deletes what it refused);
	// a stream that stays full for 10 s is the wedge.
	publish := func(m *nats.Msg) {
		t.Helper()
		testutil.CheckFor(t, 10*time.Second, 2*time.Millisecond, func() error {
			_, err := js.PublishMsg(ctx, m)
			if err != nil && !strings.Contains(err.Error(), "maximum messages exceeded") {
				t.Fatalf("publish %s: %v", m.Header.Get(wire.HdrMsgID), err)
			}
			return err
		})
	}

	params := testutil.ParamsAt(t, ps, rec, 0)
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, rec.Spec.Ranks, rec.Layout.Ranges(), params)
	grads := [][]float32{make([]float32, rec.Layout.Elements), make([]float32, rec.Layout.Elements)}
	step := func(t int64, ranks ...int) {
		for _, r := range ranks {
			testutil.Gradient(grads[r], params, t, r)
			publish(msg(t, r, wire.GradMsgID(rec.Spec.ID, shard.ID, t, r), f32bytes(grads[r])))
		}
	}
	step(1, 0, 1)
	ref.Step(grads, nil)
	params = testutil.ParamsAt(t, ps, rec, 1)

	// Step 2 is open: rank 0 has sent it. Then the refusals, five times the stream's bound.
	step(2, 0)
	withNaN := f32bytes(grads[0])
	binary.LittleEndian.PutUint32(withNaN[8:], math.Float32bits(float32(math.NaN())))
	other := make([]byte, shard.Bytes())
	for i := range other {
		other[i] = byte(i)
	}
	refused := 5 * int(bound)
	for i := range refused {
		id := "bad-" + strconv.Itoa(i)
		var m *nats.Msg
		switch i % 5 {
		case 0:
			m = msg(2, 1, id, withNaN)
		case 1:
			m = msg(2, 1, id, other)
			m.Header.Set(wire.HdrDtype, "f64")
		case 2:
			m = msg(1, 1, id, other)
		case 3:
			m = msg(2, 0, id, other) // rank 0 sent step 2 already
		case 4:
			m = msg(3, 1, id, other)
		}
		publish(m)
	}
	step(2, 1)
	ref.Step(grads, nil)
	params = testutil.ParamsAt(t, ps, rec, 2)
	for s := int64(3); s <= 5; s++ {
		step(s, 0, 1)
		ref.Step(grads, nil)
		params = testutil.ParamsAt(t, ps, rec, s)
	}
	if !bytes.Equal(f32bytes(params), f32bytes(ref.Params())) {
		t.Fatal("after the refusals, the parameters differ from the reference")
	}
	if n := invocations(st); n != 5 {
		t.Fatalf("%d updates applied, want 5", n)
	}
	testutil.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		var n int64
		for _, rt := range st.AllRuntimes() {
			for _, c := range rt.Stats().Rejects {
				n += c
			}
		}
		if n != int64(refused) {
			return fmt.Errorf("%d refusals counted, want %d", n, refused)
		}
		return nil
	})
}

// TestUploadToUnknownShardIsRefused: the upload stream of an init "upload" job holds one message
// per shard. An upload to a shard the layout does not have is refused at publish (no stream binds
// its subject: "no responders"), so it takes no place, and the real shards' upload then works.
// Before the fix the stream bound every subject: the stray upload was stored, the stream was full
// with one shard still to upload, and that shard's upload was refused for good.
func TestUploadToUnknownShardIsRefused(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, err := st.Gateway.CreateJob(ctx, job.Spec{
		ID:        "stray",
		Tensors:   []job.Tensor{{Name: "w", Shape: []int{2048}}},
		Ranks:     1,
		Function:  job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}},
		Init:      job.Init{Kind: "upload"},
		ShardSize: 4 << 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	n := rec.Layout.NumShards()
	if n != 2 {
		t.Fatalf("%d shards, want 2", n)
	}
	nc, js := testutil.Connect(t, st.URL)
	for _, shard := range []int{n, 99} {
		_, err := js.PublishMsg(ctx, wire.InitMsg(rec.Spec.ID, shard, make([]byte, rec.Layout.Shards[0].Bytes())))
		if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("an upload to shard %d of a job of %d shards: %v, want no responders (no stream binds it)", shard, n, err)
		}
	}
	c, err := sdk.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	upload := make([]float32, rec.Layout.Elements)
	testutil.Gradient(upload, upload, 3, 0)
	if err := c.UploadParams(ctx, rec.Spec.ID, upload); err != nil {
		t.Fatalf("the real shards' upload after the stray ones: %v", err)
	}
	ps, _ := js.Stream(ctx, wire.ParamsStream(rec.Spec.ID))
	if got := testutil.ParamsAt(t, ps, rec, 0); !bytes.Equal(f32bytes(got), f32bytes(upload)) {
		t.Fatal("the step-0 parameters are not the upload")
	}
}
