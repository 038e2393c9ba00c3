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

// jobMeta is what the gateway keeps about a job besides its record in the jobs bucket.
type jobMeta struct {
	ID      string    `json:"id"`
	Owner   string    `json:"owner"` // "admin" or a team id
	Quota   api.Quota `json:"quota"`
	State   string    `json:"state"`
	Since   time.Time `json:"since"` // when the state last changed
	Created time.Time `json:"created"`
	// Record is kept here while the job is paused or throttled: it is then out of the jobs bucket,
	// so that the autoscaler releases its shards.
	Record *job.Record `json:"record,omitempty"`
	Users  []string    `json:"users,omitempty"`  // NATS users issued for the job (public keys)
	Tokens []string    `json:"tokens,omitempty"` // hashes of the job's API tokens
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

func (s *Server) metaRev(ctx context.Context, jobID string) (*jobMeta, uint64, error) {
	e, err := s.state.Get(ctx, metaKey(jobID))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return nil, 0, fmt.Errorf("job %q: %w", jobID, ErrJobNotFound)
	}
	if err != nil {
		return nil, 0, err
	}
	var m jobMeta
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		return nil, 0, fmt.Errorf("decode metadata of job %q: %w", jobID, err)
	}
	return &m, e.Revision(), nil
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
