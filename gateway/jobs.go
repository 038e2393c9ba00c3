package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// The job service: creating, reading, pausing, resuming and deleting jobs. Its HTTP handlers are in
// jobs_http.go; the NATS accounts and credentials of jobs in accounts.go.

// QuotaError is a quota a request would exceed. errors.Is(err, ErrQuota) holds.
type QuotaError struct{ Msg string }

func (e *QuotaError) Error() string { return e.Msg }

func (e *QuotaError) Unwrap() error { return ErrQuota }

// CreateJob creates a job as the admin and returns its record (SubmitJob returns its credentials too).
func (s *Server) CreateJob(ctx context.Context, spec job.Spec) (*job.Record, error) {
	c, err := s.SubmitJob(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &c.Record, nil
}

// SubmitJob creates a job as the admin, as POST /v1/jobs does: the result carries its token and
// its workers' NATS credentials (when the gateway has an authority).
func (s *Server) SubmitJob(ctx context.Context, spec job.Spec) (*api.JobCreated, error) {
	return s.create(ctx, spec, grant{Kind: auth.KindAdmin})
}

// create validates a spec against the spec rules and the owner's quotas, records the job's
// metadata (which also reserves its id), creates its streams, publishes its initial parameters
// (unless uploaded), issues its token and NATS credentials, and stores its record last, so that
// whoever sees the record finds the streams in place.
func (s *Server) create(ctx context.Context, spec job.Spec, g grant) (*api.JobCreated, error) {
	spec.Normalize()
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if err := s.resolveFunction(ctx, &spec, g); err != nil {
		return nil, err
	}
	if spec.Priority == job.PriorityHigh && !g.admin() {
		// A tenant that could make its own jobs high would make every job high: the class is the
		// platform's call. Low and normal are anyone's.
		return nil, fmt.Errorf("job %q: %w (%s asked for it): use normal or low, or ask an admin", spec.ID, ErrHighPriority, ownerName(g))
	}
	if model := 4 * int64(spec.NumElements()); model > s.maxModel {
		return nil, fmt.Errorf("%w: tensors: the model is %s of float32 parameters, this fanin accepts at most %s per job",
			job.ErrInvalidSpec, job.ByteSize(model), job.ByteSize(s.maxModel))
	}
	rec := job.NewRecord(spec, s.now())
	if err := store.CheckFits(&rec, s.nc.MaxPayload()); err != nil {
		return nil, err
	}
	quota, err := s.quotaOf(ctx, g)
	if err != nil {
		return nil, err
	}
	if n := rec.Layout.NumShards(); quota.Shards > 0 && n > quota.Shards {
		return nil, &QuotaError{fmt.Sprintf("job %q has %d shards, the quota allows %d per job: use a larger shard_size or ask for a larger quota", spec.ID, n, quota.Shards)}
	}
	unlock := s.lockOwner(g.owner())
	defer unlock()
	if quota.Jobs > 0 || quota.StorageBytes > 0 {
		ms, err := s.metas(ctx)
		if err != nil {
			return nil, err
		}
		// The records come from the view: it holds every job this gateway created (create waits
		// for it), and what one job may store never changes. A job whose record is not stored
		// yet (being created) counts, and stores nothing so far.
		n, stored := 0, storageOf(&rec)
		for _, m := range ms {
			if m.Owner != g.owner() {
				continue
			}
			n++
			if other, ok := s.view.Job(m.ID); ok {
				stored += storageOf(&other)
			}
		}
		if quota.Jobs > 0 && n >= quota.Jobs {
			return nil, &QuotaError{fmt.Sprintf("%s owns %d jobs, the quota allows %d: delete one first", ownerName(g), n, quota.Jobs)}
		}
		if quota.StorageBytes > 0 && stored > quota.StorageBytes {
			return nil, &QuotaError{fmt.Sprintf("%s's jobs with this one may store %s, the quota allows %s: this job alone may store %s (ranks x model x %d steps of gradients, and its parameters): delete a job, or ask for a larger quota",
				ownerName(g), job.ByteSize(stored), job.ByteSize(quota.StorageBytes), job.ByteSize(storageOf(&rec)), store.GradWindow(&rec.Spec))}
		}
	}
	if _, err := s.buckets.Jobs.Get(ctx, spec.ID); err == nil {
		return nil, fmt.Errorf("job %q: %w", spec.ID, ErrJobExists)
	}
	now := s.now().UTC()
	meta := jobMeta{ID: spec.ID, Owner: g.owner(), Quota: quota, State: api.StateRunning, Since: now, Created: now}
	val, _ := json.Marshal(meta)
	if _, err := s.state.Create(ctx, metaKey(spec.ID), val); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("job %q: %w", spec.ID, ErrJobExists)
		}
		return nil, fmt.Errorf("store metadata of job %q: %w", spec.ID, err)
	}
	created := &api.JobCreated{Record: rec, State: api.StateRunning, Owner: meta.Owner, Quota: quota}
	undo := func() {
		bg := context.WithoutCancel(ctx)
		_ = store.DeleteJobStreams(bg, s.js, spec.ID)
		if m, err := s.meta(bg, spec.ID); err == nil {
			s.dropTokens(bg, m.Tokens...)
		}
		_ = s.state.Delete(bg, metaKey(spec.ID))
	}
	if err := s.setup(ctx, &rec, created); err != nil {
		undo()
		return nil, err
	}
	rv, _ := json.Marshal(rec)
	rev, err := s.buckets.Jobs.Create(ctx, spec.ID, rv)
	if err != nil {
		undo()
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("job %q: %w", spec.ID, ErrJobExists)
		}
		return nil, fmt.Errorf("store job %q: %w", spec.ID, err)
	}
	s.awaitView(ctx, rev)
	s.log.Info("job created", "job", spec.ID, "owner", meta.Owner, "ranks", spec.Ranks, "shards", rec.Layout.NumShards(),
		"elements", rec.Layout.Elements, "function", spec.Function.Name, "credentials", created.Credentials != nil)
	return created, nil
}

