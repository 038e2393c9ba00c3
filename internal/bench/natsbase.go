package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/job"
)

// The bare baseline over core NATS: no JetStream, no durability, no de-duplication, no
// validation beyond what keeps it correct. Subjects:
//
//	bench.g.<shard>.<rank>.<step>  a rank's gradient, ranks -> aggregator
//	bench.p.<shard>.<step>         the parameters after step, aggregator -> every rank
const (
	bareGrad   = "bench.g."
	bareParams = "bench.p."
)

// baselineMaxPending is the max_pending of the baseline's NATS server. With fanin's 256 MiB the
// server cuts the bare aggregator's connection as a slow consumer in the first step of a
// ResNet-50-size job: 8 ranks x 97.5 MiB arrive at once at one connection, and the bare design has
// no flow control. One whole step must fit.
const baselineMaxPending = 1 << 30

// startBaselineNATS starts a NATS server configured as fanin's embedded one (internal/embed),
// except for max_pending (baselineMaxPending).
func startBaselineNATS(dir string) (*server.Server, error) {
	opts := &server.Options{
		ServerName:    "fanin-bench-baseline",
		Host:          "127.0.0.1",
		Port:          -1,
		JetStream:     true,
		StoreDir:      dir,
		MaxPayload:    embed.MaxPayload,
		MaxPending:    baselineMaxPending,
		WriteDeadline: 10 * time.Second,
		NoSigs:        true,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("baseline NATS: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("baseline NATS did not become ready in 10s")
	}
	return ns, nil
}

// startBareNATS starts a baseline NATS server (startBaselineNATS), one aggregator on its own
// connection and w.Ranks ranks on theirs. The aggregator applies the same function as fanin (sgd)
// to the same rank-order sum, so the parameters after every step are bit-identical to fanin's.
func startBareNATS(ctx context.Context, rs *runState, w workload, dir string) (_ *system, err error) {
	ns, err := startBaselineNATS(dir)
	if err != nil {
		return nil, err
	}
	var conns []*nats.Conn
	closeAll := func() {
		for _, nc := range conns {
			nc.Close()
		}
		ns.Shutdown()
		ns.WaitForShutdown()
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	trip := newTripwire()
	connect := func(name string) (*nats.Conn, error) {
		nc, err := nats.Connect(ns.ClientURL(), nats.Name(name),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				trip.trip(fmt.Errorf("connection %s: %w", name, err))
			}),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil { // not a Close of ours: the server cut the connection, messages are lost
					trip.trip(fmt.Errorf("connection %s lost: %w", name, err))
				}
			}))
		if err != nil {
			return nil, err
		}
		conns = append(conns, nc)
		return nc, nil
	}
	layout := w.layout()
	anc, err := connect("bench-aggregator")
	if err != nil {
		return nil, err
	}
	agg, err := newBareAggregator(anc, layout, w.Ranks, trip)
	if err != nil {
		return nil, err
	}
	sys := &system{close: closeAll}
	var ranks []*bareRank
	for r := range w.Ranks {
		nc, err := connect("bench-rank-" + strconv.Itoa(r))
		if err != nil {
			return nil, err
		}
		br, err := newBareRank(nc, layout, r, trip)
		if err != nil {
			return nil, err
		}
		ranks = append(ranks, br)
		sys.ranks = append(sys.ranks, br)
	}
	// Every subscription is registered with the server before the first publish.
	for _, nc := range conns {
		if err := nc.FlushTimeout(10 * time.Second); err != nil {
			return nil, err
		}
	}
	sys.check = func() error {
		var errs []error
		if err := trip.failed(); err != nil {
			errs = append(errs, err)
		}
		if n := ns.NumSlowConsumers(); n > 0 {
			errs = append(errs, fmt.Errorf("the NATS server saw %d slow consumers", n))
		}
		subs := []*nats.Subscription{agg.sub}
		for _, r := range ranks {
			subs = append(subs, r.sub)
		}
		for _, s := range subs {
			if d, _ := s.Dropped(); d > 0 {
				errs = append(errs, fmt.Errorf("subscription %s dropped %d messages", s.Subject, d))
			}
		}
		return errors.Join(errs...)
	}
	sys.notes = fmt.Sprintf("%d shards, 1 aggregator goroutine on its own connection, core NATS", layout.NumShards())
	return sys, nil
}

// noLimits lifts a subscription's client-side pending limits: the baseline must never drop a
// message because its callback is busy (it holds at most one step of gradients).
func noLimits(s *nats.Subscription) error { return s.SetPendingLimits(-1, -1) }

// bareAggregator sums the ranks of each shard in rank order, applies sgd, and publishes the
// parameters. Its callback runs on the subscription's single goroutine, so the state needs no lock.
type bareAggregator struct {
	nc     *nats.Conn
	sub    *nats.Subscription
	fn     functions.Func
	ranks  int
	shards []*bareShard
	trip   *tripwire // tripped by the first inconsistency: the run is then invalid
}

type bareShard struct {
	s      job.Shard
	step   int64 // last applied step
	next   int   // next rank to fold
	have   []bool
	pend   [][]byte
	acc    []float32
	params []float32
	out    []byte
}

func newBareAggregator(nc *nats.Conn, layout job.Layout, ranks int, trip *tripwire) (*bareAggregator, error) {
	fn, err := functions.New("sgd", map[string]float64{"lr": learningRate})
	if err != nil {
		return nil, err
	}
	a := &bareAggregator{nc: nc, fn: fn, ranks: ranks, trip: trip}
	for _, s := range layout.Shards {
		a.shards = append(a.shards, &bareShard{
			s: s, have: make([]bool, ranks), pend: make([][]byte, ranks),
			acc: make([]float32, s.Len), params: make([]float32, s.Len), out: make([]byte, s.Bytes()),
		})
	}
	if a.sub, err = nc.Subscribe(bareGrad+">", a.handle); err != nil {
		return nil, err
	}
	return a, noLimits(a.sub)
}

