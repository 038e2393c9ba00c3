package gateway

import (
	"context"
	"errors"
	"fmt"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/job"
)

// The NATS accounts and credentials of jobs' workers: internal/auth makes them, the gateway pushes
// the accounts to the NATS servers.

// jobAccount is the NATS account of a job's workers (auth.JobAccount).
func jobAccount(rec *job.Record) auth.JobAccount {
	return auth.JobAccount{Job: rec.Spec.ID, Created: rec.Created, Upload: rec.Spec.Init.Kind == "upload", Ranks: rec.Spec.Ranks}
}

// The forms of a job's account that the gateway pushes.
type accountForm int

const (
	accountOpen      accountForm = iota // the job's imports, ingest included
	accountThrottled                    // over its bytes/s quota: no gradient or upload imports
	accountClosed                       // deleted: nothing imported, every user revoked
)

// pushJobAccount sends the job's account, in the given form, to the NATS servers.
func (s *Server) pushJobAccount(ctx context.Context, rec *job.Record, form accountForm) error {
	if s.sys == nil {
		return errors.New("the gateway has no system account connection: it cannot create or close the NATS accounts of jobs")
	}
	var accJWT string
	var err error
	acc := jobAccount(rec)
	switch form {
	case accountClosed:
		accJWT, err = s.authz.ClosedJobAccountJWT(acc, s.now())
	case accountThrottled:
		acc.NoIngest = true
		accJWT, err = s.authz.JobAccountJWT(acc)
	default:
		accJWT, err = s.authz.JobAccountJWT(acc)
	}
	if err != nil {
		return fmt.Errorf("account of job %q: %w", rec.Spec.ID, err)
	}
	if err := auth.PushAccountJWT(ctx, s.sys, accJWT); err != nil {
		return fmt.Errorf("account of job %q: %w", rec.Spec.ID, err)
	}
	return nil
}

// errNoAuthority: the gateway runs without a NATS authority (WithAuthority).
var errNoAuthority = errors.New("this gateway does not issue NATS credentials (it runs without a NATS authority)")

// issueCredentials mints a new set of NATS credentials for a job's workers and records their user:
// violations are attributed to the job, and deleting the job revokes them.
func (s *Server) issueCredentials(ctx context.Context, id string) (*api.Credentials, error) {
	if s.authz == nil {
		return nil, errNoAuthority
	}
	rec, _, err := s.record(ctx, id)
	if err != nil {
		return nil, err
	}
	creds, err := s.mintCredentials(rec)
	if err != nil {
		return nil, fmt.Errorf("mint credentials: %w", err)
	}
	if _, err := s.updateMeta(ctx, id, func(m *jobMeta) error { m.Users = append(m.Users, creds.User); return nil }); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.users[creds.User] = id
	s.mu.Unlock()
	s.log.Info("job credentials issued", "job", id, "user", creds.User)
	return creds, nil
}

func (s *Server) mintCredentials(rec *job.Record) (*api.Credentials, error) {
	c, err := s.authz.JobCredentials(jobAccount(rec), s.credsTTL)
	if err != nil {
		return nil, err
	}
	out := &api.Credentials{User: c.User, JWT: c.JWT, Seed: c.Seed, Creds: c.File(), InboxPrefix: c.InboxPrefix}
	if !c.Expires.IsZero() {
		out.Expires = &c.Expires
	}
	return out, nil
}

// pushJobAccounts pushes the account of every job (open, or closed while it is being deleted): a
// NATS server whose account resolver lost them (a new cluster node, a wiped directory) learns them
// again, and a gateway of an older version that kept job users in the fanin account hands over.
func (s *Server) pushJobAccounts(ctx context.Context) {
	ms, err := s.metas(ctx)
	if err != nil {
		s.log.Warn("push job accounts", "err", err)
		return
	}
	for _, m := range ms {
		rec, _, err := s.record(ctx, m.ID)
		if err != nil {
			continue
		}
		form := accountOpen
		if m.State == api.StateThrottled {
			form = accountThrottled
		}
		if err := s.pushJobAccount(ctx, rec, form); err != nil {
			s.log.Warn("push job account", "job", m.ID, "err", err)
		}
	}
}
