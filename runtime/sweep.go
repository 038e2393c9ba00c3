package runtime

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/wire"
)

// maxSweptSubjects is how many unknown shard subjects one sweep reads: one consumer filters them
// all, so a flood of made-up shard ids costs one consumer at a time, never one per subject.
const maxSweptSubjects = 256

// sweepUnknownShards rejects and removes gradients published to shard subjects the job's layout
// does not have: no executor consumes them, so without this they would sit in the stream unanswered.
//
// Only in the stream of the executor's own incarnation: an executor of a deleted job may still be
// stopping (its consumer notices the stream is gone only after missed heartbeats) when the job is
// created again under its id with more shards, in a stream of the same name. Swept with the old
// layout, the new job's gradients of its higher shards were rejected and purged: its first step
// never completed.
//
// A job with several gradient streams has none to sweep: each stream binds its shards' subjects
// only, and a gradient for another finds no stream (its publisher is told "no responders").
func (x *shardExec) sweepUnknownShards(ctx context.Context) {
	if len(x.ji.grads) > 1 {
		return
	}
	info, err := x.grads.stream.Info(ctx, jetstream.WithSubjectFilter(wire.GradWildcard(x.ji.rec.Spec.ID)))
	if err != nil || !info.Created.Equal(x.grads.created) {
		return
	}
	n := x.ji.rec.Layout.NumShards()
	var unknown []string
	for subject := range info.State.Subjects {
		if id, ok := wire.ShardFromSubject(subject); ok && id < n {
			continue
		}
		if unknown = append(unknown, subject); len(unknown) == maxSweptSubjects {
			break
		}
	}
	if len(unknown) > 0 {
		x.rejectSubjects(ctx, unknown, n)
	}
}

// rejectSubjects rejects every message on subjects through one short-lived consumer, then purges
// what it read and deletes the consumer.
func (x *shardExec) rejectSubjects(ctx context.Context, subjects []string, shards int) {
	cons, err := x.grads.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubjects:    subjects,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: 30 * time.Second, // removed by the server should the delete below fail
		MemoryStorage:     true,
	})
	if err != nil {
		return
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = x.grads.stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
	}()
	last := map[string]uint64{}
	for {
		batch, err := cons.FetchNoWait(64)
		if err != nil {
			break
		}
		got := 0
		for m := range batch.Messages() {
			got++
			subject := m.Subject()
			meta, _ := wire.ParseGradHeaders(m.Headers())
			rej := wire.Rejectf(wire.ReasonUnknownShard, "subject %s names no shard of job %s (shards 0..%d)", subject, x.ji.rec.Spec.ID, shards-1)
			rej.Job, rej.Step, rej.MsgID = x.ji.rec.Spec.ID, meta.Step, m.Headers().Get(wire.HdrMsgID)
			if id, ok := wire.ShardFromSubject(subject); ok {
				rej.Shard = id
			}
			if meta.Rank < x.ranks {
				rej.Rank = meta.Rank
			}
			x.r.reject(rej, meta.ReplyTo, x.ji.incarnation)
			if seq, ok := wire.StreamSeq(m.Reply()); ok {
				last[subject] = seq
			}
		}
		if got == 0 || batch.Error() != nil {
			break
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if len(last) == 0 || x.grads.current(pctx) != nil {
		return // the sequences read are not the stream's now: the job was created again meanwhile
	}
	for subject, seq := range last {
		_ = x.grads.stream.Purge(pctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(seq+1))
	}
}
