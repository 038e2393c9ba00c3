package runtime

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/natstest"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// shardHarness runs shard executors by hand on a real JetStream: the tests of snapshots, restores
// and purges call restore, handleSeq and the acknowledgements themselves.
type shardHarness struct {
	url string
	nc  *nats.Conn
	js  jetstream.JetStream
	ctx context.Context
}

// newShardHarness starts an embedded NATS server for the test, and a connection to it; both end
// with the test, and ctx after 30 s.
func newShardHarness(t *testing.T) *shardHarness {
	t.Helper()
	nc := natstest.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return &shardHarness{url: nc.ConnectedUrl(), nc: nc, js: js, ctx: ctx}
}

// job normalizes spec, creates its streams and returns its record and the two streams a shard
// executor reads.
func (h *shardHarness) job(t *testing.T, spec job.Spec) (rec job.Record, grads, params jetstream.Stream) {
	t.Helper()
	spec.Normalize()
	rec = job.NewRecord(spec, time.Now())
	if err := store.CreateJobStreams(h.ctx, h.js, &rec, 8<<20, nil); err != nil {
		t.Fatal(err)
	}
	grads, err := h.js.Stream(h.ctx, wire.GradStream(spec.ID))
	if err != nil {
		t.Fatal(err)
	}
	if params, err = h.js.Stream(h.ctx, wire.ParamsStream(spec.ID)); err != nil {
		t.Fatal(err)
	}
	return rec, grads, params
}

// runtime is a runtime whose acker and purger do not run: the test plays them (r.acks.queue,
// r.purger.pending).
func (h *shardHarness) runtime(t *testing.T) *Runtime {
	t.Helper()
	r, err := New(h.nc, WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	r.acks, r.purger = newAcker(r.js, r.log), newPurger(r.log)
	return r
}

// shard is r's executor of shard 0 of rec, not started.
func (h *shardHarness) shard(t *testing.T, r *Runtime, rec *job.Record, grads, params jetstream.Stream) *shardExec {
	t.Helper()
	var gs []jetstream.Stream // none for a direct-gradients job
	if grads != nil {
		gs = []jetstream.Stream{grads}
	}
	x, err := newShardExec(r, newJobInfo(rec, gs, params, nil), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	x.cancel = func() {}
	return x
}
