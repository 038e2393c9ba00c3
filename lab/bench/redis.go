//go:build redis

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/job"
)

// RedisBuiltIn reports whether the Redis baseline (e2e-redis) is built into this binary: it is
// with -tags redis, so that the fanin binary links no Redis client (redisbin.go).
const RedisBuiltIn = true

// The Redis baseline exchanges shards through keys, as serverless training systems do with a
// managed Redis: every rank SETs its gradient shards, one aggregator GETs them in rank order
// (polling until each is there), sums them, applies sgd and SETs the parameters, which every rank
// GETs (polling too). Keys:
//
//	g:<step>:<shard>:<rank>  a rank's gradient; deleted by the aggregator once folded
//	p:<step>:<shard>         the parameters after step; deleted once every rank has sent step+1
func gradKey(step int64, shard, rank int) string {
	return "g:" + strconv.FormatInt(step, 10) + ":" + strconv.Itoa(shard) + ":" + strconv.Itoa(rank)
}

func paramsKey(step int64, shard int) string {
	return "p:" + strconv.FormatInt(step, 10) + ":" + strconv.Itoa(shard)
}

// Polling backs off from pollMin to pollMax while a key is missing: fast enough not to add much
// latency to a step that takes milliseconds, slow enough not to steal the CPU that Redis needs.
const (
	pollMin = 50 * time.Microsecond
	pollMax = time.Millisecond
)

// redisServer is a redis-server child process on a loopback port, without persistence.
type redisServer struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{} // closed when the process has exited
	err  error         // the process's exit, once done is closed
}

func startRedisServer(ctx context.Context, bin, dir string) (*redisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logFile := filepath.Join(dir, "redis.log")
	cmd := exec.Command(bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", dir, "--logfile", logFile)
	cmd.SysProcAttr = dieWithBench()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &redisServer{cmd: cmd, addr: "127.0.0.1:" + strconv.Itoa(port), done: make(chan struct{})}
	go func() { s.err = cmd.Wait(); close(s.done) }()
	c := redis.NewClient(&redis.Options{Addr: s.addr, DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(logFile)
			return nil, fmt.Errorf("redis-server exited at start (%v): %s", s.err, tail(log, 500))
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s did not answer PING in 10s: %v", s.addr, err)
		}
	}
}

// stop terminates the server and waits for it.
func (s *redisServer) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

func newRedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr, Protocol: 2, DisableIdentity: true, PoolSize: 2,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
	})
}

// startRedis brings up redis-server, the aggregator and w.Ranks ranks, each with its own client.
func startRedis(ctx context.Context, rs *runState, w workload, dir string) (_ *system, err error) {
	bin, err := findRedis(rs.cfg)
	if err != nil {
		return nil, err
	}
	srv, err := startRedisServer(ctx, bin, dir)
	if err != nil {
		return nil, err
	}
	layout := w.layout()
	fn, err := functions.New("sgd", map[string]float64{"lr": learningRate})
	if err != nil {
		srv.stop()
		return nil, err
	}
	actx, stopAgg := context.WithCancel(context.Background())
	agg := &redisAggregator{c: newRedisClient(srv.addr), layout: layout, ranks: w.Ranks, fn: fn, trip: newTripwire()}
	var clients []*redis.Client
	var wg sync.WaitGroup
	wg.Go(func() { agg.run(actx) })
	sys := &system{
		close: func() {
			stopAgg()
			wg.Wait()
			_ = agg.c.Close()
			for _, c := range clients {
				_ = c.Close()
			}
			srv.stop()
		},
		extraCPU: func() time.Duration { return childCPU(srv.cmd.Process.Pid) },
		check:    agg.trip.failed,
		notes:    fmt.Sprintf("%d shards, 1 aggregator goroutine, polling %v..%v", layout.NumShards(), pollMin, pollMax),
	}
	for r := range w.Ranks {
		c := newRedisClient(srv.addr)
		clients = append(clients, c)
		sys.ranks = append(sys.ranks, &redisRank{c: c, layout: layout, rank: r, vec: make([]float32, layout.Elements), agg: agg})
	}
	return sys, nil
}

