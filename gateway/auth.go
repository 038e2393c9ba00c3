package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/wire"
)

// Who may do what through the API. Every route is registered with an Access (Server.Routes,
// checked against openapi.json): Public routes need nothing; the others need a bearer token, which
// authenticate turns into a grant: the admin token, a team token (its team's jobs) or a job token
// (its one job). guard checks the grant against the route's Access, and for JobUser routes that the
// grant reaches the job in the path (canReach). A refusal is a 401 or 403 problem, recorded under
// no job (NoJob): only a caller who may see a job's records can add to them.
//
// NATS is the other door, with its own credentials: see internal/auth and docs/SECURITY.md.

// grant is what a request's token allows.
type grant struct {
	Kind auth.Kind
	Team string // team tokens: the team's id
	Job  string // job tokens: the job
}

const kindOpen auth.Kind = "open" // the API runs without authentication: everything is allowed

func (g grant) admin() bool { return g.Kind == auth.KindAdmin || g.Kind == kindOpen }

// owner is the name the grant's jobs are owned under.
func (g grant) owner() string {
	if g.Kind == auth.KindTeam {
		return g.Team
	}
	return "admin"
}

type grantKey struct{}

func grantOf(r *http.Request) grant {
	g, _ := r.Context().Value(grantKey{}).(grant)
	return g
}

// authenticate reads the bearer token of a request.
func (s *Server) authenticate(r *http.Request) (grant, string) {
	if s.admin == "" {
		return grant{Kind: kindOpen}, ""
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		return grant{}, "no credentials: send the header Authorization: Bearer <token>"
	}
	scheme, tok, _ := strings.Cut(h, " ")
	tok = strings.TrimSpace(tok)
	if !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return grant{}, "the Authorization header is not a bearer token: send Authorization: Bearer <token>"
	}
	if auth.Equal(tok, s.admin) {
		return grant{Kind: auth.KindAdmin}, ""
	}
	if g, ok := s.tokens.lookup(auth.HashToken(tok)); ok {
		return g, ""
	}
	return grant{}, "the token is not valid: unknown, deleted, or its job was deleted"
}

// guard authenticates and authorizes a request before its handler runs.
func (s *Server) guard(a Access, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a == Public {
			h(w, r)
			return
		}
		jobID := ""
		if a == JobUser {
			jobID = r.PathValue("id")
		}
		g, why := s.authenticate(r)
		if why != "" {
			s.unauthorized(w, fmt.Sprintf("%s %s: %s", r.Method, r.URL.Path, why))
			return
		}
		if a == JobUser && !validJobID(jobID) {
			s.reject(w, wire.ReasonBadParameter, fmt.Sprintf("%q is not a job id: 1-63 characters of a-z, 0-9 and '-'", jobID), NoJob)
			return
		}
		var denied string
		switch {
		case a == Admin && !g.admin():
			denied = "only the admin token may"
		case a == Creator && !g.admin() && g.Kind != auth.KindTeam:
			denied = "only the admin token or a team token may"
		case a == JobUser && !s.canReach(r.Context(), g, jobID):
			denied = fmt.Sprintf("this %s token does not reach job %q; it may not", g.Kind, jobID)
		}
		if denied != "" {
			s.reject(w, wire.ReasonForbidden, fmt.Sprintf("%s %s %s", denied, r.Method, r.URL.Path), NoJob) // as above
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), grantKey{}, g)))
	})
}

func (s *Server) canReach(ctx context.Context, g grant, jobID string) bool {
	switch g.Kind {
	case auth.KindAdmin, kindOpen:
		return true
	case auth.KindJob:
		return g.Job == jobID
	case auth.KindTeam:
		m, err := s.meta(ctx, jobID)
		return err == nil && m.Owner == g.Team
	}
	return false
}

// lockOwner serializes job creations per owner, so that the jobs quota cannot be raced past.
func (s *Server) lockOwner(owner string) func() {
	mu, _ := s.ownerLocks.LoadOrStore(owner, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	return mu.(*sync.Mutex).Unlock
}

// unauthorized answers a request without valid credentials: a 401 problem, not recorded among
// the rejections (under no job either): whoever sent it proved nothing, and anyone could flood
// out the real rejections with them. fanin_http_requests_total{code="401"} counts them.
func (s *Server) unauthorized(w http.ResponseWriter, detail string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="fanin"`)
	s.problem(w, http.StatusUnauthorized, string(wire.ReasonUnauthorized), detail)
}

// dashboardState serves the dashboard's JSON as the caller may see it: without a token, the
// public view (dashboard.State.Public: ids, progress, counts); with the admin token (or an open
// API), everything; with a team or job token, the jobs it reaches, in full.
func (s *Server) dashboardState(w http.ResponseWriter, r *http.Request) {
	st := s.dash.Snapshot()
	switch {
	case s.admin == "":
	case r.Header.Get("Authorization") == "":
		st = st.Public()
	default:
		g, why := s.authenticate(r)
		if why != "" {
			s.unauthorized(w, "GET /dashboard/api/state: "+why+" (or send no Authorization for the public view)")
			return
		}
		if !g.admin() {
			reach := map[string]bool{}
			st = st.Only(func(id string) bool {
				ok, seen := reach[id]
				if !seen {
					ok = s.canReach(r.Context(), g, id)
					reach[id] = ok
				}
				return ok
			})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(st)
}
