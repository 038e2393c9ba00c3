package runtime

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// fakeMsg is a gradient as the consumer hands it over; only what handle reads is implemented.
type fakeMsg struct {
	jetstream.Msg
	data []byte
	hdr  nats.Header
}

func (m *fakeMsg) Data() []byte         { return m.data }
func (m *fakeMsg) Headers() nats.Header { return m.hdr }

// The per-message path (parse headers, check, fold into the running sum, buffer an early rank)
// allocates nothing. Applying and publishing, once per step, are not part of it. Not parallel:
// testing.AllocsPerRun counts the whole process's allocations (and panics beside a parallel test).
func TestHandleDoesNotAllocate(t *testing.T) {
	spec := job.Spec{ID: "j", Tensors: []job.Tensor{{Name: "w", Shape: []int{4096}}}, Ranks: 8,
		Function: job.Function{Name: "adam"}, ShardSize: 16 << 10}
	spec.Normalize()
	rec := job.NewRecord(spec, time.Now())
	log := slog.New(slog.DiscardHandler)
	r := &Runtime{cpu: newCPUPool(1), log: log, rejects: newRejectLog(log, time.Now)}
	x, err := newShardExec(r, &jobInfo{rec: &rec}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	x.cancel = func() {}
	msgs := make([]*fakeMsg, 7) // ranks 6, 0..5 (rank 6 arrives early and waits): never the 8th
	for i := range msgs {
		rank := []string{"6", "0", "1", "2", "3", "4", "5"}[i]
		msgs[i] = &fakeMsg{data: make([]byte, x.shard.Bytes()), hdr: nats.Header{
			wire.HdrStep: {"1"}, wire.HdrRank: {rank}, wire.HdrDtype: {"f32"},
		}}
	}
	seq := uint64(0)
	allocs := testing.AllocsPerRun(50, func() {
		x.resetGather()
		for _, m := range msgs {
			seq++
			x.handleSeq(m, seq)
		}
	})
	if allocs > 0 {
		t.Fatalf("the per-message path allocates %.1f times per 7 messages", allocs)
	}
	if x.next != 7 || !x.have[6] || x.pend[6] != nil || x.step != 0 {
		t.Fatalf("after ranks 6,0..5: next %d (want 7: the early rank 6 folded after 5), step %d", x.next, x.step)
	}
}

// The same for an ssp job (s = 2): gradients of the next step fold, those of the two steps
// beyond it are held (admission, version check and hold allocate nothing either). Not parallel,
// as above.
func TestHandleDoesNotAllocateSSP(t *testing.T) {
	spec := job.Spec{ID: "j", Tensors: []job.Tensor{{Name: "w", Shape: []int{4096}}}, Ranks: 8,
		Function: job.Function{Name: "adam"}, ShardSize: 16 << 10, Sync: "ssp", Staleness: 2}
	spec.Normalize()
	rec := job.NewRecord(spec, time.Now())
	log := slog.New(slog.DiscardHandler)
	r := &Runtime{cpu: newCPUPool(1), log: log, rejects: newRejectLog(log, time.Now)}
	x, err := newShardExec(r, &jobInfo{rec: &rec}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	x.cancel = func() {}
	var msgs []*fakeMsg
	for _, step := range []string{"1", "2", "3"} {
		for _, rank := range []string{"6", "0", "1", "2", "3", "4", "5"} { // never rank 7: no step completes
			msgs = append(msgs, &fakeMsg{data: make([]byte, x.shard.Bytes()), hdr: nats.Header{
				wire.HdrStep: {step}, wire.HdrRank: {rank}, wire.HdrDtype: {"f32"}, wire.HdrVersion: {"0"},
			}})
		}
	}
	seq := uint64(0)
	allocs := testing.AllocsPerRun(50, func() {
		x.resetGather()
		for _, g := range x.sync.ahead {
			g.reset()
		}
		for _, m := range msgs {
			seq++
			x.handleSeq(m, seq)
		}
	})
	if allocs > 0 {
		t.Fatalf("the ssp per-message path allocates %.1f times per %d messages", allocs, len(msgs))
	}
	if x.next != 7 || x.step != 0 || !x.sync.ahead[0].have[5] || !x.sync.ahead[1].have[6] || x.sync.ahead[1].have[7] {
		t.Fatalf("after 3 steps of ranks 6,0..5: next %d (want 7), step %d (want 0), steps 2 and 3 not held as sent", x.next, x.step)
	}
}
