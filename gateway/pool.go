package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/rate"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/wire"
)

const loadWildcard = wire.LoadWildcard

// freshLoad is how old a load report may be and still count as the runtime's current view.
const freshLoad = store.RuntimeLapse

// loadCache keeps the runtimes' latest load reports and, per shard, its recent steps.
type loadCache struct {
	now func() time.Time

	mu        sync.Mutex // guards the maps
	byRuntime map[string]runtimeLoad
	shards    map[string]*shardTrack // <job>.<shard> -> track
}

type runtimeLoad struct {
	rep wire.LoadReport
	at  time.Time // received
}

// shardTrack is a shard's latest load and its last steps, for steps/s.
type shardTrack struct {
	load    wire.ShardLoad
	runtime string
	at      time.Time
	steps   rate.Steps
}

func newLoadCache(now func() time.Time) *loadCache {
	return &loadCache{now: now, byRuntime: map[string]runtimeLoad{}, shards: map[string]*shardTrack{}}
}

func (c *loadCache) onReport(m *nats.Msg) {
	var rep wire.LoadReport
	if json.Unmarshal(m.Data, &rep) != nil || rep.Runtime == "" {
		return
	}
	c.add(rep)
}

func (c *loadCache) add(rep wire.LoadReport) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byRuntime[rep.Runtime] = runtimeLoad{rep: rep, at: now}
	for _, sl := range rep.Shards {
		t := c.shards[sl.Key]
		if t == nil {
			t = &shardTrack{}
			c.shards[sl.Key] = t
		}
		t.load, t.runtime, t.at = sl, rep.Runtime, now
		t.steps.Add(now, sl.Step)
	}
	for id, rl := range c.byRuntime { // forget runtimes long gone, and their shards
		if now.Sub(rl.at) > time.Minute {
			delete(c.byRuntime, id)
		}
	}
	for k, t := range c.shards {
		if now.Sub(t.at) > time.Minute {
			delete(c.shards, k)
		}
	}
}

// shardView is what the load reports say about one shard.
type shardView struct {
	load    wire.ShardLoad
	runtime string
	fresh   bool
	rate    float64 // steps per second over rate.Window, 0 if not known
}

func (c *loadCache) shard(key string) (shardView, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.shards[key]
	if t == nil {
		return shardView{}, false
	}
	now := c.now()
	v := shardView{load: t.load, runtime: t.runtime, fresh: now.Sub(t.at) < freshLoad}
	if v.fresh {
		v.rate = t.steps.Rate()
	}
	return v, true
}

func (c *loadCache) runtime(id string) (runtimeLoad, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rl, ok := c.byRuntime[id]
	return rl, ok
}

// serves reports whether a runtime that reported recently still lists a shard of the job, or
// has not reported since `since` (so it may still serve one).
func (c *loadCache) serves(jobID string, since time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	for _, rl := range c.byRuntime {
		if now.Sub(rl.at) > freshLoad {
			continue // gone
		}
		if !rl.at.After(since) {
			return true // no word since the job's placement went away
		}
		for _, sl := range rl.rep.Shards {
			if sl.Job == jobID {
				return true
			}
		}
	}
	return false
}

// placementCache mirrors the placement bucket.
type placementCache struct {
	mu      sync.RWMutex // guards entries
	entries map[string]placedEntry
}

type placedEntry struct {
	wire.Placement
	rev uint64
}

func newPlacementCache(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, wg *sync.WaitGroup) (*placementCache, error) {
	c := &placementCache{entries: map[string]placedEntry{}}
	ready, err := store.Follow(ctx, js, kv, ">", wg, c.apply)
	if err != nil {
		return nil, err
	}
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		return nil, errors.New("watch placement: no initial values in 10s")
	}
	return c, nil
}

func (c *placementCache) apply(e jetstream.KeyValueEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(c.entries, e.Key())
		return
	}
	var p wire.Placement
	if json.Unmarshal(e.Value(), &p) == nil {
		c.entries[e.Key()] = placedEntry{Placement: p, rev: e.Revision()}
	}
}

func (c *placementCache) get(key string) (placedEntry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	p, ok := c.entries[key]
	return p, ok
}

// job lists the placement keys of a job.
func (c *placementCache) job(jobID string) map[string]placedEntry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := map[string]placedEntry{}
	for k, p := range c.entries {
		if j, _, ok := splitKey(k); ok && j == jobID {
			out[k] = p
		}
	}
	return out
}

func (c *placementCache) all() map[string]placedEntry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]placedEntry, len(c.entries))
	for k, p := range c.entries {
		out[k] = p
	}
	return out
}

