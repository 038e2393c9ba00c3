package runtime_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/internal/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// TestSixteenBitGradientsBitExact: ranks send their gradients as f32, bf16 and f16 (a different
// dtype per rank and step, in a shuffled order): the parameters equal, byte for byte at every
// step, the reference fed each rank's gradient rounded to its dtype (wire.Round), for an unweighted
// function (sgd: CopyLE16/AddLE16) and a weighted one (fedavg: ScaleLE16/AxpyLE16).
func TestSixteenBitGradientsBitExact(t *testing.T) {
	st := testutil.Stack(t, 2)
	ctx := context.Background()
	nc, err := nats.Connect(st.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	dtypes := []wire.Dtype{wire.F32, wire.BF16, wire.F16}
	for ci, fn := range []string{"sgd", "fedavg"} {
		t.Run(fn, func(t *testing.T) {
			hyper := map[string]float64{"lr": 0.1}
			if fn == "fedavg" {
				hyper = nil
			}
			rec, err := st.Gateway.CreateJob(ctx, testSpec("d16-"+fn, fn, hyper))
			if err != nil {
				t.Fatal(err)
			}
			ps, _ := js.Stream(ctx, wire.ParamsStream(rec.Spec.ID))
			params := testutil.ParamsAt(t, ps, rec, 0)
			f, _ := rec.Spec.NewFunc()
			ref := functions.NewReference(f, 4, rec.Layout.Ranges(), params)
			rng := rand.New(rand.NewPCG(uint64(ci), 16))
			grads, rounded := make([][]float32, 4), make([][]float32, 4)
			for r := range grads {
				grads[r], rounded[r] = make([]float32, rec.Layout.Elements), make([]float32, rec.Layout.Elements)
			}
			weights := []float64{3, 1, 2.5, 7}
			for step := int64(1); step <= 8; step++ {
				type out struct{ shard, rank int }
				var msgs []out
				dts := make([]wire.Dtype, 4)
				for r := range 4 {
					dts[r] = dtypes[(r+int(step))%3]
					testutil.Gradient(grads[r], params, step, r)
					wire.Round(rounded[r], grads[r], dts[r])
					for s := range rec.Layout.Shards {
						msgs = append(msgs, out{s, r})
					}
				}
				rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
				for _, o := range msgs {
					s := rec.Layout.Shards[o.shard]
					m := nats.NewMsg(wire.GradSubject(rec.Spec.ID, s.ID))
					m.Header.Set(wire.HdrStep, strconv.FormatInt(step, 10))
					m.Header.Set(wire.HdrRank, strconv.Itoa(o.rank))
					m.Header.Set(wire.HdrDtype, dts[o.rank].String())
					if fn == "fedavg" {
						m.Header.Set(wire.HdrWeight, strconv.FormatFloat(weights[o.rank], 'g', -1, 64))
					}
					m.Data = make([]byte, s.Len*dts[o.rank].ElemSize())
					wire.Encode(m.Data, grads[o.rank][s.Off:s.Off+s.Len], dts[o.rank])
					if _, err := js.PublishMsg(ctx, m); err != nil {
						t.Fatal(err)
					}
				}
				if fn == "fedavg" {
					ref.Step(rounded, weights)
				} else {
					ref.Step(rounded, nil)
				}
				params = testutil.ParamsAt(t, ps, rec, step)
				if !bytes.Equal(f32bytes(params), f32bytes(ref.Params())) {
					t.Fatalf("step %d (dtypes %v): parameters differ from the reference fed the rounded gradients", step, dts)
				}
			}
		})
	}
}
