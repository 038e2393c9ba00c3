package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/runtime"
)

// Config of a stack.
type Config struct {
	DataDir  string // JetStream storage
	MaxStore int64  // JetStream's file storage cap (0: the server's default, from the free disk)
	NATSPort int    // -1: any free port
	HTTPAddr string // gateway listen address; "" disables HTTP, "127.0.0.1:0" picks a port
	// HTTPLimits are the gateway's HTTP timeouts and connection cap (zero: gateway.DefaultHTTPLimits).
	HTTPLimits gateway.HTTPLimits
	Runtimes   int // runtimes the pool starts with, and its minimum (default 3)
	// MaxRuntimes lets the autoscaler grow the pool up to this size (default Runtimes: a fixed pool).
	MaxRuntimes int
	// Policy overrides the autoscaler's policy (its min and max then come from it, not from above).
	Policy   *autoscaler.Policy
	Interval time.Duration // autoscaler decision interval (default 1s)
	// NoAutoscaler starts no control loop: the caller writes the placement (tests of migration).
	NoAutoscaler bool
	Cores        int // cores per runtime (default GOMAXPROCS)
	Logger       *slog.Logger
	NATSLogs     bool

	// Telemetry of the runtimes and the autoscaler: Tracing defaults to telemetry.Default() (the
	// process's, from OTEL_* variables; none in tests) and Metrics to metrics.Default(). NoTelemetry
	// turns both off (the overhead benchmark's baseline).
	Tracing     *telemetry.Provider
	Metrics     *metrics.Metrics
	NoTelemetry bool

	// Auth turns security on (`fanin dev` does): the NATS server in operator mode, every component
	// with its own credentials, per-job credentials issued at job creation, and the HTTP API behind
	// the admin token (Stack.AdminToken). AuthDir keeps the keys and the admin token across
	// restarts (it must, when DataDir does: JetStream stores per account); "" keeps them in memory.
	Auth    bool
	AuthDir string
	// GatewayOptions are appended to the stack's own (quotas, drain timeout, ...).
	GatewayOptions []gateway.Option
}

// Stack is a running fanin.
type Stack struct {
	NATS       *server.Server
	URL        string // NATS client URL
	HTTPURL    string // gateway base URL, "" without HTTP
	Gateway    *gateway.Server
	Autoscaler *autoscaler.Controller
	// Authority and AdminToken are set when Config.Auth is: the keys that mint credentials, and
	// the token of the HTTP API.
	Authority  *auth.Authority
	AdminToken string

	log     *slog.Logger
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	http    *http.Server
	cores   int
	tracing *telemetry.Provider // nil: off
	metrics *metrics.Metrics    // nil: off

	mu    sync.Mutex // guards conns, pool, next
	conns []*nats.Conn
	pool  []*poolRuntime // in start order; removed ones stay with done closed
	next  int
}

// poolRuntime is one in-process runtime of the pool.
type poolRuntime struct {
	rt       *runtime.Runtime
	stop     context.CancelFunc
	done     chan struct{}
	removing bool
}

