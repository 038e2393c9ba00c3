package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/dashboard"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/internal/view"
)

// Limits of request bodies.
const (
	MaxSpecBytes = 4 << 20 // a job spec or any other request body
	MaxDepth     = 32      // nesting of objects and arrays in a request body
)

// Errors callers branch on.
var (
	ErrJobExists   = errors.New("job already exists")
	ErrJobNotFound = errors.New("job not found")
	ErrBadState    = errors.New("job is not in a state that allows this")
	ErrQuota       = errors.New("quota exceeded")
	// ErrHighPriority: only an admin may create a job of priority high (job.Spec.Priority).
	ErrHighPriority = errors.New("only an admin token may create a job of priority high")
)

// StateBucket is the gateway's own key-value bucket: job metadata (owner, quota, state, the NATS
// users issued; the record itself is in the jobs bucket only), team tokens, token hashes, reject
// counters, revocations.
const StateBucket = "fanin-gateway"

// Server is the gateway. Create it with New, serve Handler, and Close it.
type Server struct {
	nc          *nats.Conn
	js          jetstream.JetStream
	buckets     *store.Buckets
	state       jetstream.KeyValue
	log         *slog.Logger
	now         func() time.Time
	mux         *http.ServeMux
	routes      []Route
	admin       string          // the admin token; "" leaves the API open
	openWarning sync.Once       // warns that the API is open, when first served
	authz       *auth.Authority // issues and revokes NATS credentials; nil: none
	sys         *nats.Conn      // a system account connection: revocations and auth events; may be nil
	credsTTL    time.Duration
	defQuota    api.Quota
	policy      autoscaler.Policy // what GET /v1/policy shows while none is stored
	drain       time.Duration     // how long pause and delete wait for the runtimes to let go
	govEvery    time.Duration     // the quota governor's tick; 0 disables it
	burst       time.Duration     // the bytes/s quota's burst: how many seconds of quota a job may use at once

	tokens  *tokenCache
	view    *view.View // jobs, placement, runtimes and load reports; the dashboard reads it too
	rejects *rejectStore
	gov     *governor

	mu    sync.Mutex        // guards users
	users map[string]string // NATS user public key -> job, for attributing violations
	dash  *dashboard.Dashboard

	fns        userFunctions // the user functions' store and the engine that checks their modules (functions.go)
	maxModel   int64         // the largest model a job may have, bytes (WithMaxModelBytes)
	jobLocks   sync.Map      // job id -> *sync.Mutex: serializes pause, resume and delete of a job
	ownerLocks sync.Map      // owner -> *sync.Mutex: one job creation at a time per owner (the jobs quota)

	bg   context.Context // background work; cancelled by Close
	stop context.CancelFunc
	wg   sync.WaitGroup // background loops
	subs []*nats.Subscription
}

// Route is one registered route: its method, path pattern and who may call it.
type Route struct {
	Method, Path string
	Access       Access
}

// Access says who may call a route.
type Access int

// Who may call a route.
const (
	Public  Access = iota // anyone
	AnyUser               // any valid token
	Creator               // admin or team tokens: may create jobs
	JobUser               // admin, the job's team, or the job's own token
	Admin                 // the admin token only
)

func (a Access) String() string {
	return [...]string{"public", "any token", "admin or team", "admin, team or job", "admin"}[a]
}

// Option configures a Server.
type Option func(*Server) error

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Server) error { s.log = l; return nil } }

// WithAdminToken requires a bearer token on every /v1 route but the OpenAPI document: tok for
// operators, or a team or job token issued by the gateway. Without it the API is open.
func WithAdminToken(tok string) Option {
	return func(s *Server) error {
		if len(tok) < 16 {
			return errors.New("the admin token must be at least 16 characters")
		}
		s.admin = tok
		return nil
	}
}

// WithAuthority makes the gateway issue per-job NATS credentials at job creation and revoke them
// when the job is deleted. sys, a connection of the system account, pushes revocations to the
// servers and reports authentication failures; without it revocations are not pushed.
func WithAuthority(a *auth.Authority, sys *nats.Conn) Option {
	return func(s *Server) error { s.authz, s.sys = a, sys; return nil }
}

// WithCredentialsTTL makes job credentials expire after d (default: they last until the job is
// deleted).
func WithCredentialsTTL(d time.Duration) Option {
	return func(s *Server) error { s.credsTTL = d; return nil }
}

// DefaultMaxModelBytes is the largest model (parameters, float32) a job may have by default.
const DefaultMaxModelBytes = 4 << 30

