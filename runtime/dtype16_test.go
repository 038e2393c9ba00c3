package runtime_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// TestSixteenBitGradientsBitExact: ranks send their gradients as f32, bf16 and f16 (a different
// dtype per rank and step, in a shuffled order): the parameters equal, byte for byte at every
// step, the reference fed each rank's gradient rounded to its dtype (wire.Round), for an unweighted
// function (sgd: CopyLE16/AddLE16) and a weighted one (fedavg: ScaleLE16/AxpyLE16).
func TestSixteenBitGradientsBitExact(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 2)
	ctx := context.Background()
	_, js := testutil.Connect(t, st.URL)
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

// TestSixteenBitSSPHeldAndASP: an ssp job holds a rank's f16 gradient of a future step and folds
// it when the step opens; an asp job applies bf16 and f16 gradients one by one. Both end byte for
// byte at the reference fed the rounded gradients.
func TestSixteenBitSSPHeldAndASP(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, js := testutil.Connect(t, st.URL)
	mk := func(id, mode string, s int) *job.Record {
		spec := job.Spec{ID: id, Ranks: 2, Tensors: []job.Tensor{{Name: "w", Shape: []int{1000}}},
			Function: job.Function{Name: "adam", Hyper: map[string]float64{"lr": 0.01}}, Sync: mode, Staleness: s,
			Init: job.Init{Kind: "uniform", Seed: 3, Scale: 0.5}}
		rec, err := st.Gateway.CreateJob(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	grad := func(seed uint64) []float32 {
		rng := rand.New(rand.NewPCG(seed, 7))
		g := make([]float32, 1000)
		for i := range g {
			g[i] = float32(rng.NormFloat64())
		}
		return g
	}
	rounded := func(g []float32, dt wire.Dtype) []float32 {
		r := make([]float32, len(g))
		wire.Round(r, g, dt)
		return r
	}
	send := func(rec *job.Record, step int64, rank int, version int64, g []float32, dt wire.Dtype) {
		t.Helper()
		m := wire.GradMsg(wire.Grad{Job: rec.Spec.ID, Shard: 0, Step: step, Rank: rank, Dtype: dt, Version: version, Versioned: true},
			make([]byte, len(g)*dt.ElemSize()))
		wire.Encode(m.Data, g, dt)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	check := func(rec *job.Record, step int64, ref *functions.Reference) {
		t.Helper()
		ps, _ := js.Stream(ctx, wire.ParamsStream(rec.Spec.ID))
		if got := testutil.ParamsAt(t, ps, rec, step); !bytes.Equal(f32bytes(got), f32bytes(ref.Params())) {
			t.Fatalf("%s at %d: parameters differ from the reference fed the rounded gradients", rec.Spec.ID, step)
		}
	}
	newRef := func(rec *job.Record) *functions.Reference { return testutil.Reference(t, rec) }

	ssp := mk("d16-ssp", "ssp", 2)
	ref := newRef(ssp)
	g01, g02, g11, g12 := grad(1), grad(2), grad(3), grad(4)
	send(ssp, 1, 0, 0, g01, wire.BF16)
	send(ssp, 2, 0, 0, g02, wire.F16) // held: step 1 is open
	send(ssp, 1, 1, 0, g11, wire.F32) // completes step 1, then step 2 gathers the held f16
	ref.Step([][]float32{rounded(g01, wire.BF16), g11}, nil)
	check(ssp, 1, ref)
	send(ssp, 2, 1, 1, g12, wire.BF16)
	ref.Step([][]float32{rounded(g02, wire.F16), rounded(g12, wire.BF16)}, nil)
	check(ssp, 2, ref)

	asp := mk("d16-asp", "asp", 0)
	ref = newRef(asp)
	send(asp, 1, 0, 0, g01, wire.F16)
	ref.ApplyRank(0, rounded(g01, wire.F16), 1)
	check(asp, 1, ref)
	send(asp, 1, 1, 1, g11, wire.BF16)
	ref.ApplyRank(0, rounded(g11, wire.BF16), 1)
	check(asp, 2, ref)
}