func (a *bareAggregator) fail(format string, args ...any) {
	a.trip.trip(fmt.Errorf("bare aggregator: "+format, args...))
}

func (a *bareAggregator) handle(m *nats.Msg) {
	tok := strings.Split(m.Subject[len(bareGrad):], ".")
	if len(tok) != 3 {
		a.fail("bad subject %q", m.Subject)
		return
	}
	shard, err1 := strconv.Atoi(tok[0])
	rank, err2 := strconv.Atoi(tok[1])
	step, err3 := strconv.ParseInt(tok[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || shard >= len(a.shards) || rank >= a.ranks {
		a.fail("bad subject %q", m.Subject)
		return
	}
	x := a.shards[shard]
	if step != x.step+1 || x.have[rank] || len(m.Data) != x.s.Bytes() {
		a.fail("shard %d at step %d got rank %d step %d (%d bytes): a message was lost or repeated", shard, x.step, rank, step, len(m.Data))
		return
	}
	x.have[rank] = true
	if rank != x.next {
		x.pend[rank] = m.Data
		return
	}
	x.fold(m.Data)
	for x.next < a.ranks && x.have[x.next] {
		d := x.pend[x.next]
		x.pend[x.next] = nil
		x.fold(d)
	}
	if x.next < a.ranks {
		return
	}
	x.step++
	a.fn.Apply(&functions.Update{Params: x.params, Grad: x.acc, Step: x.step, Ranks: a.ranks, WeightSum: float64(a.ranks)})
	functions.EncodeLE(x.out, x.params)
	x.next = 0
	clear(x.have)
	// Publish copies x.out into the connection's buffer before it returns.
	if err := a.nc.Publish(bareParams+strconv.Itoa(shard)+"."+strconv.FormatInt(x.step, 10), x.out); err != nil {
		a.fail("publish parameters of shard %d: %v", shard, err)
	}
}

func (x *bareShard) fold(data []byte) {
	if x.next == 0 {
		functions.CopyLE(x.acc, data)
	} else {
		functions.AddLE(x.acc, data)
	}
	x.next++
}

// bareRank is one worker of the bare baseline; like sdk.Worker it publishes every shard, then
// copies each shard's pushed parameters into its vector until it has them all.
type bareRank struct {
	nc     *nats.Conn
	layout job.Layout
	rank   int
	sub    *nats.Subscription
	vec    []float32
	enc    []byte // big-endian machines only
	step   int64
	trip   *tripwire

	mu      sync.Mutex // guards the fields below, written by the parameter subscription
	want    int64
	got     []int64
	missing int
	ready   chan struct{} // closed when missing reaches 0
}

func newBareRank(nc *nats.Conn, layout job.Layout, rank int, trip *tripwire) (*bareRank, error) {
	r := &bareRank{nc: nc, layout: layout, rank: rank, trip: trip, vec: make([]float32, layout.Elements), got: make([]int64, layout.NumShards())}
	if !littleEndian {
		r.enc = make([]byte, 4*layout.Elements)
	}
	var err error
	if r.sub, err = nc.Subscribe(bareParams+">", r.onParams); err != nil {
		return nil, err
	}
	return r, noLimits(r.sub)
}

func (r *bareRank) Step(ctx context.Context, grads []float32) ([]float32, error) {
	t := r.step + 1
	r.mu.Lock()
	r.want, r.missing, r.ready = t, r.layout.NumShards(), make(chan struct{})
	ready := r.ready
	r.mu.Unlock()
	suffix := "." + strconv.Itoa(r.rank) + "." + strconv.FormatInt(t, 10)
	for _, s := range r.layout.Shards {
		var buf []byte
		if r.enc != nil {
			buf = r.enc[4*s.Off:]
		}
		if err := r.nc.Publish(bareGrad+strconv.Itoa(s.ID)+suffix, wireBytes(grads[s.Off:s.Off+s.Len], buf)); err != nil {
			return nil, fmt.Errorf("rank %d: publish shard %d: %w", r.rank, s.ID, err)
		}
	}
	select {
	case <-ready:
	case <-r.trip.done():
		return nil, fmt.Errorf("rank %d: step %d: %w", r.rank, t, r.trip.failed())
	case <-ctx.Done():
		return nil, fmt.Errorf("rank %d: waiting for the parameters of step %d: %w", r.rank, t, ctx.Err())
	}
	r.step = t
	return r.vec, nil
}

func (r *bareRank) onParams(m *nats.Msg) {
	tok := strings.Split(m.Subject[len(bareParams):], ".")
	if len(tok) != 2 {
		return
	}
	id, err1 := strconv.Atoi(tok[0])
	step, err2 := strconv.ParseInt(tok[1], 10, 64)
	if err1 != nil || err2 != nil || id >= len(r.got) {
		return
	}
	s := r.layout.Shards[id]
	r.mu.Lock()
	defer r.mu.Unlock()
	if step != r.want || r.got[id] >= step || len(m.Data) != s.Bytes() {
		return
	}
	functions.CopyLE(r.vec[s.Off:s.Off+s.Len], m.Data)
	r.got[id] = step
	if r.missing--; r.missing == 0 {
		close(r.ready)
	}
}
