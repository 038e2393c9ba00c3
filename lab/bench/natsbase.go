package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
// except for max_pending (baselineMaxPending); the stream ingest buffer is fanin's too.
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
		// As fanin's: the JetStream baseline's 8 ranks publish a whole model at once.
		StreamMaxBufferedSize: 1 << 30,
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
func startBareNATS(ctx context.Context, rs *runState, w workload, dir string) (*system, error) {
	return startBare(ctx, w, dir, bareCore)
}

// startBareJetStream is startBareNATS with fanin's JetStream data path and nothing else of fanin:
// the ranks publish their gradients into a memory stream with a message id (de-duplicated) and
// wait for JetStream's acknowledgements, the aggregator takes them from a pull consumer per shard
// (AckNone, in memory, as fanin's runtimes), and publishes the parameters into a second memory
// stream, which also pushes them to the ranks' subscriptions. No validation, no bookkeeping, no
// snapshot or replay logic: what remains of a fanin step when fanin's own code is taken out.
func startBareJetStream(ctx context.Context, rs *runState, w workload, dir string) (*system, error) {
	return startBare(ctx, w, dir, bareStoredPull)
}

// bareMode is how the bare aggregator's gradients travel; its parameters go into a JetStream
// stream in every mode but bareCore.
type bareMode int

const (
	bareCore       bareMode = iota // core NATS both ways, nothing stored
	bareStoredPull                 // gradients stored in a stream, delivered by a pull consumer per shard
	bareStoredSub                  // gradients stored in a stream for replay only, received by a core subscription
	bareDirect                     // gradients as core NATS requests, the aggregator's reply the receipt; nothing stored
)

func (m bareMode) String() string {
	return [...]string{"core", "stored+pull", "stored+sub", "direct"}[m]
}

// Streams of the JetStream baseline.
const (
	bareGradStream   = "BENCH_G"
	bareParamsStream = "BENCH_P"
)

func startBare(ctx context.Context, w workload, dir string, mode bareMode) (*system, error) {
	ns, err := startBaselineNATS(dir)
	if err != nil {
		return nil, err
	}
	sys, err := startBareOn(ctx, w, ns.ClientURL(), mode, ns.NumSlowConsumers)
	if err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, err
	}
	inner := sys.close
	sys.close = func() {
		inner()
		ns.Shutdown()
		ns.WaitForShutdown()
	}
	return sys, nil
}

