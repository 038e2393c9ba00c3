package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/internal/embed"
)

// latencyWorkload is the small job of the latency scenario: 1 MiB of parameters in one shard.
var latencyWorkload = workload{Ranks: 4, Elements: 1 << 18, ShardSize: 1 << 20, Runtimes: e2eRuntimes}

const latencyWarmup = 10

func (rs *runState) latencySteps() int {
	if rs.cfg.Quick {
		return 50
	}
	return 200
}

// stepLatencies times steps BSP steps of a system one by one: from the moment the ranks start
// publishing to the moment the last of them holds the new parameters.
func stepLatencies(ctx context.Context, rs *runState, start starter, w workload, steps int) ([]time.Duration, error) {
	dir, err := os.MkdirTemp("", "fanin-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	sys, err := start(ctx, rs, w, dir)
	if err != nil {
		return nil, err
	}
	defer sys.close()
	c := newCluster(sys, rs.gradients(w))
	for range latencyWarmup {
		if err := c.step(ctx); err != nil {
			return nil, err
		}
	}
	lat := make([]time.Duration, steps)
	for i := range lat {
		start := time.Now()
		if err := c.step(ctx); err != nil {
			return nil, err
		}
		lat[i] = time.Since(start)
	}
	if _, err := c.agree(); err != nil {
		return nil, err
	}
	if sys.check != nil {
		return lat, sys.check()
	}
	return lat, nil
}

// echoServer is the latency baseline: a NATS server like fanin's embedded one and a responder
// that echoes every request on its own connection.
type echoServer struct {
	requester *nats.Conn
	close     func()
}

const echoSubject = "bench.echo"

func startEcho(dir string) (_ *echoServer, err error) {
	ns, err := embed.Start(embed.Config{Port: -1, StoreDir: dir})
	if err != nil {
		return nil, err
	}
	var conns []*nats.Conn
	e := &echoServer{close: func() {
		for _, nc := range conns {
			nc.Close()
		}
		ns.Shutdown()
		ns.WaitForShutdown()
	}}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	resp, err := nats.Connect(ns.ClientURL(), nats.Name("bench-echo"))
	if err != nil {
		return nil, err
	}
	conns = append(conns, resp)
	if _, err := resp.Subscribe(echoSubject, func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		return nil, err
	}
	if err := resp.Flush(); err != nil {
		return nil, err
	}
	if e.requester, err = nats.Connect(ns.ClientURL(), nats.Name("bench-requester")); err != nil {
		return nil, err
	}
	conns = append(conns, e.requester)
	return e, nil
}

// roundTrip sends one request of payload and checks the echo.
func (e *echoServer) roundTrip(ctx context.Context, payload []byte) error {
	m, err := e.requester.RequestWithContext(ctx, echoSubject, payload)
	if err != nil {
		return err
	}
	if len(m.Data) != len(payload) {
		return fmt.Errorf("echo of %d bytes came back with %d", len(payload), len(m.Data))
	}
	return nil
}

// requestLatencies times n request-replies of size bytes.
func requestLatencies(ctx context.Context, size, n int) ([]time.Duration, error) {
	dir, err := os.MkdirTemp("", "fanin-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	e, err := startEcho(dir)
	if err != nil {
		return nil, err
	}
	defer e.close()
	payload := make([]byte, size)
	for range latencyWarmup {
		if err := e.roundTrip(ctx, payload); err != nil {
			return nil, err
		}
	}
	lat := make([]time.Duration, n)
	for i := range lat {
		start := time.Now()
		if err := e.roundTrip(ctx, payload); err != nil {
			return nil, err
		}
		lat[i] = time.Since(start)
	}
	return lat, nil
}

// percentile is the nearest-rank p-quantile (0 < p <= 1) of the durations.
func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func runLatency(ctx context.Context, rs *runState) ([]Result, error) {
	w := latencyWorkload
	n := rs.latencySteps()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	f, err := stepLatencies(ctx, rs, startFanin, w, n)
	if err != nil {
		return nil, fmt.Errorf("fanin: %w", err)
	}
	rr, err := requestLatencies(ctx, w.ShardSize, n)
	if err != nil {
		return nil, fmt.Errorf("request-reply: %w", err)
	}
	bare, err := stepLatencies(ctx, rs, startBareNATS, w, n)
	if err != nil {
		return nil, fmt.Errorf("bare aggregator: %w", err)
	}
	bareJS, err := stepLatencies(ctx, rs, startBareJetStream, w, n)
	if err != nil {
		return nil, fmt.Errorf("bare aggregator over JetStream: %w", err)
	}
	baselines := []struct {
		name, short string
		lat         []time.Duration
		notes       string
	}{
		{"1 MiB request-reply over core NATS (echo)", "request-reply", rr,
			"the issue's baseline: one 1 MiB request echoed by a responder; a fanin step moves 4 x 1 MiB in and 4 x 1 MiB out through a stored stream"},
		{"bare aggregator over core NATS, same job", "bare aggregator", bare,
			"the same job through the e2e-resnet50 bare aggregator: what JetStream storage and acks, and fanin's bookkeeping, add"},
		{"bare aggregator over JetStream, same job", "bare JetStream", bareJS,
			"the bare aggregator on fanin's JetStream path (gradients into a memory stream with message ids, acknowledged; a pull consumer per shard, AckNone; parameters into a memory stream, pushed to the ranks) and nothing else of fanin: the ratio is what fanin's own code adds to a step"},
	}
	setup := fmt.Sprintf("4 ranks, 1 MiB of parameters in 1 shard, sgd, fanin with %d runtimes; %d timed steps (or round trips) after %d warm-up, each timed from the ranks' first publish to the last rank holding the new parameters; nearest-rank percentiles",
		w.Runtimes, n, latencyWarmup)
	var out []Result
	for _, b := range baselines {
		for _, p := range []struct {
			name string
			q    float64
		}{{"p50", 0.50}, {"p99", 0.99}} {
			out = append(out, latency(Result{
				Scenario: "latency-small",
				Case:     fmt.Sprintf("%s,%s vs %s", w.name(), p.name, b.short),
				Metric:   p.name + " ms",
				Baseline: b.name,
				Fanin:    ms(percentile(f, p.q)),
				Base:     ms(percentile(b.lat, p.q)),
				Setup:    setup,
				Notes:    b.notes,
			}))
		}
	}
	return out, nil
}