// splitKey splits a placement key <job>.<shard>.
func splitKey(key string) (string, int, bool) {
	i := strings.LastIndexByte(key, '.')
	if i <= 0 {
		return "", 0, false
	}
	shard, ok := wire.ShardFromSubject(key)
	return key[:i], shard, ok
}

func (s *Server) listPlacement(w http.ResponseWriter, r *http.Request) {
	out := []api.Placement{}
	for k, p := range s.placement.all() {
		j, shard, ok := splitKey(k)
		if !ok {
			continue
		}
		out = append(out, api.Placement{Key: k, Job: j, Shard: shard, Runtime: p.Runtime, Epoch: p.Epoch, From: p.From})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Job != out[j].Job {
			return out[i].Job < out[j].Job
		}
		return out[i].Shard < out[j].Shard
	})
	writeJSON(w, http.StatusOK, map[string]any{"placement": out})
}

// Pool returns the runtimes of the pool with their load, sorted by id.
func (s *Server) Pool(ctx context.Context) (*api.Pool, error) {
	pool := &api.Pool{Runtimes: []api.RuntimeStatus{}}
	placed := map[string]int{}
	for _, p := range s.placement.all() {
		placed[p.Runtime]++
		pool.Placed++
	}
	lister, err := s.buckets.Runtimes.ListKeys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, err
	}
	if lister != nil {
		for key := range lister.Keys() {
			e, err := s.buckets.Runtimes.Get(ctx, key)
			if err != nil {
				continue // expired meanwhile
			}
			var info wire.RuntimeInfo
			if json.Unmarshal(e.Value(), &info) != nil {
				continue
			}
			pool.Runtimes = append(pool.Runtimes, s.runtimeStatus(info, placed[info.ID]))
		}
	}
	sort.Slice(pool.Runtimes, func(i, j int) bool { return pool.Runtimes[i].ID < pool.Runtimes[j].ID })
	recs, err := s.records(ctx)
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		pool.Shards += rec.Layout.NumShards()
	}
	return pool, nil
}

func (s *Server) runtimeStatus(info wire.RuntimeInfo, placed int) api.RuntimeStatus {
	rs := api.RuntimeStatus{RuntimeInfo: info, Placed: placed}
	if rl, ok := s.loads.runtime(info.ID); ok {
		at := rl.at.UTC()
		rs.Reported = &at
		rs.Shards = len(rl.rep.Shards)
		rs.NanosPerByte = rl.rep.NanosPerByte
		busy := 0.0
		for _, sl := range rl.rep.Shards {
			if sl.Period > 0 {
				busy += sl.Work / sl.Period.Seconds()
			}
		}
		if cores := max(1, rl.rep.Cores); busy > 0 {
			rs.Utilization = busy / float64(cores)
		}
	}
	return rs
}

func (s *Server) listRuntimes(w http.ResponseWriter, r *http.Request) {
	pool, err := s.Pool(r.Context())
	if err != nil {
		s.internal(w, "list runtimes", err)
		return
	}
	writeJSON(w, http.StatusOK, pool)
}

// metricsTargets lists the runtimes that serve metrics in the format of Prometheus's HTTP service
// discovery (http_sd_configs), so that one scrape job follows the pool as it grows and shrinks.
// Each target carries the runtime's id as the label fanin_runtime_id.
func (s *Server) metricsTargets(w http.ResponseWriter, r *http.Request) {
	pool, err := s.Pool(r.Context())
	if err != nil {
		s.internal(w, "list runtimes", err)
		return
	}
	groups := []api.TargetGroup{}
	for _, rt := range pool.Runtimes {
		u, err := url.Parse(rt.Metrics)
		if rt.Metrics == "" || err != nil || u.Host == "" {
			continue
		}
		groups = append(groups, api.TargetGroup{Targets: []string{u.Host}, Labels: map[string]string{
			"fanin_runtime_id": rt.ID, "__scheme__": u.Scheme, "__metrics_path__": u.Path,
		}})
	}
	writeJSON(w, http.StatusOK, groups)
}

func (s *Server) getRuntime(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	e, err := s.buckets.Runtimes.Get(r.Context(), id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		s.problem(w, http.StatusNotFound, codeRuntimeMissing, "no runtime "+id+" is registered")
		return
	}
	if err != nil {
		s.internal(w, "get runtime", err)
		return
	}
	var info wire.RuntimeInfo
	if err := json.Unmarshal(e.Value(), &info); err != nil {
		s.internal(w, "decode runtime", err)
		return
	}
	placed := 0
	for _, p := range s.placement.all() {
		if p.Runtime == id {
			placed++
		}
	}
	writeJSON(w, http.StatusOK, s.runtimeStatus(info, placed))
}