// Start brings a stack up. Close brings it down.
func Start(ctx context.Context, cfg Config) (_ *Stack, err error) {
	if cfg.Runtimes == 0 {
		cfg.Runtimes = 3
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var authority *auth.Authority
	ecfg := embed.Config{Port: cfg.NATSPort, StoreDir: cfg.DataDir, MaxStore: cfg.MaxStore, Logs: cfg.NATSLogs}
	var gw atomic.Pointer[gateway.Server] // set once the gateway is up; violations before it go unrecorded
	if cfg.Auth {
		if cfg.AuthDir != "" {
			authority, err = auth.Load(cfg.AuthDir)
		} else {
			authority, err = auth.New()
		}
		if err != nil {
			return nil, err
		}
		ecfg.Configure = authority.ConfigureServer
		ecfg.OnViolation = func(v embed.Violation) {
			if g := gw.Load(); g != nil {
				g.RecordViolation(v)
			}
		}
	}
	ns, err := embed.Start(ecfg)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s := &Stack{NATS: ns, URL: ns.ClientURL(), log: cfg.Logger, cancel: cancel, Authority: authority}
	if !cfg.NoTelemetry {
		s.tracing, s.metrics = cfg.Tracing, cfg.Metrics
		if s.tracing == nil {
			s.tracing = telemetry.Default()
		}
		if s.metrics == nil {
			s.metrics = metrics.Default()
		}
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()

	gwConn, err := s.connect("fanin-gateway")
	if err != nil {
		return nil, err
	}
	pol := autoscaler.DefaultPolicy()
	if cfg.Policy != nil {
		pol = *cfg.Policy
	} else {
		pol.MinRuntimes, pol.MaxRuntimes = cfg.Runtimes, max(cfg.Runtimes, cfg.MaxRuntimes)
	}
	gwOpts := []gateway.Option{gateway.WithLogger(cfg.Logger), gateway.WithDefaultPolicy(pol)}
	if authority != nil {
		sys, err := s.connectAs("fanin-gateway-system", authority.SystemCredentials)
		if err != nil {
			return nil, err
		}
		s.AdminToken = authority.AdminToken()
		gwOpts = append(gwOpts, gateway.WithAdminToken(s.AdminToken), gateway.WithAuthority(authority, sys))
	}
	if s.Gateway, err = gateway.New(ctx, gwConn, append(gwOpts, cfg.GatewayOptions...)...); err != nil {
		return nil, err
	}
	gw.Store(s.Gateway)
	if cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return nil, fmt.Errorf("gateway listen on %s: %w", cfg.HTTPAddr, err)
		}
		s.HTTPURL = "http://" + ln.Addr().String()
		s.http, ln = gateway.HTTPServer(s.metrics.HTTP(telemetry.HTTPHandler(s.Gateway.Handler(), s.tracing)), ln, cfg.HTTPLimits)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("gateway HTTP", "err", err)
			}
		}()
	}

	asConn, err := s.connect("fanin-autoscaler")
	if err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	s.cores = cfg.Cores
	if s.Autoscaler, err = autoscaler.NewController(asConn, (*inProcessDriver)(s),
		autoscaler.WithControllerTelemetry(s.tracing, s.metrics), autoscaler.WithControllerLogger(cfg.Logger), autoscaler.WithPolicy(pol), autoscaler.WithInterval(cfg.Interval)); err != nil {
		return nil, err
	}
	if !cfg.NoAutoscaler {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.Autoscaler.Run(runCtx); err != nil {
				s.log.Error("autoscaler", "err", err)
			}
		}()
	}

	for range pol.MinRuntimes {
		if _, err := s.AddRuntime(cfg.Cores); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// AddRuntime starts one more runtime in the pool (ids rt-0, rt-1, ...).
func (s *Stack) AddRuntime(cores int) (*runtime.Runtime, error) {
	s.mu.Lock()
	id := fmt.Sprintf("rt-%d", s.next)
	s.next++
	s.mu.Unlock()
	nc, err := s.connect("fanin-runtime-" + id)
	if err != nil {
		return nil, err
	}
	opts := []runtime.Option{runtime.WithID(id), runtime.WithLogger(s.log), runtime.WithTracing(s.tracing), runtime.WithMetrics(s.metrics)}
	if cores > 0 {
		opts = append(opts, runtime.WithCores(cores))
	}
	rt, err := runtime.New(nc, opts...)
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	pr := &poolRuntime{rt: rt, stop: stop, done: make(chan struct{})}
	s.mu.Lock()
	s.pool = append(s.pool, pr)
	s.mu.Unlock()
	go func() {
		defer close(pr.done)
		if err := rt.Run(ctx); err != nil {
			s.log.Error("runtime", "id", id, "err", err)
		}
	}()
	return rt, nil
}

// Runtimes lists the runtimes of the pool that are running, in start order.
func (s *Stack) Runtimes() []*runtime.Runtime {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*runtime.Runtime
	for _, p := range s.pool {
		select {
		case <-p.done:
		default:
			out = append(out, p.rt)
		}
	}
	return out
}

// AllRuntimes lists every runtime the stack ever started, stopped ones included (for counters).
func (s *Stack) AllRuntimes() []*runtime.Runtime {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*runtime.Runtime, len(s.pool))
	for i, p := range s.pool {
		out[i] = p.rt
	}
	return out
}

