package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"unicode"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/wire"
)

// ErrTeamNotFound is returned for an unknown team token id.
var ErrTeamNotFound = errors.New("team token not found")

// CreateTeam issues a team token: it creates jobs (owned by the team) within quota, and reaches
// those jobs. The token is returned once; the gateway keeps only its hash.
func (s *Server) CreateTeam(ctx context.Context, req api.TeamRequest) (*api.TeamCreated, error) {
	if err := validQuota(req.Quota); err != nil {
		return nil, err
	}
	name := strings.TrimSpace(req.Name)
	if name == "" || len(name) > 100 {
		return nil, errors.New("name: 1..100 characters are required")
	}
	if strings.ContainsFunc(name, unicode.IsControl) {
		return nil, fmt.Errorf("name %q: control characters are not allowed", name)
	}
	id := "t-" + uuid.NewString()[:8]
	tok, hash, err := s.issueToken(ctx, grant{Kind: auth.KindTeam, Team: id})
	if err != nil {
		return nil, err
	}
	t := teamRecord{Team: api.Team{ID: id, Name: name, Quota: req.Quota, Created: s.now().UTC(), Hint: auth.Redact(tok)}, Hash: hash}
	val, _ := json.Marshal(t)
	if _, err := s.state.Create(ctx, teamKey(id), val); err != nil {
		s.dropTokens(ctx, hash)
		return nil, fmt.Errorf("store team token: %w", err)
	}
	s.log.Info("team token created", "team", id, "name", name)
	return &api.TeamCreated{Team: t.Team, Token: tok}, nil
}

func (s *Server) team(ctx context.Context, id string) (*teamRecord, error) {
	e, err := s.state.Get(ctx, teamKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return nil, fmt.Errorf("team %q: %w", id, ErrTeamNotFound)
	}
	if err != nil {
		return nil, err
	}
	var t teamRecord
	if err := json.Unmarshal(e.Value(), &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Teams lists the team tokens with the number of jobs each owns.
func (s *Server) Teams(ctx context.Context) ([]api.Team, error) {
	out := []api.Team{}
	lister, err := s.state.ListKeysFiltered(ctx, "team.*")
	if err != nil {
		return nil, err
	}
	owned := map[string]int{}
	ms, err := s.metas(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		owned[m.Owner]++
	}
	for k := range lister.Keys() {
		t, err := s.team(ctx, k[len("team."):])
		if err != nil {
			continue
		}
		t.Jobs = owned[t.ID]
		out = append(out, t.Team)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// DeleteTeam revokes a team token. Its jobs stay (the admin and their job tokens reach them).
func (s *Server) DeleteTeam(ctx context.Context, id string) error {
	t, err := s.team(ctx, id)
	if err != nil {
		return err
	}
	s.dropTokens(ctx, t.Hash)
	if err := s.state.Delete(ctx, teamKey(id)); err != nil {
		return err
	}
	s.log.Info("team token deleted", "team", id)
	return nil
}

func (s *Server) createTeam(w http.ResponseWriter, r *http.Request) {
	var req api.TeamRequest
	if !s.readJSONRequest(w, r, &req, NoJob, "token request", "") {
		return
	}
	t, err := s.CreateTeam(r.Context(), req)
	if err != nil {
		s.reject(w, wire.ReasonBadParameter, "token request: "+err.Error(), NoJob)
		return
	}
	writeJSON(w, http.StatusCreated, t)
}

func (s *Server) listTeams(w http.ResponseWriter, r *http.Request) {
	ts, err := s.Teams(r.Context())
	if err != nil {
		s.internal(w, "list tokens", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": ts})
}

func (s *Server) deleteTeam(w http.ResponseWriter, r *http.Request) {
	err := s.DeleteTeam(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, ErrTeamNotFound):
		s.problem(w, http.StatusNotFound, codeTeamNotFound, err.Error())
	case err != nil:
		s.internal(w, "delete token", err)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}
