package autoscaler

import (
	"context"
	"encoding/json"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// StaticPlacer keeps every shard of every job placed on a live runtime. It never moves a shard whose
// runtime is alive. Run it in exactly one process.
type StaticPlacer struct {
	js  jetstream.JetStream
	log *slog.Logger
	// Debounce is how long the placer lets changes settle before it reconciles (default 50ms).
	Debounce time.Duration
}

// NewStaticPlacer returns a placer; log may be nil.
func NewStaticPlacer(js jetstream.JetStream, log *slog.Logger) *StaticPlacer {
	if log == nil {
		log = slog.Default()
	}
	return &StaticPlacer{js: js, log: log.With("component", "placer"), Debounce: 50 * time.Millisecond}
}

// view is the placer's picture of the shared state, rebuilt from the buckets' watches.
type view struct {
	jobs      map[string]int            // job -> number of shards
	runtimes  map[string]time.Time      // runtime id -> time of its last heartbeat
	placement map[string]wire.Placement // <job>.<shard> -> owner
	revision  map[string]uint64         // placement key -> KV revision, for compare-and-set
}

// Run watches jobs, runtimes and placement and reconciles until ctx is done.
func (p *StaticPlacer) Run(ctx context.Context) error {
	b, err := store.OpenBuckets(ctx, p.js)
	if err != nil {
		return err
	}
	v := &view{jobs: map[string]int{}, runtimes: map[string]time.Time{}, placement: map[string]wire.Placement{}, revision: map[string]uint64{}}
	jw, err := b.Jobs.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer jw.Stop()
	rw, err := b.Runtimes.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer rw.Stop()
	pw, err := b.Placement.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer pw.Stop()

	tick := time.NewTicker(store.RuntimeTTL / 4)
	defer tick.Stop()
	dirty := false
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	poke := func() {
		if !dirty {
			dirty = true
			timer.Reset(p.Debounce)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-jw.Updates():
			if e != nil {
				v.onJob(e, p.log)
			}
			poke()
		case e := <-rw.Updates():
			if e != nil {
				if e.Operation() == jetstream.KeyValuePut {
					v.runtimes[e.Key()] = e.Created()
				} else {
					delete(v.runtimes, e.Key())
				}
			}
			poke()
		case <-tick.C: // heartbeats expire without a watch event
			poke()
		case e := <-pw.Updates():
			if e != nil {
				v.onPlacement(e)
			}
			poke()
		case <-timer.C:
			dirty = false
			p.reconcile(ctx, b.Placement, v)
		}
	}
}

func (v *view) onJob(e jetstream.KeyValueEntry, log *slog.Logger) {
	if e.Operation() != jetstream.KeyValuePut {
		delete(v.jobs, e.Key())
		return
	}
	var rec job.Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		log.Warn("undecodable job record", "job", e.Key(), "err", err)
		return
	}
	v.jobs[e.Key()] = rec.Layout.NumShards()
}

func (v *view) onPlacement(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		delete(v.placement, e.Key())
		delete(v.revision, e.Key())
		return
	}
	var pl wire.Placement
	if json.Unmarshal(e.Value(), &pl) == nil {
		v.placement[e.Key()] = pl
		v.revision[e.Key()] = e.Revision()
	}
}

// reconcile places unplaced shards and shards of dead runtimes on the least-loaded live runtime,
// and deletes the placement of jobs that are gone.
func (p *StaticPlacer) reconcile(ctx context.Context, kv jetstream.KeyValue, v *view) {
	load := make(map[string]int, len(v.runtimes))
	for id, beat := range v.runtimes {
		if time.Since(beat) < store.RuntimeTTL {
			load[id] = 0
		}
	}
	for key, pl := range v.placement {
		jobID, _, _ := strings.Cut(key, ".")
		if _, ok := v.jobs[jobID]; !ok {
			if err := kv.Delete(ctx, key, jetstream.LastRevision(v.revision[key])); err != nil {
				p.log.Debug("delete placement", "key", key, "err", err)
			}
			continue
		}
		if _, live := load[pl.Runtime]; live {
			load[pl.Runtime]++
		}
	}
	if len(load) == 0 {
		return
	}
	ids := make([]string, 0, len(load))
	for id := range load {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	jobs := make([]string, 0, len(v.jobs))
	for j := range v.jobs {
		jobs = append(jobs, j)
	}
	sort.Strings(jobs)
	for _, j := range jobs {
		for shard := 0; shard < v.jobs[j]; shard++ {
			key := j + "." + strconv.Itoa(shard)
			old, placed := v.placement[key]
			if _, live := load[old.Runtime]; placed && live {
				continue
			}
			target := ids[0]
			for _, id := range ids[1:] {
				if load[id] < load[target] {
					target = id
				}
			}
			pl := wire.Placement{Runtime: target, Epoch: old.Epoch + 1, From: old.Runtime}
			val, _ := json.Marshal(pl)
			var err error
			if placed {
				_, err = kv.Update(ctx, key, val, v.revision[key])
			} else {
				_, err = kv.Create(ctx, key, val)
			}
			if err != nil {
				p.log.Debug("placement write lost a race; will retry", "key", key, "err", err)
				continue
			}
			load[target]++
			if placed {
				p.log.Info("shard moved off a dead runtime", "key", key, "from", old.Runtime, "to", target)
			}
		}
	}
}
