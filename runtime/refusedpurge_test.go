package runtime

import (
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// TestRefusedGradientsAreDeletedAlone: the gradients a shard refuses are deleted from the stream,
// by their own sequences, and nothing else is: an accepted gradient held for a later step (ssp)
// and the gathered ones stay. A restore then replays the stream without the refused messages
// and reaches the same state bit for bit: same step, parameters and held gradients.
func TestRefusedGradientsAreDeletedAlone(t *testing.T) {
	t.Parallel()
	h := newShardHarness(t)
	ctx, js := h.ctx, h.js
	spec := job.Spec{ID: "refused", Tensors: []job.Tensor{{Name: "w", Shape: []int{1000}}}, Ranks: 2,
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, Sync: "ssp", Staleness: 2,
		Init: job.Init{Kind: "normal", Seed: 3, Scale: 0.1}}
	rec, grads, params := h.job(t, spec)
	if err := store.PublishInitial(ctx, js, &rec); err != nil {
		t.Fatal(err)
	}
	r := h.runtime(t) // its acker and purger do not run: the test plays the purger
	x := h.shard(t, r, &rec, grads, params)
	if err := x.restore(ctx); err != nil {
		t.Fatal(err)
	}
	grad := func(seed int) []byte {
		b := make([]byte, 4000)
		for i := 0; i < len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(seed*1000+i)*1e-6))
		}
		return b
	}
	nan := grad(9)
	binary.LittleEndian.PutUint32(nan[40:], math.Float32bits(float32(math.NaN())))
	sent := []struct {
		step  int64
		rank  int
		data  []byte
		taken bool
	}{
		{1, 0, grad(1), true},
		{2, 0, grad(2), true},  // held: step 2 is beyond the next
		{1, 0, grad(3), false}, // duplicate
		{1, 1, nan, false},     // non-finite
		{2, 0, grad(4), false}, // duplicate of the held one
		{9, 1, grad(5), false}, // beyond the staleness bound
		{1, 1, grad(6), true},  // completes step 1
	}
	var kept []uint64
	for i, s := range sent {
		m := nats.NewMsg(wire.GradSubject(spec.ID, 0))
		m.Header.Set(wire.HdrStep, strconv.FormatInt(s.step, 10))
		m.Header.Set(wire.HdrRank, strconv.Itoa(s.rank))
		m.Header.Set(wire.HdrDtype, wire.DtypeF32)
		m.Header.Set(wire.HdrVersion, "0")
		m.Header.Set(wire.HdrMsgID, "m"+strconv.Itoa(i))
		m.Data = s.data
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		if s.taken {
			kept = append(kept, ack.Sequence)
		}
		x.mu.Lock()
		x.handleSeq(&fakeMsg{data: m.Data, hdr: m.Header}, ack.Sequence)
		x.mu.Unlock()
	}
	if x.step != 1 {
		t.Fatalf("shard at step %d, want 1", x.step)
	}
	if !r.purger.drain(ctx) {
		t.Fatal("a delete failed")
	}
	var left []uint64
	first := store.FirstSeq(&rec)
	for seq := first; seq < first+uint64(len(sent)); seq++ {
		if _, err := grads.GetMsg(ctx, seq); err == nil {
			left = append(left, seq)
		}
	}
	if !slices.Equal(left, kept) {
		t.Fatalf("the stream holds sequences %v, want the accepted ones %v", left, kept)
	}

	// A restore from step 0 replays what is left and decides the same.
	y := h.shard(t, h.runtime(t), &rec, grads, params)
	if err := y.restore(ctx); err != nil {
		t.Fatal(err)
	}
	for _, seq := range left {
		m, err := grads.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		y.mu.Lock()
		y.handleSeq(&fakeMsg{data: m.Data, hdr: m.Header}, seq)
		y.mu.Unlock()
	}
	if y.step != x.step || !slices.Equal(y.params, x.params) || y.replayFrom() != x.replayFrom() {
		t.Fatalf("replayed: step %d, replay from %d; before: step %d, replay from %d; parameters equal %v",
			y.step, y.replayFrom(), x.step, x.replayFrom(), slices.Equal(y.params, x.params))
	}
	// Step 1 applied, rank 0's held step 2 is now the gather's first (promote).
	if !x.have[0] || !y.have[0] || y.have[1] || y.next != x.next || !slices.Equal(y.acc, x.acc) {
		t.Fatal("the replay does not hold rank 0's step 2 as the first run did")
	}
}
