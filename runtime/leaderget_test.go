package runtime

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// TestRestoreReadsSnapshotsFromTheLeader: a restore reads its snapshot with a JetStream message
// get, which only the stream's leader answers, never with a direct get, which any replica that is
// 90% caught up may answer with an older snapshot than one already acknowledged (whose gradients
// may then be purged). The test watches the API subjects of the parameters stream while a shard
// restores (it used nats.go's GetLastMsgForSubject, a direct get on this stream), and checks that
// lastFromLeader reads what a direct get reads: subject, sequence, headers and payload, and
// ErrMsgNotFound for a subject without messages.
func TestRestoreReadsSnapshotsFromTheLeader(t *testing.T) {
	t.Parallel()
	h := newShardHarness(t)
	ctx, js, nc := h.ctx, h.js, h.nc
	spec := job.Spec{ID: "leader", Tensors: []job.Tensor{{Name: "w", Shape: []int{1000}}}, Ranks: 2,
		Function: job.Function{Name: "adam", Hyper: map[string]float64{"lr": 0.1}}}
	rec, grads, params := h.job(t, spec)
	if err := store.PublishParams(ctx, js, spec.ID, "", 0, 0, 0, make([]byte, 4000)); err != nil { // step 0
		t.Fatal(err)
	}
	if !params.CachedInfo().Config.AllowDirect {
		t.Fatal("the parameters stream does not allow direct gets: this test watches for them")
	}

	watch, err := nats.Connect(h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	var direct, leader atomic.Int32
	stream := wire.ParamsStream(spec.ID)
	for subj, n := range map[string]*atomic.Int32{
		"$JS.API.DIRECT.GET." + stream: &direct, "$JS.API.DIRECT.GET." + stream + ".>": &direct,
		"$JS.API.STREAM.MSG.GET." + stream: &leader,
	} {
		if _, err := watch.Subscribe(subj, func(*nats.Msg) { n.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}

	x := h.shard(t, h.runtime(t), &rec, grads, params)
	if err := x.restore(ctx); err != nil { // step 0, then its first checkpoint (adam)
		t.Fatal(err)
	}
	if err := x.restore(ctx); err != nil { // from that checkpoint
		t.Fatal(err)
	}
	// The watcher's callbacks may run after the requests were answered: wait until it has seen
	// the four gets, of either kind.
	for leader.Load()+direct.Load() < 4 && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	if direct.Load() != 0 || leader.Load() < 4 {
		t.Fatalf("two restores made %d direct gets and %d leader gets of %s, want 0 and 4", direct.Load(), leader.Load(), stream)
	}

	for _, subj := range []string{wire.CkptSubject(spec.ID, 0), wire.ParamsSubject(spec.ID, 0)} {
		want, err := params.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			t.Fatal(err)
		}
		got, err := lastFromLeader(ctx, nc, stream, subj)
		if err != nil {
			t.Fatal(err)
		}
		same := got.Subject == want.Subject && got.Sequence == want.Sequence && string(got.Data) == string(want.Data)
		for k, v := range want.Header {
			if k != jetstream.StreamHeader && k != jetstream.SequenceHeader && k != jetstream.TimeStampHeaer && k != jetstream.SubjectHeader && k != "Nats-Num-Pending" {
				same = same && slices.Equal(got.Header[k], v)
			}
		}
		if !same {
			t.Errorf("%s: leader read %s #%d %v (%d bytes), direct read %s #%d %v (%d bytes)", subj, got.Subject, got.Sequence, got.Header, len(got.Data), want.Subject, want.Sequence, want.Header, len(want.Data))
		}
	}
	if _, err := lastFromLeader(ctx, nc, stream, wire.CkptSubject(spec.ID, 7)); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("a subject without messages: %v, want ErrMsgNotFound", err)
	}
}
