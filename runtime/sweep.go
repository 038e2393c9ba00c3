package runtime

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/wire"
)

// sweepUnknownShards rejects and removes gradients published to shard subjects the job's layout
// does not have: no executor consumes them, so without this they would sit in the stream unanswered.
func (x *shardExec) sweepUnknownShards(ctx context.Context) {
	info, err := x.ji.grads.Info(ctx, jetstream.WithSubjectFilter(wire.GradWildcard(x.ji.rec.Spec.ID)))
	if err != nil {
		return
	}
	n := x.ji.rec.Layout.NumShards()
	for subject := range info.State.Subjects {
		if id, ok := wire.ShardFromSubject(subject); ok && id < n {
			continue
		}
		x.rejectSubject(ctx, subject, n)
	}
}

func (x *shardExec) rejectSubject(ctx context.Context, subject string, shards int) {
	cons, err := x.ji.grads.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return
	}
	var last uint64
	for {
		batch, err := cons.FetchNoWait(64)
		if err != nil {
			return
		}
		got := 0
		for m := range batch.Messages() {
			got++
			meta, _ := wire.ParseGradHeaders(m.Headers())
			rej := wire.Rejectf(wire.ReasonUnknownShard, "subject %s names no shard of job %s (shards 0..%d)", subject, x.ji.rec.Spec.ID, shards-1)
			rej.Job, rej.Step = x.ji.rec.Spec.ID, meta.Step
			if id, ok := wire.ShardFromSubject(subject); ok {
				rej.Shard = id
			}
			if meta.Rank < x.ranks {
				rej.Rank = meta.Rank
			}
			x.r.reject(rej, meta.ReplyTo)
			if seq, ok := wire.StreamSeq(m.Reply()); ok {
				last = seq
			}
		}
		if got == 0 || batch.Error() != nil {
			break
		}
	}
	if last > 0 {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = x.ji.grads.Purge(pctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(last+1))
	}
}
