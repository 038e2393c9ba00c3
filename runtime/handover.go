package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/wire"
)

// failHandover holds, per shard key, a test's fault: a function whose error fails each write of
// the shard's handover record, as if the write's requests had timed out.
var failHandover sync.Map // shard key -> func() error

// A shard moves from runtime A to runtime B when the placement entry of epoch e names B with
// From A. B serves only once A has written a handover record of epoch >= e (A has stopped and its
// final snapshot is stored) or A is gone. Every runtime named From must therefore write that
// record, even one that never served the shard: its placement may have moved on before it started,
// or it may never have seen the entry that placed the shard on it.

// awaitRelease waits, before a shard that moved here is restored, until its previous owner has
// stored its final snapshot and released it, or is gone. At most one runtime serves a shard at a
// time, so the snapshot restored here is the newest there is. It returns when the previous owner
// stopped serving (Stopped, from which the pause is measured) and the last gradient it decided on
// (Decided); the zero record when there was none, or it died.
func (x *shardExec) awaitRelease(ctx context.Context) (wire.Handover, error) {
	return x.r.awaitRelease(ctx, x.key, x.placement, x.log)
}

// awaitRelease waits until the runtime p.From has released shard key at epoch p.Epoch or later,
// or is gone, and returns its handover record (zero if it is gone).
func (r *Runtime) awaitRelease(ctx context.Context, key string, p wire.Placement, log *slog.Logger) (wire.Handover, error) {
	if p.From == "" || p.From == r.id {
		return wire.Handover{}, nil
	}
	log.Debug("waiting for the shard's release", "from", p.From, "epoch", p.Epoch)
	w, err := r.buckets.Handover.Watch(ctx, key)
	if err != nil {
		return wire.Handover{}, err
	}
	defer w.Stop()
	alive := time.NewTicker(250 * time.Millisecond)
	defer alive.Stop()
	for {
		select {
		case <-ctx.Done():
			return wire.Handover{}, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return wire.Handover{}, errors.New("handover watch closed")
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var h wire.Handover
			if json.Unmarshal(e.Value(), &h) == nil && h.Epoch >= p.Epoch {
				return h, nil
			}
		case <-alive.C:
			if !r.alive(ctx, p.From) {
				log.Info("previous owner is gone; recovering from its last snapshot", "from", p.From)
				return wire.Handover{}, nil
			}
		}
	}
}

// releaseUnserved writes the handover record of placement cur, which moves shard key away from
// this runtime although no executor of it runs here: the entry that placed the shard here was
// missed (a watcher that fell behind more revisions than the bucket keeps), its executor could not
// start, or this runtime restarted under the same id. Before releasing, it waits for the previous
// entry's owner to release, exactly as an executor would have.
//
// rctx is the runtime's: it ends the retries of the record (recordRelease) when the runtime stops.
func (r *Runtime) releaseUnserved(rctx context.Context, key string, cur wire.Placement) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := r.log.With("shard", key)
	if h, err := r.handover(ctx, key); err == nil && h.Epoch >= cur.Epoch {
		return // released already
	}
	var before wire.Handover // the previous owner's record, once it released
	prev, err := r.placementAt(ctx, key, cur.Epoch-1)
	switch {
	case err != nil:
		log.Warn("cannot find the placement that put the shard here; releasing it without waiting", "epoch", cur.Epoch, "err", err)
	case prev.Runtime != r.id:
		log.Warn("placement history is inconsistent: the shard moves from here but was placed elsewhere", "epoch", cur.Epoch, "placed_on", prev.Runtime)
	default:
		if before, err = r.awaitRelease(ctx, key, prev, log); err != nil {
			log.Warn("shard moved on before its previous owner released it", "err", err)
		}
	}
	now := r.now().UTC()
	log.Debug("releasing a shard not served here", "epoch", cur.Epoch)
	// Decided is passed on: the owner before this one reported the refusals up to there.
	r.recordRelease(rctx, key, wire.Handover{Epoch: cur.Epoch, From: r.id, Stopped: now, Released: now, Decided: before.Decided})
}

// handover reads the shard's handover record; a shard never released reads as epoch 0.
func (r *Runtime) handover(ctx context.Context, key string) (wire.Handover, error) {
	var h wire.Handover
	e, err := r.buckets.Handover.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return h, nil
	}
	if err != nil {
		return h, err
	}
	return h, json.Unmarshal(e.Value(), &h)
}

// placementAt finds the placement of shard key at epoch in the bucket's history.
func (r *Runtime) placementAt(ctx context.Context, key string, epoch uint64) (wire.Placement, error) {
	hist, err := r.buckets.Placement.History(ctx, key)
	if err != nil {
		return wire.Placement{}, err
	}
	for i := len(hist) - 1; i >= 0; i-- {
		var p wire.Placement
		if hist[i].Operation() == jetstream.KeyValuePut && json.Unmarshal(hist[i].Value(), &p) == nil && p.Epoch == epoch {
			return p, nil
		}
	}
	return wire.Placement{}, fmt.Errorf("epoch %d is no longer in the placement history", epoch)
}

// alive reports whether runtime id is registered and heart-beating.
func (r *Runtime) alive(ctx context.Context, id string) bool {
	e, err := r.buckets.Runtimes.Get(ctx, id)
	if err != nil {
		return !errors.Is(err, jetstream.ErrKeyNotFound) // on other errors, assume alive: waiting is safe
	}
	var info wire.RuntimeInfo
	_ = json.Unmarshal(e.Value(), &info) // unreadable: the default lapse
	return store.RuntimeAlive(e.Created(), info.Lapse, r.now())
}
