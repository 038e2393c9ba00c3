package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// gradConsumer delivers one shard's gradients to handle in stream order, each message once, from
// a start sequence: what nats.go's ordered consumer does, with one difference that matters in a
// cluster. When its consumer is lost (its server died, a message went missing in a reconnect, the
// consumer was deleted), it makes a new one under a new name, each attempt bounded by
// createTimeout and retried with a backoff. nats.go re-creates under the same name with a fixed
// 10 s timeout, and a creation first assigned to a node that had just died (servers call a
// SIGKILLed node offline only after minutes) is then never answered: the shard stalled for good.
//
// A message lost on its way to the client shows as a gap in the consumer sequence when the next
// one arrives; when none follows (the last gradient of a step, lost as a stream's leader died), the
// consumer's heartbeats go on and nothing else would tell. So while no message arrives, the
// consumer is checked every consumerCheck (checkIdle): one that the servers say delivered more than
// this client received, and still did a whole interval later, is lost too; so is one they say does
// not exist, or whose info fails in idleFailed checks in a row. Nor is a loss left to the client
// library's error reports alone: a consumption it ended by itself (on a terminal status from the
// servers) is a loss, whatever it reported.
type gradConsumer struct {
	stream  jetstream.Stream
	subject string
	opts    []jetstream.PullConsumeOpt
	handle  func(jetstream.Msg)
	// current checks, before each consumer is made, that the stream is still the one the shard
	// serves (jobInfo.current): a job created again under its id has a stream of the same name.
	current func(context.Context) error

	started chan struct{} // closed once the first consumer consumes

	mu       sync.Mutex
	gen      int    // generation of the current consumer; messages of an older one are dropped
	next     uint64 // stream sequence to start a new consumer from
	dseq     uint64 // last consumer sequence delivered by the current consumer
	handling bool   // handle is running: the messages behind it wait in the client, not lost
	lost     chan struct{}
	err      error // the last error the library reported of the current consumer's consumption
}

// consumerCheck is how often an idle consumer asks the servers what they delivered (checkIdle).
// Tests shorten it (export_test.go).
var consumerCheck atomic.Int64

func init() { consumerCheck.Store(int64(time.Second)) }

// loseDelivery is a fault point for tests: a message it picks is dropped as if lost on its way
// (the consumer's state on the servers has advanced, this client never sees it). Nil in production.
var loseDelivery atomic.Pointer[func(jetstream.Msg) bool]

// muteConsumeErrors is a fault point for tests: while true, the client library's error reports
// of a consumption (missed heartbeats, a consumer deleted) are ignored, as if it never made them.
var muteConsumeErrors atomic.Bool

// Timings of a shard's consumer: createTimeout bounds one creation attempt (a stream or meta
// leader election takes 4-9 s after a node dies; a request sent during one is never answered),
// createBackoff is the longest wait between two attempts, and consumerHeartbeat is its idle
// heartbeat: a consumer lost with its server is noticed after two.
const (
	createTimeout     = 2 * time.Second
	createBackoff     = 500 * time.Millisecond
	consumerHeartbeat = time.Second
	// consumerInactive is how long the servers keep a consumer nobody pulls from (its runtime died).
	consumerInactive = 30 * time.Second
)

func newGradConsumer(stream streamRef, subject string, start uint64, handle func(jetstream.Msg), opts ...jetstream.PullConsumeOpt) *gradConsumer {
	return &gradConsumer{stream: stream.stream, current: stream.current, subject: subject, next: start, handle: handle, lost: make(chan struct{}, 1),
		started: make(chan struct{}), opts: append(opts, jetstream.PullHeartbeat(consumerHeartbeat))}
}

