package runtime

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// TestPurgeOnlyBehindSnapshots: gradients are purged only up to a stored snapshot. With f32
// parameters and a stateless function (sgd) the parameters message is the snapshot: once it is
// stored, the gradients it covers may go. With param_dtype bf16 it is a rounded copy, not a
// snapshot: storing it must purge nothing (a restore could not get the f32 parameters back from
// it), and only the checkpoint that follows it, once stored, purges what it covers; a checkpoint
// that failed purges nothing. The test runs a shard executor on a real JetStream and plays the
// acknowledgements one by one, in order, checking after each what the purger was asked to do
// against the snapshots acknowledged so far.
func TestPurgeOnlyBehindSnapshots(t *testing.T) {
	t.Parallel()
	h := newShardHarness(t)
	ctx, js := h.ctx, h.js
	for _, c := range []struct{ fn, dtype string }{{"sgd", "f32"}, {"sgd", "bf16"}, {"adam", "bf16"}} {
		t.Run(c.fn+"-"+c.dtype, func(t *testing.T) {
			spec := job.Spec{ID: "purge-" + c.fn + "-" + c.dtype, Tensors: []job.Tensor{{Name: "w", Shape: []int{1000}}}, Ranks: 2,
				Function: job.Function{Name: c.fn, Hyper: map[string]float64{"lr": 0.1}}, ParamDtype: c.dtype}
			rec, grads, params := h.job(t, spec)
			r := h.runtime(t) // its acker and purger do not run: the test plays them
			x := h.shard(t, r, &rec, grads, params)
			snapIsParams := c.fn == "sgd" && c.dtype == "f32"
			if x.paramsSnap != snapIsParams {
				t.Fatalf("paramsSnap %v, want %v", x.paramsSnap, snapIsParams)
			}
			// covered: the gradients below it are in a snapshot whose storage JetStream
			// acknowledged (the runtime knows of no other).
			var covered uint64
			ckptSj := wire.CkptSubject(spec.ID, 0)
			for step := int64(1); step <= 5; step++ {
				for rank := range 2 {
					m := nats.NewMsg(wire.GradSubject(spec.ID, 0))
					m.Header.Set(wire.HdrStep, strconv.FormatInt(step, 10))
					m.Header.Set(wire.HdrRank, strconv.Itoa(rank))
					m.Header.Set(wire.HdrDtype, wire.DtypeF32)
					m.Data = make([]byte, 4000)
					ack, err := js.PublishMsg(ctx, m)
					if err != nil {
						t.Fatal(err)
					}
					x.mu.Lock()
					x.handleSeq(&fakeMsg{data: m.Data, hdr: m.Header}, ack.Sequence)
					x.mu.Unlock()
				}
				// The step's publishes, acknowledged in order: its parameters, then (bf16, adam)
				// its checkpoint, which at step 3 fails (JetStream did not store it).
				for len(r.acks.queue) > 0 {
					it := <-r.acks.queue
					var ok bool
					if step == 3 && it.msg.Subject == ckptSj {
						ok = false
					} else {
						ok = r.acks.wait(ctx, it)
					}
					if snap := it.msg.Subject == ckptSj || (snapIsParams && it.msg.Subject == wire.ParamsSubject(spec.ID, 0)); snap && ok {
						seq, _ := wire.ParseSeq(it.msg.Header)
						covered = seq + 1
					}
					it.done(ok)
					r.purger.mu.Lock()
					upTo, asked := r.purger.pending[purgeKey{x.ji.streams[0], x.gradSj}]
					r.purger.mu.Unlock()
					if asked && upTo > covered {
						t.Fatalf("step %d, after %s was acknowledged (%v): purge asked below sequence %d, the stored snapshots cover below %d", step, it.msg.Subject, ok, upTo, covered)
					}
				}
				first := store.FirstSeq(&rec)  // the stream's first sequence
				want := first + 2*uint64(step) // the step's own snapshot covers its two gradients
				if step == 3 && !snapIsParams {
					want = first + 2*2 // step 2's checkpoint
				}
				r.purger.mu.Lock()
				upTo := r.purger.pending[purgeKey{x.ji.streams[0], x.gradSj}]
				r.purger.mu.Unlock()
				if covered != want || upTo != want {
					t.Fatalf("step %d: purge asked below %d, snapshots cover below %d, want %d", step, upTo, covered, want)
				}
			}
			x.finish()
		})
	}
}

// TestRestoreFromAnOlderRuntimesParameters: in a rolling upgrade, a runtime of before param_dtype
// serves a bf16 job's shard as an f32 one: it publishes f32 parameters, purges the gradients
// behind them and writes no checkpoint. The runtime that takes the shard over must restore from
// those parameters (exact: f32, of a stateless function) and write the checkpoint its own
// snapshots rest on; it refused before ("parameters at step 3 but no checkpoint"). A bf16
// parameters message is never taken as a snapshot, and a stateful function still needs its
// checkpoint.
func TestRestoreFromAnOlderRuntimesParameters(t *testing.T) {
	t.Parallel()
	h := newShardHarness(t)
	ctx, js := h.ctx, h.js
	for _, c := range []struct {
		fn, dtype string // the function, and the dtype of the parameters message at step 3
		ok        bool
	}{{"sgd", "f32", true}, {"sgd", "bf16", false}, {"adam", "f32", false}} {
		t.Run(c.fn+"-"+c.dtype, func(t *testing.T) {
			spec := job.Spec{ID: "upgrade-" + c.fn + "-" + c.dtype, Tensors: []job.Tensor{{Name: "w", Shape: []int{1000}}}, Ranks: 2,
				Function: job.Function{Name: c.fn, Hyper: map[string]float64{"lr": 0.1}}, ParamDtype: "bf16"}
			rec, grads, params := h.job(t, spec)
			want := make([]float32, 1000)
			for i := range want {
				want[i] = float32(i)*0.001 + 1.0/3 // not representable in bf16
			}
			dt, _ := wire.ParseDtype(c.dtype)
			data := make([]byte, len(want)*dt.ElemSize())
			wire.Encode(data, want, dt)
			m := wire.ParamsMsg(spec.ID, "", 0, 3, 0, data)
			wire.SetParamsHeaders(m.Header, spec.ID, "", 0, 3, 0, dt)
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
			x := h.shard(t, h.runtime(t), &rec, grads, params)
			err := x.restore(ctx)
			if !c.ok {
				if err == nil || !strings.Contains(err.Error(), "no checkpoint") {
					t.Fatalf("restore: %v, want the refusal naming the missing checkpoint", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("restore: %v", err)
			}
			if x.step != 3 || !slices.Equal(x.params, want) {
				t.Fatalf("restored step %d, parameters equal: %v; want step 3 and the f32 parameters", x.step, slices.Equal(x.params, want))
			}
			ck, err := params.GetLastMsgForSubject(ctx, wire.CkptSubject(spec.ID, 0))
			if err != nil {
				t.Fatalf("no checkpoint after the restore: %v", err)
			}
			if s, _ := wire.ParseStep(ck.Header); s != 3 || string(ck.Data) != string(data) {
				t.Fatalf("checkpoint at step %d (%d bytes), want step 3 holding the f32 parameters", s, len(ck.Data))
			}
		})
	}
}