// runtimeNodes are the nodes of the pool's live runtimes, as their load reports name them, sorted:
// where a job with several gradient streams gets them (store.CreateJobStreams).
func (s *Server) runtimeNodes() []string {
	snap := s.view.Snapshot()
	seen := map[string]bool{}
	var nodes []string
	for id, rt := range snap.Runtimes {
		if l, ok := snap.Loads[id]; ok && l.Node != "" && !rt.Expired(snap.Now) && !seen[l.Node] {
			seen[l.Node] = true
			nodes = append(nodes, l.Node)
		}
	}
	slices.Sort(nodes)
	return nodes
}

// logGradStreams says where the n gradient streams of rec's job are, for the operator: on the
// nodes of the runtimes heard from, or where JetStream put them (no runtime had reported its node,
// or no server carries a node's tag: docs/KUBERNETES.md).
func (s *Server) logGradStreams(ctx context.Context, rec *job.Record, n int, nodes []string) {
	on := make([]string, n)
	for g := range on {
		on[g] = "?"
		if st, err := s.js.Stream(ctx, wire.GradGroupStream(rec.Spec.ID, g)); err == nil && st.CachedInfo().Cluster != nil {
			on[g] = st.CachedInfo().Cluster.Leader
		}
	}
	if len(nodes) == 0 {
		s.log.Warn("no runtime has reported its node: JetStream placed the job's gradient streams", "job", rec.Spec.ID, "servers", on)
		return
	}
	s.log.Info("gradient streams placed", "job", rec.Spec.ID, "nodes", nodes, "servers", on)
}