// WithMaxModelBytes sets the largest model a job may have, in bytes of float32 parameters (default
// DefaultMaxModelBytes): a job's streams hold several copies of it (parameters, checkpoints,
// gradients of every rank), so the platform caps it.
func WithMaxModelBytes(n int64) Option {
	return func(s *Server) error {
		if n <= 0 {
			return fmt.Errorf("the maximum model size must be > 0 bytes, got %d", n)
		}
		s.maxModel = n
		return nil
	}
}

// WithDefaultQuota sets the quota of jobs created with the admin token (team tokens carry their
// own). Its Jobs field bounds the admin's jobs too.
func WithDefaultQuota(q api.Quota) Option {
	return func(s *Server) error {
		if err := validQuota(q); err != nil {
			return err
		}
		s.defQuota = q
		return nil
	}
}

// WithDefaultPolicy is the policy GET /v1/policy reports while none is stored (what the
// autoscaler was started with).
func WithDefaultPolicy(p autoscaler.Policy) Option {
	return func(s *Server) error { s.policy = p; return p.Validate() }
}

// WithDrainTimeout bounds how long pause and delete wait for the runtimes to stop serving a job
// (default 15s).
func WithDrainTimeout(d time.Duration) Option {
	return func(s *Server) error { s.drain = d; return nil }
}

// WithGovernorInterval sets how often the bytes/s quota is checked (default 1s; 0 disables it,
// and a test calls GovernStep).
func WithGovernorInterval(d time.Duration) Option {
	return func(s *Server) error { s.govEvery = d; return nil }
}

// WithQuotaBurst sets how many seconds of its bytes/s quota a job may use at once (default
// QuotaBurst).
func WithQuotaBurst(d time.Duration) Option {
	return func(s *Server) error {
		if d <= 0 {
			return errors.New("quota burst must be > 0")
		}
		s.burst = d
		return nil
	}
}

// New opens the shared buckets and the gateway's own state and starts its background work (the
// view of the shared state, which its dashboard shares; reject counting; the quota governor). Options: WithLogger,
// WithAdminToken, WithAuthority, WithCredentialsTTL, WithDefaultQuota, WithDefaultPolicy,
// WithDrainTimeout, WithGovernorInterval, WithQuotaBurst.
func New(ctx context.Context, nc *nats.Conn, opts ...Option) (_ *Server, err error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s := &Server{nc: nc, js: js, log: slog.Default(), now: time.Now, mux: http.NewServeMux(),
		policy: autoscaler.DefaultPolicy(), drain: 15 * time.Second, govEvery: time.Second, burst: QuotaBurst, users: map[string]string{},
		maxModel: DefaultMaxModelBytes}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	s.log = s.log.With("component", "gateway")
	if s.buckets, err = store.OpenBuckets(ctx, js); err != nil {
		return nil, err
	}
	if s.state, err = store.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket: StateBucket, Description: "fanin gateway: job metadata, tokens, reject counts",
		Storage: jetstream.FileStorage, History: 1, Replicas: store.StateReplicas(js.Conn()),
	}); err != nil {
		return nil, err
	}
	bg, stop := context.WithCancel(context.Background())
	s.bg, s.stop = bg, stop
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.tokens, err = newTokenCache(bg, js, s.state, &s.wg); err != nil {
		return nil, err
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	s.view, err = view.Open(vctx, nc, view.WithBuckets(s.buckets), view.WithClock(s.now), view.WithLogger(s.log))
	cancel()
	if err != nil {
		return nil, err
	}
	if s.rejects, err = newRejectStore(ctx, s); err != nil {
		return nil, err
	}
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.rejects.count(bg) }()
	if err := s.loadUsers(ctx); err != nil {
		return nil, err
	}
	if s.sys != nil && s.authz != nil {
		if err := s.watchAuthErrors(); err != nil {
			return nil, err
		}
		s.pushJobAccounts(ctx)
	}
	s.gov = newGovernor(s)
	if s.govEvery > 0 {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.gov.run(bg, s.govEvery) }()
	}
	if s.dash, err = dashboard.New(ctx, nc, dashboard.WithView(s.view)); err != nil {
		return nil, err
	}
	s.register()
	return s, nil
}

// Close stops the gateway's background work and waits for it. The connection stays open.
func (s *Server) Close() {
	if s.dash != nil {
		s.dash.Close()
	}
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	if s.stop != nil {
		s.stop()
	}
	s.wg.Wait()
	if s.view != nil {
		s.view.Close()
	}
}

