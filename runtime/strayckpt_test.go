package runtime

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// TestRestoreSkipsEarlierIncarnationsSnapshot: the executor of a deleted job may still be stopping
// when the job is created again under its id, and a checkpoint it sends then (delayed on a loaded
// node, or sent again by the client library after the old stream answered nothing) lands in the
// new incarnation's parameter stream as the newest message of its subject. A restore must not
// take it for the shard's snapshot: a momentum checkpoint restored into a sum job failed every
// restore ("snapshot at step 15 has 8192 bytes, want 4096"), and the shard was never served
// (TestRecreatedJobIsServedAsItself stalled at step 1 with no consumer on the gradient stream).
// The stray here is an older runtime's, whose message ids name no incarnation: its gradient
// sequence, below the new stream's first, gives it away. The stray message is put in place by
// hand, so the interleaving is exact.
func TestRestoreSkipsEarlierIncarnationsSnapshot(t *testing.T) {
	t.Parallel()
	h := newShardHarness(t)
	ctx := h.ctx
	for _, c := range []struct {
		name string
		fn   job.Function
		own  int64 // the step of the new incarnation's own checkpoint before the stray one; 0: none
	}{
		{"sum", job.Function{Name: "sum"}, 0},
		{"momentum", job.Function{Name: "momentum", Hyper: map[string]float64{"lr": 0.1, "momentum": 0.9}}, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec, grads, params := strayJob(t, h, "stray-"+c.name, c.fn)
			id, first := rec.Spec.ID, store.FirstSeq(&rec)
			if c.own > 0 { // its own checkpoint, covering gradients of its own stream
				m := strayCkpt(&rec, wire.Incarnation(rec.Created), c.own, first+uint64(c.own)-1)
				if _, err := h.js.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			// The earlier incarnation's last checkpoint (momentum: parameters and one state
			// vector), of a gradient sequence of its own stream, below this one's first.
			x := restoreBeside(t, h, &rec, grads, params, strayCkpt(&rec, "", 15, first-1000))
			if x.step != c.own {
				t.Fatalf("restored step %d, want %d (its own snapshot)", x.step, c.own)
			}

			// This incarnation reaches the stray's step within JetStream's duplicate window: its
			// checkpoint of that step is stored, not dropped as a duplicate of the stray's (one
			// so dropped is acknowledged all the same, and the gradients it covers are purged).
			// A sum shard's snapshot is its parameters message: it writes no checkpoint.
			if x.paramsSnap {
				return
			}
			x.mu.Lock()
			x.step, x.stepSeq = 15, first+14
			x.mu.Unlock()
			if err := x.checkpointSync(ctx, false); err != nil {
				t.Fatal(err)
			}
			last, err := params.GetLastMsgForSubject(ctx, wire.CkptSubject(id, 0))
			if err != nil {
				t.Fatalf("no checkpoint of step 15 stored: %v", err)
			}
			step, _ := wire.ParseStep(last.Header)
			seq, _ := wire.ParseSeq(last.Header)
			if step != 15 || seq != first+14 {
				t.Fatalf("the last checkpoint is of step %d, gradient sequence %d; want this incarnation's of step 15, sequence %d", step, seq, first+14)
			}
		})
	}
}

// A stray that its gradient sequence cannot give away (step 0, or a snapshot naming no sequence)
// is told by its message id, which names the incarnation that sent it: the restore deletes it and
// restores the shard's own snapshot, not the earlier job's parameters.
func TestRestoreSkipsAStrayNamingAnotherIncarnation(t *testing.T) {
	t.Parallel()
	h := newShardHarness(t)
	for _, c := range []struct {
		name string
		fn   job.Function
		ckpt bool // the stray is a checkpoint (the shard checkpoints), else parameters
	}{
		{"sum-step0", job.Function{Name: "sum"}, false},
		{"momentum-noseq", job.Function{Name: "momentum", Hyper: map[string]float64{"lr": 0.1, "momentum": 0.9}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec, grads, params := strayJob(t, h, "inc-"+c.name, c.fn)
			earlier := wire.Incarnation(rec.Created.Add(-time.Minute))
			// Step 15 of the earlier run, naming no gradient sequence; or its step 0: other
			// values, same subject.
			stray := strayCkpt(&rec, earlier, 15, 0)
			if !c.ckpt {
				data := make([]byte, rec.Layout.Shards[0].Bytes())
				for i := range data {
					data[i] = 7
				}
				stray = wire.ParamsMsg(rec.Spec.ID, earlier, 0, 0, 0, data)
			}
			x := restoreBeside(t, h, &rec, grads, params, stray)
			want := make([]float32, rec.Layout.Shards[0].Len)
			rec.Spec.InitShard(rec.Layout.Shards[0].Off, want)
			if x.step != 0 || !slices.Equal(x.params, want) {
				t.Fatalf("restored step %d, parameters %v...; want step 0 and the job's own %v...", x.step, x.params[:2], want[:2])
			}
		})
	}
}