// StopRuntime stops the runtime with the given id gracefully and waits for it: its shards
// checkpoint and are placed elsewhere.
func (s *Stack) StopRuntime(id string) {
	s.mu.Lock()
	var pr *poolRuntime
	for _, p := range s.pool {
		if p.rt.ID() == id {
			pr = p
			p.removing = true
		}
	}
	s.mu.Unlock()
	if pr != nil {
		pr.stop()
		<-pr.done
	}
}

// inProcessDriver is the autoscaler's pool driver for a stack: runtimes are goroutines.
type inProcessDriver Stack

func (d *inProcessDriver) Scale(_ context.Context, n int) error {
	s := (*Stack)(d)
	for s.poolSize() < n {
		if _, err := s.AddRuntime(s.cores); err != nil {
			return err
		}
	}
	return nil
}

func (d *inProcessDriver) Remove(_ context.Context, id string) error {
	s := (*Stack)(d)
	s.wg.Add(1) // Close waits for it
	go func() { defer s.wg.Done(); s.StopRuntime(id) }()
	return nil
}

func (d *inProcessDriver) Size() int { return (*Stack)(d).poolSize() }

func (s *Stack) poolSize() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.pool {
		select {
		case <-p.done:
		default:
			if !p.removing {
				n++
			}
		}
	}
	return n
}

// connect opens a connection of a fanin component: with its own credentials when auth is on.
func (s *Stack) connect(name string) (*nats.Conn, error) {
	if s.Authority == nil {
		return s.connectAs(name, nil)
	}
	return s.connectAs(name, s.Authority.ComponentCredentials)
}

// Connect opens a connection with full access to fanin's account, for tests and the demo; the
// stack closes it. With auth off it is a plain connection.
func (s *Stack) Connect(name string) (*nats.Conn, error) { return s.connect(name) }

func (s *Stack) connectAs(name string, creds func(string) (auth.Credentials, error)) (*nats.Conn, error) {
	// The stack's components share the server's process: they connect in-process (a pipe, not
	// loopback TCP), which spares the kernel's two copies and the syscalls of every byte between
	// the server and a runtime.
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.InProcessServer(s.NATS)}
	if creds != nil {
		c, err := creds(name)
		if err != nil {
			return nil, err
		}
		opts = append(opts, c.NATSOptions()...)
	}
	nc, err := nats.Connect(s.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", name, err)
	}
	s.mu.Lock()
	s.conns = append(s.conns, nc)
	s.mu.Unlock()
	return nc, nil
}

// Close stops everything: the autoscaler and the gateway first (so nothing replaces what stops),
// then the runtimes (they checkpoint), then NATS.
func (s *Stack) Close() {
	s.cancel()
	if s.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.http.Shutdown(ctx)
		cancel()
	}
	s.wg.Wait()
	if s.Gateway != nil {
		s.Gateway.Close()
	}
	s.mu.Lock()
	pool := slices.Clone(s.pool)
	s.mu.Unlock()
	for _, p := range pool {
		p.stop()
	}
	for _, p := range pool {
		<-p.done
	}
	s.mu.Lock()
	for _, nc := range s.conns {
		nc.Close()
	}
	s.mu.Unlock()
	s.NATS.Shutdown()
	s.NATS.WaitForShutdown()
}
