package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/rto"
)

// acker publishes messages asynchronously and runs each one's callback once JetStream has stored
// it (ok) or given up (not ok), in submission order. It owns its goroutine (run) and its queue.
type acker struct {
	js    jetstream.JetStream
	log   *slog.Logger
	queue chan ackItem // written by submit, read by run
	// rto is how long an acknowledgement may take before the message is sent again: ackTimeout,
	// or longer while acknowledgements come late (a stream's server across a full link), up to
	// ackAttemptMax. Without it every parameter message acknowledged after 3 s at 25 Mbit/s was
	// published again, and each copy went to every worker too.
	rto *rto.Estimator
	// seen, if set, is told each round trip sampled: the runtime's heartbeats ride the same routes
	// (beatMeter.observe). Not the timeouts: one during a stream leader's election would lengthen
	// the runtime's lapse for a minute.
	seen func(time.Duration)
}

type ackItem struct {
	msg     *nats.Msg
	sent    time.Time
	fut     jetstream.PubAckFuture
	err     error
	current func(context.Context) error // nil, or jobInfo.current of the message's job
	done    func(ok bool)
}

// ackRetryFor is how long a failed publish is retried, with a backoff from ackBackoff to
// ackBackoffMax: long enough to outlast a stream leader's election (4-9 s after its node dies:
// nats-server's raft election timeout), short enough that a shard whose stream is gone replays
// from its snapshot soon. Each retry that follows a timeout (of the asynchronous publish or of the
// retry before) has twice the time of the one before, from the acker's timer (acker.rto) up to
// ackAttemptMax: an acknowledgement slower than the timer (a shard's parameters crossing a full
// link to the stream's server) comes in the end, instead of every attempt being cut short and its
// megabyte sent again on top of the last. An attempt sent during an election is not answered, so
// the first one after it comes at most ackAttemptMax + ackBackoffMax later. The message id makes a
// retry of a message JetStream did store a no-op.
const (
	ackRetryFor   = 30 * time.Second
	ackBackoff    = 50 * time.Millisecond
	ackBackoffMax = 250 * time.Millisecond
	ackAttemptMax = 8 * time.Second
)

// noResend turns off the client library's own resend of a publish that found no stream
// (nats.ErrNoResponders: 2 more attempts, 250 ms apart, for every publish by default). The stream
// of a deleted job answers nothing, and a resend a quarter of a second later lands in the stream
// its job created again under the same name: a late checkpoint of the old incarnation would be the
// newest snapshot of the new one, which then restores from it. Every resend of a job's message is
// ours (acker.wait), each after a check that the stream is still its incarnation's (current).
var noResend = jetstream.WithRetryAttempts(0)

func newAcker(js jetstream.JetStream, log *slog.Logger) *acker {
	return &acker{js: js, log: log, queue: make(chan ackItem, 4096), rto: rto.New(ackTimeout, ackAttemptMax)}
}

// submit publishes msg; msg and its data must stay untouched until done is called. A retry is
// sent only while current (if not nil) finds the job's streams as they were: a message of a job
// deleted meanwhile must not land in the streams of the job created again under its id.
func (a *acker) submit(msg *nats.Msg, current func(context.Context) error, done func(ok bool)) {
	sent := time.Now()
	fut, err := a.js.PublishMsgAsync(msg, noResend)
	a.queue <- ackItem{msg: msg, sent: sent, fut: fut, err: err, current: current, done: done}
}

func (a *acker) run(ctx context.Context) {
	for {
		select {
		case it := <-a.queue:
			it.done(a.wait(ctx, it))
		case <-ctx.Done():
			for { // fail whatever is left so that no owner waits forever
				select {
				case it := <-a.queue:
					it.done(false)
				default:
					return
				}
			}
		}
	}
}

func (a *acker) wait(ctx context.Context, it ackItem) bool {
	err := it.err
	wait := a.rto.Timeout()
	if err == nil {
		select {
		case <-it.fut.Ok(): // answered before its turn came: when is not known, so nothing to learn
			return true
		default:
		}
		timer := time.NewTimer(wait - time.Since(it.sent))
		defer timer.Stop()
		select {
		case <-it.fut.Ok():
			rtt := time.Since(it.sent)
			a.rto.Sample(rtt)
			a.saw(rtt)
			return true
		case err = <-it.fut.Err():
		case <-timer.C:
			err = errNoAck
		case <-ctx.Done():
			return false
		}
	}
	if timedOut(err) {
		a.rto.Backoff(time.Now())
	}
	deadline := time.Now().Add(ackRetryFor)
	for attempt, backoff := 1, ackBackoff; ctx.Err() == nil && time.Now().Before(deadline); attempt, backoff = attempt+1, min(2*backoff, ackBackoffMax) {
		a.log.Warn("publish not acknowledged; retrying", "subject", it.msg.Subject, "err", err, "attempt", attempt)
		if timedOut(err) { // the last attempt, or the asynchronous publish, got no answer in its time
			wait = max(min(2*wait, ackAttemptMax), wait)
		}
		pctx, cancel := context.WithTimeout(ctx, wait)
		if it.current != nil {
			if cerr := it.current(pctx); errors.Is(cerr, jetstream.ErrStreamNotFound) {
				cancel()
				a.log.Warn("publish dropped: its job's stream is gone", "subject", it.msg.Subject, "err", cerr)
				return false
			}
		}
		_, err = a.js.PublishMsg(pctx, it.msg, noResend)
		cancel()
		if err == nil {
			return true
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
	}
	a.log.Error("publish failed; the shard will replay from its last snapshot", "subject", it.msg.Subject, "err", err)
	return false
}

func (a *acker) saw(rtt time.Duration) {
	if a.seen != nil {
		a.seen(rtt)
	}
}

// errNoAck is an asynchronous publish not acknowledged within the acker's timer.
var errNoAck = fmt.Errorf("no acknowledgement in time: %w", context.DeadlineExceeded)

// timedOut says whether err is an attempt that got no answer in its time (rather than a refusal).
func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrAsyncPublishTimeout)
}
