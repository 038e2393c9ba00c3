package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
)

// Keys of StateBucket.
func metaKey(jobID string) string   { return "job." + jobID }
func teamKey(id string) string      { return "team." + id }
func tokenKey(hash string) string   { return "token." + hash }
func countsKey(jobID string) string { return "rejects." + jobID }
func revokedKey(user string) string { return "revoked." + user }

// jobMeta is what the gateway keeps about a job besides its record. The record lives in the jobs
// bucket alone, paused or not: runtimes, autoscaler and workers read it there.
type jobMeta struct {
	ID      string    `json:"id"`
	Owner   string    `json:"owner"` // "admin" or a team id
	Quota   api.Quota `json:"quota"`
	State   string    `json:"state"`
	Since   time.Time `json:"since"` // when the state last changed
	Created time.Time `json:"created"`
	Users   []string  `json:"users,omitempty"`  // NATS users issued for the job (public keys)
	Tokens  []string  `json:"tokens,omitempty"` // hashes of the job's API tokens
}

// storedMeta is a job's metadata as an older gateway may have stored it: with a copy of the record
// of a paused or throttled job. The oldest took the record out of the jobs bucket meanwhile; later
// ones left it there, marked paused, and kept both. metaRev moves such a copy to the jobs bucket.
type storedMeta struct {
	jobMeta
	Record *job.Record `json:"record,omitempty"`
}

// tokenGrant is the value of a token key: what the token reaches.
type tokenGrant struct {
	Kind auth.Kind `json:"kind"`
	Team string    `json:"team,omitempty"`
	Job  string    `json:"job,omitempty"`
}

// teamRecord is a team token's record.
type teamRecord struct {
	api.Team
	Hash string `json:"hash"`
}

func (s *Server) meta(ctx context.Context, jobID string) (*jobMeta, error) {
	m, _, err := s.metaRev(ctx, jobID)
	return m, err
}

// metaRev reads a job's metadata and its revision. Metadata that still carries a record (an older
// gateway's, storedMeta) is migrated first: a gateway upgraded in place loses no paused job.
func (s *Server) metaRev(ctx context.Context, jobID string) (*jobMeta, uint64, error) {
	for range 10 {
		e, err := s.state.Get(ctx, metaKey(jobID))
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
			return nil, 0, fmt.Errorf("job %q: %w", jobID, ErrJobNotFound)
		}
		if err != nil {
			return nil, 0, err
		}
		var m storedMeta
		if err := json.Unmarshal(e.Value(), &m); err != nil {
			return nil, 0, fmt.Errorf("decode metadata of job %q: %w", jobID, err)
		}
		if m.Record == nil {
			return &m.jobMeta, e.Revision(), nil
		}
		rev, err := s.adoptRecord(ctx, &m, e.Revision())
		if err == nil {
			return &m.jobMeta, rev, nil
		}
		if !isWrongSeq(err) {
			return nil, 0, err
		}
		// Changed meanwhile (another replica migrated it, or changed it): read it again.
	}
	return nil, 0, fmt.Errorf("job %q: metadata changed concurrently too often", jobID)
}

// adoptRecord moves the record kept in a job's metadata (storedMeta, at revision rev) to the jobs
// bucket and stores the metadata without it. A record the jobs bucket holds already stands (the
// gateway that paused the job kept both); one it lacks (taken out by the oldest gateways) is put
// back, marked paused unless the job is running.
func (s *Server) adoptRecord(ctx context.Context, m *storedMeta, rev uint64) (uint64, error) {
	rec := *m.Record
	rec.Paused = m.State != api.StateRunning
	val, _ := json.Marshal(rec)
	jrev, err := s.buckets.Jobs.Create(ctx, m.ID, val)
	switch {
	case err == nil:
		s.awaitView(ctx, jrev)
		s.log.Info("job record moved from the gateway's state to the jobs bucket", "job", m.ID, "state", m.State)
	case errors.Is(err, jetstream.ErrKeyExists):
	default:
		return 0, fmt.Errorf("move the record of job %q to the jobs bucket: %w", m.ID, err)
	}
	val, _ = json.Marshal(m.jobMeta)
	return s.state.Update(ctx, metaKey(m.ID), val, rev)
}

