package gateway

import (
	"context"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/view"
	"github.com/fanin-ml/fanin/wire"
)

// serves reports whether a runtime that reported recently still lists a shard of the job, or
// has not reported since `since` (so it may still serve one).
func (s *Server) serves(jobID string, since time.Time) bool {
	now := s.view.Now()
	for _, l := range s.view.Loads() {
		if now.Sub(l.Received) > view.FreshLoad {
			continue // gone
		}
		if !l.Received.After(since) {
			return true // no word since the job's placement went away
		}
		for _, sl := range l.Shards {
			if sl.Job == jobID {
				return true
			}
		}
	}
	return false
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
	for k, p := range s.view.Placement() {
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

// Pool returns the runtimes of the pool with their load, sorted by id: those registered in the
// runtime bucket, as the view holds it (an entry that expired by its TTL is gone from the bucket).
func (s *Server) Pool(ctx context.Context) (*api.Pool, error) {
	pool := &api.Pool{Runtimes: []api.RuntimeStatus{}}
	snap := s.view.Snapshot()
	placed := map[string]int{}
	for _, p := range snap.Placement {
		placed[p.Runtime]++
		pool.Placed++
	}
	for _, rt := range snap.Runtimes {
		if rt.Expired(snap.Now) {
			continue
		}
		l, reported := snap.Loads[rt.ID]
		pool.Runtimes = append(pool.Runtimes, runtimeStatus(rt.RuntimeInfo, placed[rt.ID], l, reported))
	}
	sort.Slice(pool.Runtimes, func(i, j int) bool { return pool.Runtimes[i].ID < pool.Runtimes[j].ID })
	for _, rec := range s.records() {
		pool.Shards += rec.Layout.NumShards()
	}
	return pool, nil
}

// runtimeStatus is a runtime's registration with its latest load report, if it has reported.
func runtimeStatus(info wire.RuntimeInfo, placed int, l view.Load, reported bool) api.RuntimeStatus {
	rs := api.RuntimeStatus{RuntimeInfo: info, Placed: placed}
	if reported {
		at := l.Received.UTC()
		rs.Reported = &at
		rs.Shards = len(l.Shards)
		rs.NanosPerByte = l.NanosPerByte
		rs.Node, rs.Server, rs.NICBytesPerSec = l.Node, l.Server, l.NICBytesPerSec
		busy := 0.0
		for _, sl := range l.Shards {
			rs.BytesInPerSec += sl.BytesInPerSec
			rs.BytesOutPerSec += sl.BytesOutPerSec
			if sl.Period > 0 {
				busy += sl.Work / sl.Period.Seconds()
			}
		}
		if cores := max(1, l.Cores); busy > 0 {
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
	snap := s.view.Snapshot()
	rt, ok := snap.Runtimes[id]
	if !ok || rt.Expired(snap.Now) {
		s.problem(w, http.StatusNotFound, codeRuntimeMissing, "no runtime "+id+" is registered")
		return
	}
	placed := 0
	for _, p := range snap.Placement {
		if p.Runtime == id {
			placed++
		}
	}
	l, reported := snap.Loads[rt.ID]
	writeJSON(w, http.StatusOK, runtimeStatus(rt.RuntimeInfo, placed, l, reported))
}
