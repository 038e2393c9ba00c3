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
	pending map[string]purgeReq
}

type purgeReq struct {
	stream jetstream.Stream
	upTo   uint64 // purge messages with sequence < upTo
}

func newPurger(log *slog.Logger) *purger {
	return &purger{log: log, wake: make(chan struct{}, 1), pending: make(map[string]purgeReq)}
}

// schedule asks for the messages of subject below sequence upTo to be purged.
func (p *purger) schedule(stream jetstream.Stream, subject string, upTo uint64) {
	p.mu.Lock()
	if old, ok := p.pending[subject]; !ok || upTo > old.upTo {
		p.pending[subject] = purgeReq{stream: stream, upTo: upTo}
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
	p.pending = make(map[string]purgeReq, len(batch))
	p.mu.Unlock()
	for subject, req := range batch {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := req.stream.Purge(pctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(req.upTo))
		cancel()
		if err != nil {
			p.log.Debug("purge failed; gradients are kept until the next one", "subject", subject, "err", err)
		}
	}
}