// run consumes until ctx is done, re-creating the consumer whenever it is lost. It returns an
// error only if the stream is gone.
func (g *gradConsumer) run(ctx context.Context, log func(msg string, args ...any)) error {
	backoff, first := 50*time.Millisecond, true
	for ctx.Err() == nil {
		cons, cc, err := g.start(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return err
			}
			log("create consumer; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, createBackoff)
			continue
		}
		if first {
			close(g.started)
			first = false
		}
		began := time.Now()
		why := g.watch(ctx, cons, cc)
		if why == "" && ctx.Err() == nil {
			why = "the consumer was lost (" + g.lastErr() + ")"
		}
		if why != "" {
			log(why+"; making a new consumer", "consumer", cons.CachedInfo().Name, "from_seq", g.resume())
		}
		cc.Stop()
		<-cc.Closed()
		// A consumer that served a while is replaced at once. One lost within a second of its
		// creation waits a growing backoff first: were the servers to end every consumer at once
		// (a 400 to this client's own pull requests), replacing them without a pause would load
		// the cluster's leader with creations.
		if time.Since(began) >= time.Second {
			backoff = 50 * time.Millisecond
		} else if ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, createBackoff)
		}
		if ctx.Err() == nil {
			// Gone with its server, or still there and abandoned: the servers drop it once it is
			// inactive, and deleting it now spares them the wait.
			go func(name string) {
				dctx, cancel := context.WithTimeout(context.Background(), createTimeout)
				defer cancel()
				_ = g.stream.DeleteConsumer(dctx, name)
			}(cons.CachedInfo().Name)
		}
	}
	return nil
}

// resume is the stream sequence a new consumer starts from.
func (g *gradConsumer) resume() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.next
}

// watch returns when ctx is done or the consumer is lost: reported lost by its consumption (why is
// then "": the report is in lastErr), ended by the client library, or found so by checkIdle.
func (g *gradConsumer) watch(ctx context.Context, cons jetstream.Consumer, cc jetstream.ConsumeContext) (why string) {
	var idle idleCheck
	t := time.NewTimer(idle.interval())
	defer t.Stop()
	closed := cc.Closed() // closed by the library once consumption ends, whoever ended it
	for {
		select {
		case <-ctx.Done():
			return ""
		case <-g.lost:
			return ""
		case <-closed:
			return "the client library stopped consuming (" + g.lastErr() + ")"
		case <-t.C:
			if why := g.checkIdle(ctx, cons, &idle); why != "" {
				return why
			}
			t.Reset(idle.interval())
		}
	}
}

// idleCheck is what checkIdle remembers from one check to the next.
type idleCheck struct {
	seen   uint64 // g.dseq at the last check
	owed   uint64 // the servers' delivered sequence at the last check, beyond seen; 0: none
	quiet  int    // checks in a row that found the consumer idle and owing nothing
	failed int    // checks in a row whose question failed
}

// idleFailed is how many idle checks in a row may fail before the consumer is taken for lost. A
// consumer's server that died takes it along; its heartbeats stopping normally say so within two
// seconds, and this is the backstop when they do not (the library pauses its heartbeat timer while
// a message is handled and while it reconnects). An R1 consumer's info is answered by its own
// server, elections of the stream's or the cluster's leader or not; five failures in a row (5 to
// 15 s: each check waits up to createTimeout) outlast a moment of overload. A new consumer costs
// nothing to exactness (it starts from the last sequence this client received).
const idleFailed = 5

// interval is the time to the next check: consumerCheck while messages flow or one is owed,
// doubling while the shard stays idle up to 32 times that. A message is lost at the end of a burst
// (the next check asks at once), and a job's idle shards must not each ask every second.
func (c *idleCheck) interval() time.Duration {
	return time.Duration(consumerCheck.Load()) << min(c.quiet, 5)
}

// checkIdle says why the consumer is lost (a message it delivered never arrived and nothing
// follows it; the servers say it does not exist; none answers for it), or "". While messages flow
// (or handle runs) it asks nothing: a loss shows as a gap. Once none arrived for a whole interval,
// it asks the servers for the consumer's delivered sequence (one request per idle shard and
// interval); a message they delivered that has not arrived by the next check is lost.
func (g *gradConsumer) checkIdle(ctx context.Context, cons jetstream.Consumer, c *idleCheck) string {
	g.mu.Lock()
	dseq, handling := g.dseq, g.handling
	g.mu.Unlock()
	if dseq != c.seen || handling {
		c.seen, c.owed, c.quiet, c.failed = dseq, 0, 0, 0
		return ""
	}
	if c.owed > dseq { // asked at the last check, and nothing arrived since
		return "the consumer's servers delivered a message that never arrived"
	}
	c.owed = 0
	ictx, cancel := context.WithTimeout(ctx, createTimeout)
	info, err := cons.Info(ictx)
	cancel()
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return "the servers say the consumer does not exist"
	}
	if err != nil { // gone with its server: its heartbeats tell, or these checks
		if ctx.Err() != nil {
			return "" // stopping
		}
		c.failed++
		c.quiet = 0 // ask again within consumerCheck
		if c.failed >= idleFailed {
			return fmt.Sprintf("the consumer's info failed in %d checks in a row (%v)", c.failed, err)
		}
		return ""
	}
	c.failed = 0
	if info.Delivered.Consumer > dseq {
		c.owed, c.quiet = info.Delivered.Consumer, 0
	} else {
		c.quiet++
	}
	return ""
}