// setup creates the job's streams, initial parameters, token and credentials.
func (s *Server) setup(ctx context.Context, rec *job.Record, c *api.JobCreated) error {
	id := rec.Spec.ID
	nodes := s.runtimeNodes()
	if err := store.CreateJobStreams(ctx, s.js, rec, s.nc.MaxPayload(), nodes); err != nil {
		var apiErr *jetstream.APIError
		switch {
		case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
			return fmt.Errorf("job %q: %w", id, ErrJobExists)
		case store.StorageFull(err):
			grad, params := store.JobStorageBound(rec)
			return fmt.Errorf("job %q: %w: its streams reserve %s for gradients and %s for parameters (%s storage, %d replicas): free space on the servers' JetStream store, raise their max_store, or use a smaller or memory job: %w",
				id, store.ErrStorageFull, job.ByteSize(grad), job.ByteSize(params), rec.Spec.Storage, rec.Spec.Replicas, err)
		case errors.As(err, &apiErr) && (apiErr.ErrorCode == jsErrReplicasNotSupported || apiErr.ErrorCode == jsErrInsufficientResources):
			return fmt.Errorf("%w: replicas: the NATS servers cannot keep %d replicas of the job's streams: %s",
				job.ErrInvalidSpec, rec.Spec.Replicas, apiErr.Description)
		}
		return err
	}
	if n := rec.Spec.GradStreams(); n > 1 {
		s.logGradStreams(ctx, rec, n, nodes)
	}
	if rec.Spec.Init.Kind != "upload" {
		if err := store.PublishInitial(ctx, s.js, rec); err != nil {
			return err
		}
	}
	var hash string
	if s.admin != "" {
		tok, h, err := s.issueToken(ctx, grant{Kind: auth.KindJob, Job: id})
		if err != nil {
			return err
		}
		c.Token, hash = tok, h
	}
	var creds *api.Credentials
	if s.authz != nil {
		if err := s.pushJobAccount(ctx, rec, accountOpen); err != nil {
			return err
		}
		// Loaded by every server before the credentials leave: a client's first connections
		// then find it there (auth.LoadAccount says why).
		key, err := s.authz.JobAccountKey(jobAccount(rec))
		if err != nil {
			return err
		}
		if err := auth.LoadAccount(ctx, s.sys, key); err != nil {
			return fmt.Errorf("account of job %q: %w", rec.Spec.ID, err)
		}
		if creds, err = s.mintCredentials(rec); err != nil {
			return err
		}
		c.Credentials = creds
	}
	_, err := s.updateMeta(ctx, id, func(m *jobMeta) error {
		if hash != "" {
			m.Tokens = append(m.Tokens, hash)
		}
		if creds != nil {
			m.Users = append(m.Users, creds.User)
		}
		return nil
	})
	if err == nil && creds != nil {
		s.mu.Lock()
		s.users[creds.User] = id
		s.mu.Unlock()
	}
	return err
}

// JetStream's error codes for a stream that asks for more replicas than the servers can give.
const (
	jsErrInsufficientResources jetstream.ErrorCode = 10023 // "insufficient resources"
	jsErrReplicasNotSupported  jetstream.ErrorCode = 10074 // "replicas > 1 not supported in non-clustered mode"
)

// storageOf is what a job's streams may store (store.JobStorageBound).
func storageOf(rec *job.Record) int64 {
	grad, params := store.JobStorageBound(rec)
	return grad + params
}

func ownerName(g grant) string {
	if g.Kind == auth.KindTeam {
		return "team token " + g.Team
	}
	return "the admin token"
}

func (s *Server) lockJob(id string) func() {
	mu, _ := s.jobLocks.LoadOrStore(id, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	return mu.(*sync.Mutex).Unlock
}

// quotaOf is the quota of jobs created with g.
func (s *Server) quotaOf(ctx context.Context, g grant) (api.Quota, error) {
	if g.Kind != auth.KindTeam {
		return s.defQuota, nil
	}
	t, err := s.team(ctx, g.Team)
	if err != nil {
		return api.Quota{}, err
	}
	return t.Quota, nil
}

// record returns a job's record, from the jobs bucket, and its metadata. Jobs created before the
// gateway kept metadata get a default one (running, owned by the admin).
func (s *Server) record(ctx context.Context, id string) (*job.Record, *jobMeta, error) {
	m, err := s.meta(ctx, id) // first: it moves a record an older gateway kept there to the jobs bucket
	if err != nil && !errors.Is(err, ErrJobNotFound) {
		return nil, nil, err
	}
	rec, _, err := s.jobRecord(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if m == nil {
		m = &jobMeta{ID: id, Owner: "admin", Quota: s.defQuota, State: api.StateRunning, Since: rec.Created, Created: rec.Created}
	}
	return rec, m, nil
}

// jobRecord reads a job's record and its revision from the jobs bucket.
func (s *Server) jobRecord(ctx context.Context, id string) (*job.Record, uint64, error) {
	e, err := s.buckets.Jobs.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return nil, 0, fmt.Errorf("job %q: %w", id, ErrJobNotFound)
	}
	if err != nil {
		return nil, 0, err
	}
	var rec job.Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, 0, fmt.Errorf("decode job %q: %w", id, err)
	}
	return &rec, e.Revision(), nil
}