// startBareOn brings the bare system up on the NATS server at url; slow, when not nil, counts the
// server's slow consumers (a run that had one is invalid).
func startBareOn(ctx context.Context, w workload, url string, mode bareMode, slow func() int64) (_ *system, err error) {
	useJS := mode != bareCore
	var conns []*nats.Conn
	closeAll := func() {
		for _, nc := range conns {
			nc.Close()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	trip := newTripwire()
	connect := func(name string) (*nats.Conn, error) {
		nc, err := nats.Connect(url, nats.Name(name),
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
	agg, err := newBareAggregator(anc, layout, w.Ranks, trip, mode != bareStoredPull)
	if err != nil {
		return nil, err
	}
	agg.receipts = mode == bareDirect
	var stopConsumers []jetstream.ConsumeContext
	if useJS {
		if stopConsumers, err = agg.consumeJetStream(ctx, layout, w.Ranks, mode); err != nil {
			return nil, err
		}
		inner := closeAll
		closeAll = func() {
			for _, cc := range stopConsumers {
				cc.Stop()
			}
			inner()
		}
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
		if mode == bareDirect {
			err = br.receiveReceipts()
		} else if useJS {
			if br.js, err = jetstream.New(nc); err != nil {
				return nil, err
			}
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
		if n := slowConsumers(slow); n > 0 {
			errs = append(errs, fmt.Errorf("the NATS server saw %d slow consumers", n))
		}
		var subs []*nats.Subscription
		if agg.sub != nil {
			subs = append(subs, agg.sub)
		}
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
	switch mode {
	case bareStoredPull:
		sys.notes = fmt.Sprintf("%d shards, 1 aggregator on its own connection with a pull consumer per shard, JetStream memory streams", layout.NumShards())
	case bareStoredSub:
		sys.notes = fmt.Sprintf("%d shards, gradients stored in a JetStream memory stream and received by the aggregator's core subscription, parameters in a memory stream", layout.NumShards())
	case bareDirect:
		sys.notes = fmt.Sprintf("%d shards, gradients as core NATS requests answered by the aggregator (receipts), parameters in a memory stream", layout.NumShards())
	}
	return sys, nil
}

func slowConsumers(f func() int64) int64 {
	if f == nil {
		return 0
	}
	return f()
}

// noLimits lifts a subscription's client-side pending limits: the baseline must never drop a
// message because its callback is busy (it holds at most one step of gradients).
func noLimits(s *nats.Subscription) error { return s.SetPendingLimits(-1, -1) }

// bareAggregator sums the ranks of each shard in rank order, applies sgd, and publishes the
// parameters. Its callback runs on the subscription's single goroutine, so the state needs no lock.
type bareAggregator struct {
	nc     *nats.Conn
	js     jetstream.JetStream // JetStream baseline: parameters are published into a stream
	sub    *nats.Subscription  // core NATS baseline
	fn     functions.Func
	ranks  int
	shards []*bareShard
	trip   *tripwire // tripped by the first inconsistency: the run is then invalid
	// receipts: answer every gradient (a core NATS request) with an empty reply, its receipt.
	receipts    bool
	pullRetries atomic.Int64 // pull requests answered "no responders", pulled again by nats.go
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

// newBareAggregator makes the aggregator; with subscribe, it takes the gradients from a core NATS
// subscription, else consumeJetStream must be called.
func newBareAggregator(nc *nats.Conn, layout job.Layout, ranks int, trip *tripwire, subscribe bool) (*bareAggregator, error) {
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
	if !subscribe {
		return a, nil
	}
	if a.sub, err = nc.Subscribe(bareGrad+">", a.handle); err != nil {
		return nil, err
	}
	return a, noLimits(a.sub)
}

// consumeJetStream creates the JetStream baseline's two streams and consumes each shard's
// gradients from its own pull consumer, as fanin's runtimes do (each consumer's callbacks run on
// one goroutine, and touch only their shard's state).
func (a *bareAggregator) consumeJetStream(ctx context.Context, layout job.Layout, ranks int, mode bareMode) ([]jetstream.ConsumeContext, error) {
	js, err := jetstream.New(a.nc)
	if err != nil {
		return nil, err
	}
	a.js = js
	if mode == bareStoredPull || mode == bareStoredSub {
		// Three steps of gradients, the oldest discarded: the stream holds what a replay would
		// need, as fanin's purges keep it bounded.
		model := int64(0)
		for _, s := range layout.Shards {
			model += int64(s.Bytes()) + 1024
		}
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: bareGradStream, Subjects: []string{bareGrad + ">"},
			Storage: jetstream.MemoryStorage, Duplicates: 2 * time.Minute, MaxBytes: 3 * int64(ranks) * model, Discard: jetstream.DiscardOld}); err != nil {
			return nil, err
		}
	}
	// Two steps of parameters, as fanin keeps.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: bareParamsStream, Subjects: []string{bareParams + ">"},
		Storage: jetstream.MemoryStorage, MaxMsgs: int64(2 * layout.NumShards()), Duplicates: 2 * time.Minute}); err != nil {
		return nil, err
	}
	if mode != bareStoredPull {
		return nil, nil // the gradients come through the core subscription
	}
	gs, err := js.Stream(ctx, bareGradStream)
	if err != nil {
		return nil, err
	}
	var ccs []jetstream.ConsumeContext
	for _, s := range layout.Shards {
		cons, err := gs.CreateConsumer(ctx, jetstream.ConsumerConfig{FilterSubject: bareGrad + strconv.Itoa(s.ID) + ".>",
			AckPolicy: jetstream.AckNonePolicy, MaxDeliver: 1, MemoryStorage: true})
		if err != nil {
			return ccs, err
		}
		msgBytes := s.Bytes() + 1024
		cc, err := cons.Consume(func(m jetstream.Msg) { a.handle(&nats.Msg{Subject: m.Subject(), Data: m.Data()}) },
			jetstream.PullMaxBytes(max(min(2*a.ranks*msgBytes, 16<<20), 2*msgBytes)),
			// Patient pulls: on a loaded machine a server starved of CPU for a few seconds missed
			// the default heartbeat, and the messages of the pull nats.go then gave up were lost.
			jetstream.PullExpiry(2*time.Minute), jetstream.PullHeartbeat(30*time.Second),
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoHeartbeat) {
					// A pull request the server did not answer, or a heartbeat it did not send, in
					// time (seen with the server in a process of its own on a loaded machine):
					// nats.go pulls again, and a message lost for good would stall the step and
					// fail the run.
					a.pullRetries.Add(1)
					return
				}
				a.fail("consumer of shard %d: %v", s.ID, err)
			}))
		if err != nil {
			return ccs, err
		}
		ccs = append(ccs, cc)
	}
	return ccs, nil
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
	if a.receipts {
		// Received is all a receipt says: the aggregator holds the gradient (the bare system keeps
		// no replay, so it takes a loss as a failed run, not a retry).
		if err := m.Respond(nil); err != nil {
			a.fail("receipt of shard %d rank %d: %v", shard, rank, err)
			return
		}
	}
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
	subject := bareParams + strconv.Itoa(shard) + "." + strconv.FormatInt(x.step, 10)
	if a.js != nil {
		pm := nats.NewMsg(subject)
		pm.Data = x.out
		pm.Header.Set(nats.MsgIdHdr, subject)
		fut, err := a.js.PublishMsgAsync(pm)
		if err != nil {
			a.fail("publish parameters of shard %d: %v", shard, err)
			return
		}
		go func() { // the ack is not on the ranks' path: they have the parameters pushed
			select {
			case <-fut.Ok():
			case err := <-fut.Err():
				a.fail("parameters of shard %d not stored: %v", shard, err)
			}
		}()
		return
	}
	if err := a.nc.Publish(subject, x.out); err != nil {
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
	js     jetstream.JetStream // JetStream baseline: gradients are published into a stream
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

	// Direct mode: each shard's gradient is a request whose reply (the receipt) comes to inbox.
	inbox    string
	rsub     *nats.Subscription
	receipts chan struct{} // one per receipt, written by rsub's callback
}

// receiveReceipts makes the rank send its gradients as core NATS requests (bareDirect).
func (r *bareRank) receiveReceipts() error {
	r.inbox = nats.NewInbox()
	r.receipts = make(chan struct{}, r.layout.NumShards())
	var err error
	r.rsub, err = r.nc.Subscribe(r.inbox, func(m *nats.Msg) {
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			r.trip.trip(fmt.Errorf("rank %d: a gradient found no responders", r.rank))
			return
		}
		r.receipts <- struct{}{}
	})
	if err != nil {
		return err
	}
	return noLimits(r.rsub)
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
	var futs []jetstream.PubAckFuture
	for _, s := range r.layout.Shards {
		var buf []byte
		if r.enc != nil {
			buf = r.enc[4*s.Off:]
		}
		subject, data := bareGrad+strconv.Itoa(s.ID)+suffix, wireBytes(grads[s.Off:s.Off+s.Len], buf)
		if r.rsub != nil {
			if err := r.nc.PublishMsg(&nats.Msg{Subject: subject, Reply: r.inbox, Data: data}); err != nil {
				return nil, fmt.Errorf("rank %d: publish shard %d: %w", r.rank, s.ID, err)
			}
			continue
		}
		if r.js != nil {
			m := nats.NewMsg(subject)
			m.Data = data
			m.Header.Set(nats.MsgIdHdr, subject)
			f, err := r.js.PublishMsgAsync(m)
			if err != nil {
				return nil, fmt.Errorf("rank %d: publish shard %d: %w", r.rank, s.ID, err)
			}
			futs = append(futs, f)
			continue
		}
		if err := r.nc.Publish(subject, data); err != nil {
			return nil, fmt.Errorf("rank %d: publish shard %d: %w", r.rank, s.ID, err)
		}
	}
	for range r.layout.NumShards() * btoi(r.rsub != nil) { // received, as a direct Step waits for
		select {
		case <-r.receipts:
		case <-r.trip.done():
			return nil, fmt.Errorf("rank %d: step %d: %w", r.rank, t, r.trip.failed())
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	for _, f := range futs { // stored, as fanin's Step waits for
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return nil, fmt.Errorf("rank %d: step %d: gradient not stored: %w", r.rank, t, err)
		case <-ctx.Done():
			return nil, ctx.Err()
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

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