// poll GETs key until it exists; it gives up when ctx is done or the aggregator failed.
func poll(ctx context.Context, c *redis.Client, key string, failed func() error) ([]byte, error) {
	d := pollMin
	for {
		b, err := c.Get(ctx, key).Bytes()
		if err == nil {
			return b, nil
		}
		if !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("GET %s: %w", key, err)
		}
		if err := failed(); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s: %w", key, ctx.Err())
		case <-time.After(d):
		}
		d = min(2*d, pollMax)
	}
}

type redisAggregator struct {
	c      *redis.Client
	layout job.Layout
	ranks  int
	fn     functions.Func
	trip   *tripwire
}

// run aggregates steps 1, 2, ... until ctx is done, shard after shard, rank after rank.
func (a *redisAggregator) run(ctx context.Context) {
	type shardState struct {
		acc, params []float32
		out         []byte
	}
	st := make([]shardState, a.layout.NumShards())
	for i, s := range a.layout.Shards {
		st[i] = shardState{acc: make([]float32, s.Len), params: make([]float32, s.Len), out: make([]byte, s.Bytes())}
	}
	never := func() error { return nil }
	for t := int64(1); ; t++ {
		for _, s := range a.layout.Shards {
			x := &st[s.ID]
			keys := make([]string, 0, a.ranks+1)
			for r := range a.ranks {
				k := gradKey(t, s.ID, r)
				b, err := poll(ctx, a.c, k, never)
				if err != nil {
					if ctx.Err() == nil {
						a.trip.trip(fmt.Errorf("redis aggregator: %w", err))
					}
					return
				}
				if len(b) != s.Bytes() {
					a.trip.trip(fmt.Errorf("redis aggregator: %s has %d bytes, want %d", k, len(b), s.Bytes()))
					return
				}
				if r == 0 {
					functions.CopyLE(x.acc, b)
				} else {
					functions.AddLE(x.acc, b)
				}
				keys = append(keys, k)
			}
			a.fn.Apply(&functions.Update{Params: x.params, Grad: x.acc, Step: t, Ranks: a.ranks, WeightSum: float64(a.ranks)})
			functions.EncodeLE(x.out, x.params)
			if t > 1 { // every rank has sent step t, so it has read step t-1's parameters
				keys = append(keys, paramsKey(t-1, s.ID))
			}
			pipe := a.c.Pipeline()
			pipe.Set(ctx, paramsKey(t, s.ID), x.out, 0)
			pipe.Del(ctx, keys...)
			if _, err := pipe.Exec(ctx); err != nil {
				if ctx.Err() == nil {
					a.trip.trip(fmt.Errorf("redis aggregator: store step %d of shard %d: %w", t, s.ID, err))
				}
				return
			}
		}
	}
}

// redisRank SETs its gradient shards in one pipeline, then GETs each shard's parameters.
type redisRank struct {
	c      *redis.Client
	layout job.Layout
	rank   int
	vec    []float32
	enc    []byte
	step   int64
	agg    *redisAggregator
}

func (r *redisRank) Step(ctx context.Context, grads []float32) ([]float32, error) {
	t := r.step + 1
	if !littleEndian && r.enc == nil {
		r.enc = make([]byte, 4*r.layout.Elements)
	}
	pipe := r.c.Pipeline()
	for _, s := range r.layout.Shards {
		var buf []byte
		if r.enc != nil {
			buf = r.enc[4*s.Off:]
		}
		pipe.Set(ctx, gradKey(t, s.ID, r.rank), wireBytes(grads[s.Off:s.Off+s.Len], buf), 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("rank %d: SET gradients of step %d: %w", r.rank, t, err)
	}
	for _, s := range r.layout.Shards {
		b, err := poll(ctx, r.c, paramsKey(t, s.ID), r.agg.trip.failed)
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", r.rank, err)
		}
		if len(b) != s.Bytes() {
			return nil, fmt.Errorf("rank %d: parameters of shard %d have %d bytes, want %d", r.rank, s.ID, len(b), s.Bytes())
		}
		functions.CopyLE(r.vec[s.Off:s.Off+s.Len], b)
	}
	r.step = t
	return r.vec, nil
}