// updateRecord changes a job's record in the jobs bucket with compare-and-set, retrying on a
// concurrent change (a change that leaves the record as it was writes nothing), and returns it
// once the view holds it.
func (s *Server) updateRecord(ctx context.Context, id string, change func(*job.Record) error) (*job.Record, error) {
	for range 10 {
		rec, rev, err := s.jobRecord(ctx, id)
		if err != nil {
			return nil, err
		}
		before, _ := json.Marshal(rec)
		if err := change(rec); err != nil {
			return nil, err
		}
		val, _ := json.Marshal(rec)
		if bytes.Equal(val, before) {
			return rec, nil
		}
		rev, err = s.buckets.Jobs.Update(ctx, id, val, rev)
		if err == nil {
			s.awaitView(ctx, rev)
			return rec, nil
		}
		if !isWrongSeq(err) {
			return nil, fmt.Errorf("update job %q: %w", id, err)
		}
	}
	return nil, fmt.Errorf("job %q: its record changed concurrently too often", id)
}

// viewWait bounds how long a change to the jobs bucket waits for the view (awaitView).
const viewWait = 5 * time.Second

// awaitView waits until the view holds revision rev of the jobs bucket, which this gateway has just
// written: what it answers next from the view (the job list, the quota checks of the next jobs
// created) then includes its own change. A view that lags beyond viewWait delays the answer no
// longer; it is logged.
func (s *Server) awaitView(ctx context.Context, rev uint64) {
	ctx, cancel := context.WithTimeout(ctx, viewWait)
	defer cancel()
	if err := s.view.WaitSeen(ctx, wire.JobsBucket, rev); err != nil {
		s.log.Warn("the view lags behind the jobs bucket", "err", err)
	}
}

// records lists every job's record (paused ones included), sorted by id, as the view holds them:
// with this gateway's own creations and changes (awaitView). A job deleted a moment ago may still
// be listed: listJobs reads each job again (Status).
func (s *Server) records() []job.Record {
	recs := slices.Collect(maps.Values(s.view.Jobs()))
	slices.SortFunc(recs, func(a, b job.Record) int { return strings.Compare(a.Spec.ID, b.Spec.ID) })
	return recs
}

// Jobs lists the records of every job, sorted by id.
func (s *Server) Jobs(ctx context.Context) ([]job.Record, error) { return s.records(), nil }