// strayJob creates a one-shard job of fn and publishes its step 0.
func strayJob(t *testing.T, h *shardHarness, id string, fn job.Function) (rec job.Record, grads, params jetstream.Stream) {
	t.Helper()
	rec, grads, params = h.job(t, job.Spec{ID: id, Tensors: []job.Tensor{{Name: "w", Shape: []int{1024}}}, Ranks: 1,
		Function: fn, Init: job.Init{Kind: "normal", Seed: 1, Scale: 0.1}})
	if err := store.PublishInitial(h.ctx, h.js, &rec); err != nil {
		t.Fatal(err)
	}
	return rec, grads, params
}

// strayCkpt is a checkpoint of shard 0 (parameters and one state vector) after step, covering
// gradient sequence seq, with the message id of incarnation inc.
func strayCkpt(rec *job.Record, inc string, step int64, seq uint64) *nats.Msg {
	m := wire.ParamsMsg(rec.Spec.ID, "", 0, 0, 0, make([]byte, 2*rec.Layout.Shards[0].Bytes()))
	m.Subject = wire.CkptSubject(rec.Spec.ID, 0)
	wire.SetCheckpointHeaders(m.Header, rec.Spec.ID, inc, 0, step, seq)
	return m
}

// restoreBeside publishes stray, restores an executor of the job's shard 0, and checks that the
// restore deleted the stray from the parameter stream.
func restoreBeside(t *testing.T, h *shardHarness, rec *job.Record, grads, params jetstream.Stream, stray *nats.Msg) *shardExec {
	t.Helper()
	ack, err := h.js.PublishMsg(h.ctx, stray)
	if err != nil {
		t.Fatal(err)
	}
	x := h.shard(t, h.runtime(t), rec, grads, params)
	if err := x.restore(h.ctx); err != nil {
		t.Fatalf("restore with a stray of an earlier incarnation in the stream: %v", err)
	}
	if _, err := params.GetMsg(h.ctx, ack.Sequence); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the earlier incarnation's message is still in the parameter stream (get: %v)", err)
	}
	return x
}

// A direct-gradients shard that checkpoints writes to its node's checkpoint stream (ckpthome.go),
// where a late checkpoint of an earlier incarnation can land too: lastCkpt deletes it there and
// does not return it, and returns the shard's own checkpoint that it landed after.
func TestNodeCheckpointOfAnEarlierIncarnationIsDeleted(t *testing.T) {
	t.Parallel()
	h := newShardHarness(t)
	ctx := h.ctx
	spec := job.Spec{ID: "inc-node", Tensors: []job.Tensor{{Name: "w", Shape: []int{1024}}}, Ranks: 1, Gradients: job.GradientsDirect,
		Function: job.Function{Name: "momentum", Hyper: map[string]float64{"lr": 0.1, "momentum": 0.9}},
		Init:     job.Init{Kind: "normal", Seed: 1, Scale: 0.1}}
	spec.Normalize()
	rec := job.NewRecord(spec, time.Now())
	if err := store.CreateJobStreams(ctx, h.js, &rec, 8<<20, nil); err != nil {
		t.Fatal(err)
	}
	params, err := h.js.Stream(ctx, wire.ParamsStream(spec.ID))
	if err != nil {
		t.Fatal(err)
	}
	x := h.shard(t, h.runtime(t), &rec, nil, params)
	// The node stream of this incarnation, as ckptHome makes it.
	cfg := nodeCkptConfig(x.ji, "n0")
	cfg.Placement = nil // the test's server has no node tag
	node, err := h.js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(inc string, step int64) uint64 {
		t.Helper()
		m := strayCkpt(&rec, inc, step, 0)
		m.Subject = wire.NodeCkptSubject(spec.ID, wire.NodeToken("n0"), 0)
		ack, err := h.js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	earlier := wire.Incarnation(rec.Created.Add(-time.Minute))
	check := func(stray uint64, want int64) {
		t.Helper()
		ck, err := x.lastCkpt(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := int64(-1)
		if ck != nil {
			got = snapStep(ck)
		}
		if got != want {
			t.Fatalf("lastCkpt beside an earlier incarnation's checkpoint returned step %d, want %d (-1: none)", got, want)
		}
		if _, err := node.GetMsg(ctx, stray); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("the earlier incarnation's checkpoint is still in the node stream (get: %v)", err)
		}
	}
	check(publish(earlier, 15), -1) // alone: no checkpoint
	// Landed after the shard's own: that one is restored, not lost.
	publish(x.ji.inc, 14)
	check(publish(earlier, 16), 14)
}
