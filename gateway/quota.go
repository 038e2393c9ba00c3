package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/rate"
	"github.com/fanin-ml/fanin/wire"
)

// The bytes/s quota. Gradients do not pass through the gateway, and NATS has no rate limit, so
// the gateway meters two things and charges the larger: what the job's workers sent, as the NATS
// servers count it for the job's own account (the received bytes of its account statistics, over
// the system account; every message, stored or refused), and what the runtimes aggregate (every
// load report says, per shard, the last applied step and the gradient bytes of one step: ranks x
// shard). The governor keeps a token bucket per job (refilled at the quota, holding QuotaBurst of
// it, and at most one burst of debt); a job that overdraws it is throttled: it is paused like
// Pause does and, with NATS accounts, its account is pushed without its gradient imports, so that
// the servers refuse what it publishes (what it stored before stays, nothing accepted is lost or
// changed) until the bucket holds half a burst again; then it is resumed. It is told how long that
// takes, and it takes that long: nothing is charged while the job is throttled (its refused
// retries included) or while its pause is under way, and the debt has a floor. Each throttling is
// recorded as a quota_exceeded rejection of the job. A job is charged only for what a server
// counted between two of its answers: a server heard from for the first time is a baseline, so an
// idle job is never charged. Over a long window a job sends about its quota (what it sends beyond
// one burst of debt within one check is forgiven), and stores at most its storage bound
// (store.JobStorageBound) at any time.
//
// Metering by the load reports is coarse (one report per second per runtime) and pausing costs a
// drain and a restore; a runtime that delays consuming a job's gradients with the same token
// bucket would throttle smoothly (see docs/API.md).
const QuotaBurst = 5 * time.Second

type governor struct {
	s *Server

	mu   sync.Mutex // guards jobs and busy
	jobs map[string]*meter
	busy map[string]bool // a pause or resume of the job is under way
}

// meter is one job's token bucket and the baselines it meters from.
type meter struct {
	bucket *rate.Bucket     // bytes; its floor is one burst of debt
	steps  map[string]int64 // shard key -> last step counted
	recv   rate.Counters    // NATS server id -> the job account's received bytes there
}

// charge debits what the job used since the last check, unless it is throttled, and returns
// the credit left. A throttled job is not charged: the NATS servers count the publishes they
// refuse too, and a throttled job's publishes are all refused, so its retries alone would keep it
// throttled for good, far beyond the wait it was told. Its credit never falls below one burst of
// debt, so a throttle never lasts beyond one and a half bursts of its quota.
func (mt *meter) charge(now time.Time, used float64, throttled bool) float64 {
	if throttled {
		return mt.bucket.Level(now)
	}
	return mt.bucket.Charge(now, used)
}

func newGovernor(s *Server) *governor {
	return &governor{s: s, jobs: map[string]*meter{}, busy: map[string]bool{}}
}

func (g *governor) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.step(ctx)
		}
	}
}

// GovernStep runs one check of the bytes/s quotas (the loop does it every WithGovernorInterval).
func (s *Server) GovernStep(ctx context.Context) { s.gov.step(ctx) }

func (g *governor) step(ctx context.Context) {
	s := g.s
	ms, err := s.metas(ctx)
	if err != nil {
		return
	}
	now := s.now()
	live := map[string]bool{}
	for _, m := range ms {
		q := float64(m.Quota.BytesPerSecond)
		if q <= 0 {
			continue
		}
		live[m.ID] = true
		burst := q * s.burst.Seconds()
		g.mu.Lock()
		mt := g.jobs[m.ID]
		if mt == nil {
			mt = &meter{bucket: rate.NewBucket(q, burst, burst, now), steps: g.baseline(ctx, m.ID)}
			g.jobs[m.ID] = mt
		}
		mt.bucket.Rate, mt.bucket.Burst, mt.bucket.Floor = q, burst, burst // the quota may have changed
		used := g.used(m, mt)
		g.mu.Unlock()
		sent := g.received(ctx, m.ID) // outside g.mu: it waits for the servers' answers
		g.mu.Lock()
		if sent != nil {
			used = max(used, float64(mt.recv.Delta(sent)))
		}
		busy := g.busy[m.ID]
		credit := mt.charge(now, used, busy || m.State == api.StateThrottled)
		wait := mt.bucket.Wait(now, burst/2).Round(100 * time.Millisecond)
		g.mu.Unlock()
		switch {
		case busy:
		case m.State == api.StateRunning && credit < 0:
			rej := wire.Rejectf(wire.ReasonQuotaExceeded,
				"job %q sent or aggregated %.0f bytes of gradients in the last check, beyond its quota of %d bytes/s (burst %.0f bytes): throttled (paused, its publishes refused) for about %v",
				m.ID, used, m.Quota.BytesPerSecond, burst, wait)
			rej.Job = m.ID
			s.rejects.record(rej, sourceGateway)
			g.transition(m.ID, func(ctx context.Context) error {
				return s.Pause(ctx, m.ID, api.StateThrottled, fmt.Sprintf("over its bytes/s quota for about %v", wait))
			})
		case m.State == api.StateThrottled && credit >= burst/2:
			g.transition(m.ID, func(ctx context.Context) error { return s.Resume(ctx, m.ID, api.StateThrottled) })
		}
	}
	g.mu.Lock()
	for id := range g.jobs {
		if !live[id] {
			delete(g.jobs, id)
		}
	}
	g.mu.Unlock()
}