// start creates a consumer from g.next and starts consuming it.
func (g *gradConsumer) start(ctx context.Context) (jetstream.Consumer, jetstream.ConsumeContext, error) {
	g.mu.Lock()
	g.gen++
	gen, next := g.gen, g.next
	g.dseq, g.err = 0, nil
	select { // a loss reported by the consumer before this one is not this one's
	case <-g.lost:
	default:
	}
	g.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, createTimeout)
	defer cancel()
	if err := g.current(cctx); err != nil {
		return nil, nil, err
	}
	cons, err := g.stream.CreateConsumer(cctx, jetstream.ConsumerConfig{
		Name:              "fanin_" + strings.ReplaceAll(uuid.NewString(), "-", ""),
		FilterSubject:     g.subject,
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       next,
		AckPolicy:         jetstream.AckNonePolicy,
		MaxDeliver:        1,
		Replicas:          1,
		MemoryStorage:     true,
		InactiveThreshold: consumerInactive,
	})
	if err != nil {
		return nil, nil, err
	}
	opts := append(g.opts, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if muteConsumeErrors.Load() {
			return
		}
		g.noteErr(gen, err)
		if errors.Is(err, jetstream.ErrNoHeartbeat) || consumerLost(err) {
			g.markLost(gen)
		}
	}))
	cc, err := cons.Consume(func(m jetstream.Msg) { g.deliver(gen, m) }, opts...)
	if err != nil {
		return nil, nil, err
	}
	return cons, cc, nil
}

// deliver passes m on if it is the next message of the current consumer; a gap in the consumer's
// sequence (a message lost in a reconnect) makes a new consumer from the last one delivered.
func (g *gradConsumer) deliver(gen int, m jetstream.Msg) {
	if lose := loseDelivery.Load(); lose != nil && (*lose)(m) {
		return
	}
	meta, err := m.Metadata()
	g.mu.Lock()
	if gen != g.gen {
		g.mu.Unlock()
		return
	}
	if err != nil || meta.Sequence.Consumer != g.dseq+1 {
		if err == nil {
			err = fmt.Errorf("consumer sequence %d after %d: a message went missing", meta.Sequence.Consumer, g.dseq)
		}
		g.err = err
		g.mu.Unlock()
		g.markLost(gen)
		return
	}
	g.dseq, g.next = meta.Sequence.Consumer, meta.Sequence.Stream+1
	g.handling = true
	g.mu.Unlock()
	g.handle(m)
	g.mu.Lock()
	g.handling = false
	g.mu.Unlock()
}

// noteErr keeps err as the last error reported of consumer generation gen, if it is current.
func (g *gradConsumer) noteErr(gen int, err error) {
	g.mu.Lock()
	if gen == g.gen {
		g.err = err
	}
	g.mu.Unlock()
}

// lastErr is the last error reported of the current consumer's consumption, for a log.
func (g *gradConsumer) lastErr() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		return "no error reported"
	}
	return g.err.Error()
}

// markLost reports consumer generation gen lost, if it is current. The report is made under g.mu,
// as start drains old ones: a report of an older generation cannot reach the next one's watch.
func (g *gradConsumer) markLost(gen int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gen == g.gen {
		select {
		case g.lost <- struct{}{}:
		default:
		}
	}
}

// consumerLost tells the errors after which a consumer cannot go on: it or its stream is gone, or
// nothing answers its pull requests.
func consumerLost(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrBadRequest) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, nats.ErrNoResponders)
}
