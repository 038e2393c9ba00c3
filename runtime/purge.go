package runtime

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// purger deletes gradients that a stored snapshot covers, and each gradient a shard refused.
// Requests for one subject coalesce: only the highest sequence matters. It owns its goroutine
// (run).
//
// A purge that fails (a request lost in a reconnect, a JetStream API that does not answer in time)
// is kept and tried again, like a delete, until it is done or its stream is gone: it is not left
// for the next snapshot's purge. The gradient stream's bound refuses new gradients while it is
// full, and a shard that applied everything the stream holds makes no next snapshot until a
// worker's next gradient is stored: a purge dropped then is never asked for again, and the job
// stalls for good (every worker retries its full stream until it gives up).
//
// A refused gradient is deleted by its own sequence, at once, not left for the next purge: the
// gradient stream's bound (store.CreateJobStreams: ranks x shards x GradWindow messages, refusal
// beyond) counts every stored message, and refusals of a step that never completes would
// otherwise hold it until the stream refuses the valid gradients that would complete it, for good.
// Deleting one is safe for exactly-once: the executor's decision on a message depends only on its
// state and the message, and a refusal changes no state, so a replay with the message gone takes
// every other decision the same way; and only a sequence the executor refused is ever deleted.
//
// Every purge and delete names the stream as one job incarnation created it (streamRef), and is
// sent only while the stream is still that one: the stream of a job created again under the same
// id starts its sequences over, and an old bound or sequence would take its gradients.
type purger struct {
	log   *slog.Logger
	wake  chan struct{}
	retry time.Duration // how soon purges and deletes that failed are tried again
	// purge removes the messages of k's subject below upTo; tests make it fail as a lost request.
	purge func(ctx context.Context, k purgeKey, upTo uint64) error

	mu      sync.Mutex // guards pending and refused
	pending map[purgeKey]uint64
	refused []refusedMsg
}

// purgeKey names a subject of one incarnation's stream; its value in pending is the bound: purge
// the subject's messages with sequence < bound.
type purgeKey struct {
	stream  streamRef
	subject string
}

// refusedMsg is one gradient a shard refused, to delete.
type refusedMsg struct {
	stream  streamRef
	subject string
	seq     uint64
}

func newPurger(log *slog.Logger) *purger {
	return &purger{log: log, wake: make(chan struct{}, 1), retry: time.Second, pending: make(map[purgeKey]uint64), purge: purgeSubject}
}

func purgeSubject(ctx context.Context, k purgeKey, upTo uint64) error {
	return k.stream.stream.Purge(ctx, jetstream.WithPurgeSubject(k.subject), jetstream.WithPurgeSequence(upTo))
}

// schedule asks for the messages of subject below sequence upTo to be purged.
func (p *purger) schedule(stream streamRef, subject string, upTo uint64) {
	k := purgeKey{stream, subject}
	p.mu.Lock()
	if upTo > p.pending[k] {
		p.pending[k] = upTo
	}
	p.mu.Unlock()
	p.signal()
}

// remove asks for the message at seq on subject, which the shard refused, to be deleted.
func (p *purger) remove(stream streamRef, subject string, seq uint64) {
	p.mu.Lock()
	p.refused = append(p.refused, refusedMsg{stream: stream, subject: subject, seq: seq})
	p.mu.Unlock()
	p.signal()
}

func (p *purger) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *purger) run(ctx context.Context) {
	var again <-chan time.Time // set while deletes that failed wait for another try
	for {
		select {
		case <-ctx.Done():
			// Best effort, and bounded as a whole (a refused gradient is one delete each, and a
			// server that is away answers none): what is left, the next owner purges, and
			// refuses and deletes again.
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			p.drain(sctx)
			cancel()
			return
		case <-p.wake:
		case <-again:
		}
		again = nil
		if !p.drain(ctx) {
			again = time.After(p.retry)
		}
	}
}

// drain carries out the pending purges and deletes; it reports false when some purge or delete
// failed and is queued again.
func (p *purger) drain(ctx context.Context) bool {
	p.mu.Lock()
	batch, refused := p.pending, p.refused
	p.pending, p.refused = make(map[purgeKey]uint64, len(batch)), nil
	p.mu.Unlock()
	checked := map[streamRef]error{} // one look at each stream per drain
	current := func(ctx context.Context, s streamRef) error {
		err, ok := checked[s]
		if !ok {
			err = s.current(ctx)
			checked[s] = err
		}
		return err
	}
	unpurged := map[purgeKey]uint64{}
	for k, upTo := range batch {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := current(pctx, k.stream)
		if err == nil {
			err = p.purge(pctx, k, upTo)
		}
		cancel()
		if err == nil {
			continue
		}
		delete(batch, k)
		if errors.Is(err, jetstream.ErrStreamNotFound) { // gone, or its job created again (errStreamReplaced)
			p.log.Debug("purge dropped: the stream is gone", "subject", k.subject, "err", err)
			continue
		}
		p.log.Debug("purge failed; retrying", "subject", k.subject, "below_seq", upTo, "err", err)
		unpurged[k] = upTo
	}
	var failed []refusedMsg
	for _, m := range refused {
		if upTo, ok := batch[purgeKey{m.stream, m.subject}]; ok && m.seq < upTo {
			continue // purged just now
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := current(dctx, m.stream)
		if err == nil {
			err = m.stream.stream.DeleteMsg(dctx, m.seq)
		}
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			p.log.Debug("delete of a refused gradient failed; retrying", "subject", m.subject, "seq", m.seq, "err", err)
			failed = append(failed, m)
		}
	}
	if len(failed) == 0 && len(unpurged) == 0 {
		return true
	}
	if ctx.Err() != nil {
		// Stopping: a refused gradient left behind is refused and deleted again by the next owner,
		// and the gradients a snapshot covers are purged by the next owner's restore.
		return false
	}
	p.mu.Lock()
	p.refused = append(failed, p.refused...)
	for k, upTo := range unpurged {
		p.pending[k] = max(p.pending[k], upTo)
	}
	p.mu.Unlock()
	return false
}
