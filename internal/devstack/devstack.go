// Package devstack runs all of fanin in one process on an embedded NATS server: the gateway, a pool
// of runtimes and the placer. `fanin dev` and the integration tests use it.
package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/runtime"
)

// Config of a stack.
type Config struct {
	DataDir   string // JetStream storage
	NATSPort  int    // -1: any free port
	HTTPAddr  string // gateway listen address; "" disables HTTP, "127.0.0.1:0" picks a port
	Runtimes  int    // runtimes in the pool (default 3)
	Cores     int    // cores per runtime (default GOMAXPROCS)
	Logger    *slog.Logger
	NATSLogs  bool
	RuntimeID func(i int) string // default rt-0, rt-1, ...
}

// Stack is a running fanin.
type Stack struct {
	NATS     *server.Server
	URL      string // NATS client URL
	HTTPURL  string // gateway base URL, "" without HTTP
	Gateway  *gateway.Server
	Runtimes []*runtime.Runtime

	log    *slog.Logger
	cancel context.CancelFunc
	wg     sync.WaitGroup
	conns  []*nats.Conn
	http   *http.Server
	rtStop []context.CancelFunc
	rtDone []chan struct{}
}

// Start brings a stack up. Close brings it down.
func Start(ctx context.Context, cfg Config) (_ *Stack, err error) {
	if cfg.Runtimes == 0 {
		cfg.Runtimes = 3
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RuntimeID == nil {
		cfg.RuntimeID = func(i int) string { return fmt.Sprintf("rt-%d", i) }
	}
	ns, err := embed.Start(embed.Config{Port: cfg.NATSPort, StoreDir: cfg.DataDir, Logs: cfg.NATSLogs})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s := &Stack{NATS: ns, URL: ns.ClientURL(), log: cfg.Logger, cancel: cancel}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()

	gwConn, err := s.connect("fanin-gateway")
	if err != nil {
		return nil, err
	}
	if s.Gateway, err = gateway.New(ctx, gwConn, gateway.WithLogger(cfg.Logger)); err != nil {
		return nil, err
	}
	if cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return nil, fmt.Errorf("gateway listen on %s: %w", cfg.HTTPAddr, err)
		}
		s.HTTPURL = "http://" + ln.Addr().String()
		s.http = &http.Server{Handler: s.Gateway.Handler(), ReadHeaderTimeout: 10 * time.Second}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("gateway HTTP", "err", err)
			}
		}()
	}

	plConn, err := s.connect("fanin-placer")
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(plConn)
	if err != nil {
		return nil, err
	}
	placer := autoscaler.NewStaticPlacer(js, cfg.Logger)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := placer.Run(runCtx); err != nil {
			s.log.Error("placer", "err", err)
		}
	}()

	for i := range cfg.Runtimes {
		if _, err := s.AddRuntime(cfg.RuntimeID(i), cfg.Cores); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// AddRuntime starts one more runtime in the pool.
func (s *Stack) AddRuntime(id string, cores int) (*runtime.Runtime, error) {
	nc, err := s.connect("fanin-runtime-" + id)
	if err != nil {
		return nil, err
	}
	opts := []runtime.Option{runtime.WithID(id), runtime.WithLogger(s.log)}
	if cores > 0 {
		opts = append(opts, runtime.WithCores(cores))
	}
	rt, err := runtime.New(nc, opts...)
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	s.Runtimes = append(s.Runtimes, rt)
	s.rtStop = append(s.rtStop, stop)
	s.rtDone = append(s.rtDone, done)
	go func() {
		defer close(done)
		if err := rt.Run(ctx); err != nil {
			s.log.Error("runtime", "id", id, "err", err)
		}
	}()
	return rt, nil
}

// StopRuntime stops runtime i gracefully (its shards checkpoint and are placed elsewhere).
func (s *Stack) StopRuntime(i int) {
	s.rtStop[i]()
	<-s.rtDone[i]
}

func (s *Stack) connect(name string) (*nats.Conn, error) {
	nc, err := nats.Connect(s.URL, nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", name, err)
	}
	s.conns = append(s.conns, nc)
	return nc, nil
}

// Close stops everything: runtimes first (they checkpoint), then the rest, then NATS.
func (s *Stack) Close() {
	for i := range s.rtStop {
		s.StopRuntime(i)
	}
	if s.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.http.Shutdown(ctx)
		cancel()
	}
	s.cancel()
	s.wg.Wait()
	for _, nc := range s.conns {
		nc.Close()
	}
	s.NATS.Shutdown()
	s.NATS.WaitForShutdown()
}
