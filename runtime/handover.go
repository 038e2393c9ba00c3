package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/wire"
)

// awaitRelease waits, before a shard that moved here is restored, until its previous owner has
// stored its final snapshot and released it, or is gone. At most one runtime serves a shard at a
// time, so the snapshot restored here is the newest there is. It returns when the previous owner
// stopped serving (zero when there was none, or it died), from which the pause is measured.
func (x *shardExec) awaitRelease(ctx context.Context) (time.Time, error) {
	p := x.placement
	if p.From == "" || p.From == x.r.id {
		return time.Time{}, nil
	}
	x.log.Debug("waiting for the shard's release", "from", p.From, "epoch", p.Epoch)
	w, err := x.r.buckets.Handover.Watch(ctx, x.key)
	if err != nil {
		return time.Time{}, err
	}
	defer w.Stop()
	alive := time.NewTicker(250 * time.Millisecond)
	defer alive.Stop()
	for {
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return time.Time{}, errors.New("handover watch closed")
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var h wire.Handover
			if json.Unmarshal(e.Value(), &h) == nil && h.Epoch >= p.Epoch {
				return h.Stopped, nil
			}
		case <-alive.C:
			if !x.r.alive(ctx, p.From) {
				x.log.Info("previous owner is gone; recovering from its last snapshot", "from", p.From)
				return time.Time{}, nil
			}
		}
	}
}

// alive reports whether runtime id is registered and heart-beating.
func (r *Runtime) alive(ctx context.Context, id string) bool {
	e, err := r.buckets.Runtimes.Get(ctx, id)
	if err != nil {
		return !errors.Is(err, jetstream.ErrKeyNotFound) // on other errors, assume alive: waiting is safe
	}
	return r.now().Sub(e.Created()) < store.RuntimeTTL
}