// Handler is the gateway's HTTP handler. Without an admin token it warns, once, that the API it
// serves is open (a gateway used as a library, without HTTP, does not).
func (s *Server) Handler() http.Handler {
	if s.admin == "" {
		s.openWarning.Do(func() {
			s.log.Warn("the HTTP API runs without authentication: give it an admin token (--token, FANIN_TOKEN)")
		})
	}
	return s.mux
}

// Routes lists the registered routes (the OpenAPI document describes exactly these).
func (s *Server) Routes() []Route { return append([]Route(nil), s.routes...) }

func (s *Server) register() {
	for _, r := range []struct {
		pattern string
		access  Access
		h       http.HandlerFunc
	}{
		{"GET /healthz", Public, s.healthz},
		{"GET /v1/openapi.json", Public, s.openapi},
		{"GET /v1/whoami", AnyUser, s.whoami},
		{"POST /v1/jobs", Creator, s.createJob},
		{"GET /v1/jobs", AnyUser, s.listJobs},
		{"GET /v1/jobs/{id}", JobUser, s.getJob},
		{"DELETE /v1/jobs/{id}", JobUser, s.deleteJob},
		{"POST /v1/jobs/{id}/pause", JobUser, s.pauseJob},
		{"POST /v1/jobs/{id}/resume", JobUser, s.resumeJob},
		{"GET /v1/jobs/{id}/shards", JobUser, s.jobShards},
		{"GET /v1/jobs/{id}/workers", JobUser, s.jobWorkers},
		{"PUT /v1/jobs/{id}/workers", JobUser, s.setJobWorkers},
		{"GET /v1/jobs/{id}/rejects", JobUser, s.jobRejects},
		{"POST /v1/jobs/{id}/credentials", JobUser, s.jobCredentials},
		{"GET /v1/placement", Admin, s.listPlacement},
		{"GET /v1/runtimes", Admin, s.listRuntimes},
		{"GET /v1/runtimes/{id}", Admin, s.getRuntime},
		{"GET /v1/metrics/targets", Admin, s.metricsTargets},
		{"GET /v1/policy", Admin, s.getPolicy},
		{"PUT /v1/policy", Admin, s.putPolicy},
		{"GET /v1/policy/history", Admin, s.policyHistory},
		{"GET /v1/decisions", Admin, s.listDecisions},
		{"GET /v1/functions", AnyUser, s.listFunctions},
		{"POST /v1/functions", Creator, s.uploadFunction},
		{"DELETE /v1/functions/{owner}/{function}", Creator, s.deleteFunction},
		{"GET /v1/rejects", Admin, s.rejectTotals},
		{"POST /v1/tokens", Admin, s.createTeam},
		{"GET /v1/tokens", Admin, s.listTeams},
		{"DELETE /v1/tokens/{id}", Admin, s.deleteTeam},
	} {
		method, path, _ := strings.Cut(r.pattern, " ")
		s.routes = append(s.routes, Route{Method: method, Path: path, Access: r.access})
		s.mux.Handle(r.pattern, s.guard(r.access, r.h))
	}
	// Read-only views outside the /v1 API: Prometheus metrics and the web dashboard (a page, its
	// files, and the JSON state it polls). They are public; the dashboard's state shows anyone
	// only the public view of the jobs (dashboardState), and their details to a token that
	// reaches them.
	s.mux.Handle("GET /metrics", metrics.Handler())
	if s.dash != nil {
		s.mux.Handle(dashboard.RootPattern, s.dash)
		s.mux.Handle(dashboard.PrefixPattern, s.dash)
		s.mux.HandleFunc(dashboard.StatePattern, s.dashboardState)
	}
	// Every error is a problem document, an unknown path or a wrong method included.
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		var allowed []string
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, pattern := s.mux.Handler(probe); pattern != "/" && pattern != "" {
				allowed = append(allowed, m)
			}
		}
		if len(allowed) > 0 {
			w.Header().Set("Allow", strings.Join(allowed, ", "))
			s.problem(w, http.StatusMethodNotAllowed, codeMethodNotAllowed, fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allowed, ", ")))
			return
		}
		s.problem(w, http.StatusNotFound, codeNotFound, fmt.Sprintf("no route %s %s; see GET /v1/openapi.json", r.Method, r.URL.Path))
	})
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if !s.nc.IsConnected() {
		s.problem(w, http.StatusServiceUnavailable, "nats_disconnected", "the gateway is not connected to NATS")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if _, err := s.js.AccountInfo(ctx); err != nil {
		s.problem(w, http.StatusServiceUnavailable, codeJetStreamUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) whoami(w http.ResponseWriter, r *http.Request) {
	g := grantOf(r)
	writeJSON(w, http.StatusOK, api.Whoami{Kind: string(g.Kind), Team: g.Team, Job: g.Job})
}
