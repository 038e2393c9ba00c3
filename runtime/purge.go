package runtime

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// purger deletes gradients that a stored snapshot covers. Requests for one subject coalesce: only
// the highest sequence matters. It owns its goroutine (run).
type purger struct {
	log  *slog.Logger
	wake chan struct{}

	mu      sync.Mutex // guards pending
	pending map[purgeKey]uint64
}

// purgeKey names a subject of one stream as one job incarnation created it: a purge is never sent
// to the stream of the job created again under the same id (its sequences start over, and the old
// bound would take its gradients).
type purgeKey struct {
	stream  streamRef
	subject string
}

func newPurger(log *slog.Logger) *purger {
	return &purger{log: log, wake: make(chan struct{}, 1), pending: make(map[purgeKey]uint64)}
}

// schedule asks for the messages of subject below sequence upTo to be purged.
func (p *purger) schedule(stream streamRef, subject string, upTo uint64) {
	k := purgeKey{stream, subject}
	p.mu.Lock()
	if upTo > p.pending[k] {
		p.pending[k] = upTo
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *purger) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			p.drain(context.Background()) // best effort: what is left is purged by the next owner
			return
		case <-p.wake:
			p.drain(ctx)
		}
	}
}

func (p *purger) drain(ctx context.Context) {
	p.mu.Lock()
	batch := p.pending
	p.pending = make(map[purgeKey]uint64, len(batch))
	p.mu.Unlock()
	checked := map[streamRef]error{} // one look at each stream per batch
	for k, upTo := range batch {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err, ok := checked[k.stream]
		if !ok {
			err = k.stream.current(pctx)
			checked[k.stream] = err
		}
		if err == nil {
			err = k.stream.stream.Purge(pctx, jetstream.WithPurgeSubject(k.subject), jetstream.WithPurgeSequence(upTo))
		}
		cancel()
		if err != nil {
			p.log.Debug("purge failed; gradients are kept until the next one", "subject", k.subject, "err", err)
		}
	}
}