// Status returns a job's status; with detail, per shard.
func (s *Server) Status(ctx context.Context, id string, detail bool) (*api.JobStatus, error) {
	rec, m, err := s.record(ctx, id)
	if err != nil {
		return nil, err
	}
	st := &api.JobStatus{Record: *rec, State: m.State, Owner: m.Owner, Quota: m.Quota, Step: -1}
	st.Paused = false // the runtimes' mark: the API says paused or throttled in State
	st.Rejects = s.rejects.total(ctx, id)
	st.LiveWorkers = s.liveWorkers(id)
	placed := s.view.JobPlacement(id)
	shards := make([]api.ShardStatus, len(rec.Layout.Shards))
	var params jetstream.Stream
	known, frontier := 0, int64(-1)
	for i, sh := range rec.Layout.Shards {
		key := wire.PlacementKey(id, sh.ID)
		ss := api.ShardStatus{ID: sh.ID, Key: key, Bytes: sh.Bytes(), Step: -1}
		if p, ok := placed[key]; ok {
			ss.Runtime, ss.Epoch = p.Runtime, p.Epoch
			st.Placed++
		}
		if v, ok := s.view.Shard(key); ok && v.Fresh && m.State == api.StateRunning {
			ss.Step, ss.Pending = v.Step, v.Pending
			ss.QueueWaitMs = ms(v.QueueWait)
			ss.BurstMs, ss.PeriodMs = ms(v.Burst), ms(v.Period)
			st.BytesPerSecond += v.Rate * float64(v.Bytes)
		} else if detail || known < maxDirectGets {
			// Not served now (paused, or between owners): its last published parameters say.
			if params == nil {
				params, _ = s.js.Stream(ctx, wire.ParamsStream(id))
			}
			if params != nil {
				if msg, err := params.GetLastMsgForSubject(ctx, wire.ParamsSubject(id, sh.ID)); err == nil {
					if step, err := wire.ParseStep(msg.Header); err == nil {
						ss.Step = step
					}
				}
			}
		}
		if ss.Step >= 0 {
			known++
			frontier = max(frontier, ss.Step)
			if st.Step < 0 || ss.Step < st.Step {
				st.Step = ss.Step
			}
		}
		shards[i] = ss
	}
	if known < len(shards) {
		st.Step = -1 // the slowest shard is not known
	}
	if m.State == api.StateRunning {
		st.StepsPerSecond = s.view.JobRate(id) // the slowest of the shards summed above
	}
	for i := range shards {
		if shards[i].Step >= 0 {
			shards[i].Lag = frontier - shards[i].Step
		}
	}
	if detail {
		st.Shards = shards
	}
	return st, nil
}

// maxDirectGets bounds the direct gets of one listing (shards no load report covers).
const maxDirectGets = 256

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Pause takes a job off the runtimes: its record in the jobs bucket is marked paused, so the
// autoscaler removes its placement and the runtimes stop its shards after a final checkpoint. Its
// streams stay: workers may keep publishing, or join, and their gradients queue in the stream until
// Resume. Pause returns when the runtimes have let go (or after the drain timeout), with the job's
// handover records cleared, so that Resume starts clean.
func (s *Server) Pause(ctx context.Context, id, state, why string) error {
	unlock := s.lockJob(id)
	defer unlock()
	rec, m, err := s.record(ctx, id)
	if err != nil {
		return err
	}
	if m.State != api.StateRunning {
		return fmt.Errorf("job %q is %s: %w", id, m.State, ErrBadState)
	}
	if _, err := s.state.Get(ctx, metaKey(id)); errors.Is(err, jetstream.ErrKeyNotFound) {
		val, _ := json.Marshal(m) // a job created before the gateway kept metadata
		if _, err := s.state.Create(ctx, metaKey(id), val); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return err
		}
	}
	if _, err := s.updateMeta(ctx, id, func(m *jobMeta) error {
		m.State, m.Since = state, s.now().UTC()
		return nil
	}); err != nil {
		return err
	}
	if state == api.StateThrottled && s.authz != nil {
		// Over its bytes/s quota: the servers refuse its gradients until it is resumed.
		if err := s.pushJobAccount(ctx, rec, accountThrottled); err != nil {
			s.log.Error("throttle the job's NATS account: its gradients are still accepted", "job", id, "err", err)
		}
	}
	if _, err := s.updateRecord(ctx, id, func(r *job.Record) error { r.Paused = true; return nil }); err != nil {
		return err
	}
	s.awaitDrain(ctx, id)
	s.clearHandover(ctx, rec)
	s.log.Info("job paused", "job", id, "state", state, "why", why)
	return nil
}

