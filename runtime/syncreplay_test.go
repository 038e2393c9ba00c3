package runtime_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// syncReplay drives one job's single shard message by message on two runtimes (placement written
// by the test) and moves the shard from one to the other: the new owner restores the snapshot and
// replays the gradient stream from where the snapshot says.
type syncReplay struct {
	t     *testing.T
	st    *devstack.Stack
	ctx   context.Context
	js    jetstream.JetStream
	nc    *nats.Conn
	pl    placer
	rec   *job.Record
	inbox *nats.Subscription
	n     int
}

func newSyncReplay(t *testing.T, id, mode string, s int, fn string) *syncReplay {
	spec := job.Spec{ID: id, Ranks: 2, Tensors: []job.Tensor{{Name: "w", Shape: []int{1000}}},
		Function: job.Function{Name: fn, Hyper: map[string]float64{"lr": 0.05}}, Sync: mode, Staleness: s}
	st, pl, rec, _ := movableJob(t, spec)
	ctx := context.Background()
	nc, err := nats.Connect(st.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	sub, err := nc.SubscribeSync(wire.InboxPrefix(id) + ".r")
	if err != nil {
		t.Fatal(err)
	}
	x := &syncReplay{t: t, st: st, ctx: ctx, js: js, nc: nc, pl: pl, rec: rec, inbox: sub}
	x.move("rt-0")
	return x
}

// move places the shard on rt and waits until the other runtime has let it go.
func (x *syncReplay) move(rt string) {
	x.t.Helper()
	key := wire.PlacementKey(x.rec.Spec.ID, 0)
	x.pl.place(x.t, key, rt)
	testutil.CheckFor(x.t, 20*time.Second, 5*time.Millisecond, func() error {
		for _, r := range x.st.AllRuntimes() {
			if r.ID() != rt && slices.Contains(r.Shards(), key) {
				return fmt.Errorf("%s still serves %s", r.ID(), key)
			}
		}
		return nil
	})
}

// grad is the deterministic payload of (step, rank); variant 1 is a different one.
func (x *syncReplay) grad(step int64, rank, variant int) []float32 {
	g := make([]float32, x.rec.Layout.Elements)
	zero := make([]float32, len(g))
	testutil.Gradient(g, zero, step+1000*int64(variant), rank)
	return g
}

func (x *syncReplay) send(step int64, rank int, version int64, g []float32) {
	x.t.Helper()
	x.n++
	m := nats.NewMsg(wire.GradSubject(x.rec.Spec.ID, 0))
	m.Header.Set(wire.HdrStep, strconv.FormatInt(step, 10))
	m.Header.Set(wire.HdrRank, strconv.Itoa(rank))
	m.Header.Set(wire.HdrDtype, wire.DtypeF32)
	m.Header.Set(wire.HdrVersion, strconv.FormatInt(version, 10))
	m.Header.Set(wire.HdrReplyTo, x.inbox.Subject)
	m.Header.Set(wire.HdrMsgID, "m"+strconv.Itoa(x.n))
	m.Data = f32bytes(g)
	if _, err := x.js.PublishMsg(x.ctx, m); err != nil {
		x.t.Fatal(err)
	}
}

func (x *syncReplay) expect(reason wire.Reason) *wire.Reject {
	x.t.Helper()
	m, err := x.inbox.NextMsg(10 * time.Second)
	if err != nil {
		x.t.Fatalf("no report (want %s): %v", reason, err)
	}
	rej, err := wire.UnmarshalReject(m.Data)
	if err != nil {
		x.t.Fatal(err)
	}
	if rej.Reason != reason {
		x.t.Fatalf("report %s %q, want %s", rej.Reason, rej.Detail, reason)
	}
	return rej
}

// expectFor waits for the report of reason on the message with id msgID (send numbers them m1, m2...).
func (x *syncReplay) expectFor(reason wire.Reason, msgID string) {
	x.t.Helper()
	if rej := x.expect(reason); rej.MsgID != msgID {
		x.t.Fatalf("report %s on %s %q, want one on %s", rej.Reason, rej.MsgID, rej.Detail, msgID)
	}
}

func (x *syncReplay) quiet() {
	x.t.Helper()
	if m, err := x.inbox.NextMsg(300 * time.Millisecond); err == nil {
		x.t.Fatalf("unexpected report %s", m.Data)
	}
}

// params waits for the shard's parameters at step and returns them with their headers.
func (x *syncReplay) params(step int64) ([]float32, nats.Header) {
	x.t.Helper()
	var h nats.Header
	p := testutil.ParamsAt(x.t, getterFunc(func(ctx context.Context, subj string) (*jetstream.RawStreamMsg, error) {
		s, err := x.js.Stream(ctx, wire.ParamsStream(x.rec.Spec.ID))
		if err != nil {
			return nil, err
		}
		m, err := s.GetLastMsgForSubject(ctx, subj)
		if err == nil {
			h = m.Header
		}
		return m, err
	}), x.rec, step)
	return p, h
}

type getterFunc func(ctx context.Context, subj string) (*jetstream.RawStreamMsg, error)

func (f getterFunc) GetLastMsgForSubject(ctx context.Context, subj string) (*jetstream.RawStreamMsg, error) {
	return f(ctx, subj)
}

func (x *syncReplay) reference() *functions.Reference { return testutil.Reference(x.t, x.rec) }

// TestSSPReplayAfterHandover moves an ssp shard (s = 2) while it holds a gradient of a future step
// and after it refused a gradient claiming a version that did not exist yet. The new owner replays
// from the held gradient (Fanin-Replay-From), before the snapshot's own sequence: it must hold the
// gradient again, refuse the early claim again (Fanin-Step-Seqs: version 1 was published after
// it) without reporting it a second time, and accept the same claim sent once version 1 exists.
// Stateless (sgd: the parameters are the snapshot) and stateful (adam: the checkpoint is).
func TestSSPReplayAfterHandover(t *testing.T) {
	t.Parallel()
	for _, fn := range []string{"sgd", "adam"} {
		t.Run(fn, func(t *testing.T) {
			t.Parallel() // a stack each
			x := newSyncReplay(t, "ssp-replay-"+fn, "ssp", 2, fn)
			ref := x.reference()
			g := func(step int64, rank int) []float32 { return x.grad(step, rank, 0) }

			x.send(2, 0, 0, g(2, 0))         // held: step 1 is open
			x.send(3, 1, 1, x.grad(3, 1, 1)) // version 1 does not exist yet
			x.expect(wire.ReasonFutureStep)  // ("had not published")
			x.send(1, 0, 0, g(1, 0))         //
			x.send(1, 1, 0, g(1, 1))         // completes step 1; step 2 still lacks rank 1
			ref.Step([][]float32{g(1, 0), g(1, 1)}, nil)
			p, h := x.params(1)
			if !bytes.Equal(f32bytes(p), f32bytes(ref.Params())) {
				t.Fatal("step 1 differs from the reference")
			}
			{ // replay starts at the held gradient (the stream's first); step 1 was completed by the fourth
				first := store.FirstSeq(x.rec)
				from, seqs := strconv.FormatUint(first, 10), "1:"+strconv.FormatUint(first+3, 10)
				if h.Get(wire.HdrReplayFrom) != from || h.Get(wire.HdrStepSeqs) != seqs {
					t.Fatalf("snapshot headers %s=%q %s=%q, want %s and %s", wire.HdrReplayFrom, h.Get(wire.HdrReplayFrom), wire.HdrStepSeqs, h.Get(wire.HdrStepSeqs), from, seqs)
				}
			}

			x.move("rt-1")
			x.send(2, 1, 1, g(2, 1)) // completes step 2 with the held rank 0
			x.send(3, 1, 1, g(3, 1)) // the same claim, now that version 1 exists: accepted
			x.send(3, 0, 2, g(3, 0)) // completes step 3
			ref.Step([][]float32{g(2, 0), g(2, 1)}, nil)
			ref.Step([][]float32{g(3, 0), g(3, 1)}, nil)
			p, _ = x.params(3)
			x.quiet() // nothing reported again, nothing refused
			if !bytes.Equal(f32bytes(p), f32bytes(ref.Params())) {
				t.Fatal("after the handover, step 3 differs from the reference")
			}

			// And back, holding steps 4 and 5 while step 4 lacks a rank.
			x.send(5, 0, 3, g(5, 0))
			x.send(4, 0, 3, g(4, 0))
			x.send(5, 1, 3, g(5, 1))
			x.move("rt-0")
			x.send(5, 1, 3, x.grad(5, 1, 1)) // a second gradient of (5, 1): refused once, by the new owner
			x.expect(wire.ReasonDuplicate)
			x.send(4, 1, 3, g(4, 1)) // completes steps 4 and 5
			ref.Step([][]float32{g(4, 0), g(4, 1)}, nil)
			ref.Step([][]float32{g(5, 0), g(5, 1)}, nil)
			p, _ = x.params(5)
			x.quiet()
			if !bytes.Equal(f32bytes(p), f32bytes(ref.Params())) {
				t.Fatal("after the second handover, step 5 differs from the reference")
			}
		})
	}
}

// TestASPReplayAfterHandover moves an asp shard between gradients: the new owner must go on from
// the same version with the same per-rank steps (Fanin-Rank-Steps), so a rank's old step is still
// refused and the parameters equal the reference applying the gradients in stream order.
//
// A refusal is reported once, by whichever owner decided first. The old owner refuses m4 after
// its last snapshot (seq 3); the new owner replays m4 from there, refuses it again, and must not
// report it again (Handover.Decided). The same happens, depending on timing, to a message sent just
// after the move: the old owner may still be consuming when the test sees it gone from Shards().
func TestASPReplayAfterHandover(t *testing.T) {
	t.Parallel()
	for _, fn := range []string{"sgd", "adam"} {
		t.Run(fn, func(t *testing.T) {
			t.Parallel() // a stack each
			x := newSyncReplay(t, "asp-replay-"+fn, "asp", 0, fn)
			ref := x.reference()
			var order []string
			apply := func(step int64, rank int, version int64) {
				x.send(step, rank, version, x.grad(step, rank, 0))
				ref.ApplyRank(0, x.grad(step, rank, 0), 1)
				order = append(order, fmt.Sprint(rank, ".", step))
			}
			apply(1, 0, 0)
			apply(1, 1, 0)
			apply(2, 0, 1)
			x.params(3)
			x.send(1, 1, 3, x.grad(1, 1, 1)) // m4: rank 1's step 1 was applied; refused by rt-0
			x.expectFor(wire.ReasonStaleStep, "m4")
			x.move("rt-1")
			x.send(2, 0, 3, x.grad(2, 0, 1)) // m5: rank 0's step 2 was applied before the move
			x.expectFor(wire.ReasonStaleStep, "m5")
			apply(3, 1, 3) // rank 1 skips step 2: asp only needs its steps to grow
			apply(3, 0, 2)
			p, h := x.params(5)
			if got := h.Get(wire.HdrApplied); got != order[len(order)-1] {
				t.Fatalf("%s = %q, want %q", wire.HdrApplied, got, order[len(order)-1])
			}
			if got := h.Get(wire.HdrRankSteps); got != "3,3" {
				t.Fatalf("%s = %q, want 3,3", wire.HdrRankSteps, got)
			}
			x.quiet()
			if !bytes.Equal(f32bytes(p), f32bytes(ref.Params())) {
				t.Fatalf("asp parameters differ from the reference applying %v", order)
			}
		})
	}
}

// TestSSPHoldsTheWholeStalenessWindow lets one rank of an ssp job (s = 16, the largest bound) run
// the full bound ahead of a rank that has not published yet: the gradient stream must store all
// of it (it is sized for s+1 held steps beyond its usual window; were it not, the fast rank's held
// gradients would fill it and the slow rank could never publish the step that unblocks them),
// and the runtime must hold and then apply every step in order.
func TestSSPHoldsTheWholeStalenessWindow(t *testing.T) {
	t.Parallel()
	x := newSyncReplay(t, "ssp-window", "ssp", job.MaxStaleness, "sgd")
	ref := x.reference()
	g := func(step int64, rank int) []float32 { return x.grad(step, rank, 0) }
	last := int64(job.MaxStaleness + 1)
	for s := int64(1); s <= last; s++ { // rank 0 from the initial parameters: t-1-0 <= 16
		x.send(s, 0, 0, g(s, 0))
	}
	for s := int64(1); s <= last; s++ { // rank 1 from the newest: each completes a step
		x.send(s, 1, s-1, g(s, 1))
		ref.Step([][]float32{g(s, 0), g(s, 1)}, nil)
	}
	p, _ := x.params(last)
	x.quiet()
	if !bytes.Equal(f32bytes(p), f32bytes(ref.Params())) {
		t.Fatal("the parameters differ from the reference")
	}
}