// used is the gradient bytes the job's shards aggregated since the last check. g.mu is held.
func (g *governor) used(m *jobMeta, mt *meter) float64 {
	rec, ok := g.s.view.Job(m.ID)
	if !ok {
		return 0
	}
	used := 0.0
	for _, sh := range rec.Layout.Shards {
		key := wire.PlacementKey(m.ID, sh.ID)
		v, ok := g.s.view.Shard(key)
		if !ok {
			continue
		}
		if prev, seen := mt.steps[key]; seen && v.Step > prev {
			used += float64(v.Step-prev) * float64(v.Bytes)
		}
		if v.Step > mt.steps[key] || !hasKey(mt.steps, key) {
			mt.steps[key] = v.Step
		}
	}
	return used
}

func hasKey(m map[string]int64, k string) bool { _, ok := m[k]; return ok }

// statzWait is how long received waits for the NATS servers' account statistics.
const statzWait = 250 * time.Millisecond

// received asks every NATS server for the bytes it has received from the job's account since it
// loaded the account (nil without NATS accounts).
func (g *governor) received(ctx context.Context, id string) map[string]uint64 {
	s := g.s
	if s.sys == nil || s.authz == nil {
		return nil
	}
	rec, ok := s.view.Job(id)
	if !ok {
		return nil
	}
	key, err := s.authz.JobAccountKey(jobAccount(&rec))
	if err != nil {
		return nil
	}
	inbox := s.sys.NewInbox()
	sub, err := s.sys.SubscribeSync(inbox)
	if err != nil {
		return nil
	}
	defer sub.Unsubscribe()
	if err := s.sys.PublishRequest("$SYS.REQ.ACCOUNT."+key+".STATZ", inbox, []byte(`{"include_unused":true}`)); err != nil {
		return nil
	}
	out := map[string]uint64{}
	deadline := time.Now().Add(statzWait)
	for {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			return out
		}
		var resp struct {
			Server struct {
				ID string `json:"id"`
			} `json:"server"`
			Data struct {
				Accounts []struct {
					Account  string `json:"acc"`
					Received struct {
						Bytes uint64 `json:"bytes"`
					} `json:"received"`
				} `json:"account_statz"`
			} `json:"data"`
		}
		if json.Unmarshal(m.Data, &resp) != nil {
			continue
		}
		for _, a := range resp.Data.Accounts {
			if a.Account == key {
				out[resp.Server.ID] += a.Received.Bytes
			}
		}
	}
}

// baseline is where metering a job starts: every shard's last published step, read from its
// parameter stream (load reports only come once a runtime has served the shard for a second).
func (g *governor) baseline(ctx context.Context, id string) map[string]int64 {
	steps := map[string]int64{}
	rec, ok := g.s.view.Job(id)
	if !ok {
		return steps
	}
	ps, err := g.s.js.Stream(ctx, wire.ParamsStream(id))
	if err != nil {
		return steps
	}
	for _, sh := range rec.Layout.Shards {
		if m, err := ps.GetLastMsgForSubject(ctx, wire.ParamsSubject(id, sh.ID)); err == nil {
			if step, err := wire.ParseStep(m.Header); err == nil {
				steps[wire.PlacementKey(id, sh.ID)] = step
			}
		}
	}
	return steps
}

// transition pauses or resumes a job in the background, one at a time per job.
func (g *governor) transition(id string, do func(context.Context) error) {
	g.mu.Lock()
	g.busy[id] = true
	g.mu.Unlock()
	g.s.wg.Add(1)
	go func() {
		defer g.s.wg.Done()
		ctx, cancel := context.WithTimeout(g.s.bg, 2*g.s.drain)
		defer cancel()
		if err := do(ctx); err != nil {
			g.s.log.Warn("quota governor", "job", id, "err", err)
		}
		g.mu.Lock()
		delete(g.busy, id)
		g.mu.Unlock()
	}()
}