// updateMeta changes a job's metadata with compare-and-set, retrying on a concurrent change.
func (s *Server) updateMeta(ctx context.Context, jobID string, change func(*jobMeta) error) (*jobMeta, error) {
	for range 10 {
		m, rev, err := s.metaRev(ctx, jobID)
		if err != nil {
			return nil, err
		}
		if err := change(m); err != nil {
			return nil, err
		}
		val, _ := json.Marshal(m)
		if _, err := s.state.Update(ctx, metaKey(jobID), val, rev); err == nil {
			return m, nil
		} else if !isWrongSeq(err) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("job %q: metadata changed concurrently too often", jobID)
}

func isWrongSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// metas lists the metadata of every job.
func (s *Server) metas(ctx context.Context) ([]*jobMeta, error) {
	lister, err := s.state.ListKeysFiltered(ctx, "job.*")
	if err != nil {
		return nil, err
	}
	var out []*jobMeta
	for key := range lister.Keys() {
		m, err := s.meta(ctx, key[len("job."):])
		if errors.Is(err, ErrJobNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// loadUsers indexes the NATS users issued so far by job, to attribute violations.
func (s *Server) loadUsers(ctx context.Context) error {
	ms, err := s.metas(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range ms {
		for _, u := range m.Users {
			s.users[u] = m.ID
		}
	}
	return nil
}

func (s *Server) jobOfUser(user string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.users[user]
}

// tokenCache mirrors the token keys of StateBucket: every gateway replica sees every token.
type tokenCache struct {
	mu     sync.RWMutex // guards grants
	grants map[string]grant
}

func newTokenCache(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, wg *sync.WaitGroup) (*tokenCache, error) {
	c := &tokenCache{grants: map[string]grant{}}
	ready, err := store.Follow(ctx, js, kv, "token.*", wg, c.apply)
	if err != nil {
		return nil, fmt.Errorf("watch tokens: %w", err)
	}
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		return nil, errors.New("watch tokens: no initial values in 10s")
	}
	return c, nil
}

func (c *tokenCache) apply(e jetstream.KeyValueEntry) {
	hash := e.Key()[len("token."):]
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(c.grants, hash)
		return
	}
	var t tokenGrant
	if json.Unmarshal(e.Value(), &t) == nil {
		c.grants[hash] = grant(t)
	}
}

func (c *tokenCache) lookup(hash string) (grant, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	g, ok := c.grants[hash]
	return g, ok
}

// set and drop change this replica's view at once, before the watch reports the change.
func (c *tokenCache) set(hash string, g grant) {
	c.mu.Lock()
	c.grants[hash] = g
	c.mu.Unlock()
}

func (c *tokenCache) drop(hashes ...string) {
	c.mu.Lock()
	for _, h := range hashes {
		delete(c.grants, h)
	}
	c.mu.Unlock()
}

// issueToken creates a token of kind for team or job, stores its hash and returns it.
func (s *Server) issueToken(ctx context.Context, g grant) (tok, hash string, err error) {
	if tok, err = auth.NewToken(g.Kind); err != nil {
		return "", "", err
	}
	hash = auth.HashToken(tok)
	val, _ := json.Marshal(tokenGrant(g))
	if _, err := s.state.Create(ctx, tokenKey(hash), val); err != nil {
		return "", "", fmt.Errorf("store token: %w", err)
	}
	s.tokens.set(hash, g)
	return tok, hash, nil
}

func (s *Server) dropTokens(ctx context.Context, hashes ...string) {
	s.tokens.drop(hashes...)
	for _, h := range hashes {
		if err := s.state.Delete(ctx, tokenKey(h)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			s.log.Warn("delete token", "err", err)
		}
	}
}

func validQuota(q api.Quota) error {
	if q.Jobs < 0 || q.Shards < 0 || q.BytesPerSecond < 0 || q.StorageBytes < 0 {
		return fmt.Errorf("quota: jobs, shards, bytes_per_second and storage_bytes must be >= 0 (0: no limit), got %+v", q)
	}
	return nil
}