// Resume clears a paused job's mark in the jobs bucket: the autoscaler places its shards again, and
// their new owners restore the final checkpoints and consume the gradients queued meanwhile.
// Only a job in one of the states from may be resumed.
func (s *Server) Resume(ctx context.Context, id string, from ...string) error {
	unlock := s.lockJob(id)
	defer unlock()
	m, err := s.meta(ctx, id)
	if err != nil {
		return err
	}
	if !slices.Contains(from, m.State) {
		return fmt.Errorf("job %q is %s: %w", id, m.State, ErrBadState)
	}
	rec, _, err := s.jobRecord(ctx, id)
	if err != nil {
		return err
	}
	s.clearHandover(ctx, rec)
	if m.State == api.StateThrottled && s.authz != nil {
		if err := s.pushJobAccount(ctx, rec, accountOpen); err != nil {
			return fmt.Errorf("resume job %q: %w", id, err)
		}
	}
	if _, err := s.updateRecord(ctx, id, func(r *job.Record) error { r.Paused = false; return nil }); err != nil {
		return err
	}
	if _, err := s.updateMeta(ctx, id, func(m *jobMeta) error {
		m.State, m.Since = api.StateRunning, s.now().UTC()
		return nil
	}); err != nil {
		return err
	}
	s.log.Info("job resumed", "job", id)
	return nil
}

// DeleteJob drains a job and removes it: its record (the autoscaler releases its shards), then,
// once the runtimes let go, its streams, placement and handover entries, tokens, credentials
// (revoked), reject records and metadata.
func (s *Server) DeleteJob(ctx context.Context, id string) error {
	unlock := s.lockJob(id)
	defer unlock()
	rec, m, err := s.record(ctx, id)
	if err != nil {
		return err
	}
	if err := s.buckets.Jobs.Delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("delete job %q: %w", id, err)
	}
	if m.State == api.StateRunning {
		s.awaitDrain(ctx, id)
	}
	if err := store.DeleteJobStreams(ctx, s.js, id); err != nil {
		return err
	}
	for key, p := range s.view.JobPlacement(id) { // left by an autoscaler that is not running
		_ = s.buckets.Placement.Purge(ctx, key, jetstream.LastRevision(p.Revision))
	}
	s.clearHandover(ctx, rec)
	// The leader deletes the assignment of a job it sees gone; this one may be left by an
	// autoscaler that is not running, and a job created again under the id must not inherit it.
	if err := s.buckets.Assign.Delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		s.log.Warn("delete the job's elastic workers' assignment", "job", id, "err", err)
	}
	if s.authz != nil {
		if err := s.pushJobAccount(ctx, rec, accountClosed); err != nil {
			s.log.Error("close the job's NATS account: its credentials still connect", "job", id, "err", err)
		}
	}
	s.dropTokens(ctx, m.Tokens...)
	s.rejects.forget(ctx, id)
	if err := s.state.Delete(ctx, metaKey(id)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("delete metadata of job %q: %w", id, err)
	}
	s.mu.Lock()
	for _, u := range m.Users {
		delete(s.users, u)
	}
	s.mu.Unlock()
	s.log.Info("job deleted", "job", id)
	return nil
}

// awaitDrain waits until no shard of the job is placed and every live runtime has reported since
// without it, or the drain timeout passes.
func (s *Server) awaitDrain(ctx context.Context, id string) {
	deadline := s.now().Add(s.drain)
	var emptySince time.Time
	for s.now().Before(deadline) && ctx.Err() == nil {
		if len(s.view.JobPlacement(id)) > 0 {
			emptySince = time.Time{}
		} else {
			if emptySince.IsZero() {
				emptySince = s.now()
			}
			if !s.serves(id, emptySince) {
				return
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	s.log.Warn("job still placed after the drain timeout; going on", "job", id, "timeout", s.drain)
}

// clearHandover removes the job's handover records: a later placement of the same shard starts at
// epoch 1 again, and an old record of a higher epoch would let its new owner skip the wait for
// the previous one.
func (s *Server) clearHandover(ctx context.Context, rec *job.Record) {
	for _, sh := range rec.Layout.Shards {
		err := s.buckets.Handover.Delete(ctx, wire.PlacementKey(rec.Spec.ID, sh.ID))
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			s.log.Debug("clear handover", "job", rec.Spec.ID, "shard", sh.ID, "err", err)
		}
	}
}
