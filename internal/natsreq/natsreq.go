package natsreq

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
)

// Defaults of a request. Attempt bounds the first attempt (a stream or meta leader election takes
// 4-9 s after a node dies, and a request that reached a server as it died is never answered: the
// next attempt reaches the new leader); each attempt after a timeout has twice the time of the one
// before, up to MaxAttempt, so that a reply slower than Attempt (a shard's parameters over a slow
// or busy link) comes in the end, instead of every attempt's reply being cut short and sent again
// on top of the last; MaxBackoff is the longest pause between two attempts.
const (
	Attempt    = 2 * time.Second
	MaxAttempt = 32 * time.Second
	MaxBackoff = 500 * time.Millisecond
)

type config struct {
	attempt      time.Duration
	noResponders time.Duration // how long "no responders" is retried; 0: not at all
}

// Option configures one request.
type Option func(*config)

// WithAttempt bounds the first attempt by d instead of Attempt.
func WithAttempt(d time.Duration) Option { return func(c *config) { c.attempt = d } }

// WithNoResponders retries "no responders" for up to d (a stream electing its leader answers it
// for a moment; a stream that does not exist answers it for good). Without it, the error returns
// at once.
func WithNoResponders(d time.Duration) Option { return func(c *config) { c.noResponders = d } }

// Request sends a request with body to subject and returns the reply (Msg).
func Request(ctx context.Context, nc *nats.Conn, subject string, body []byte, opts ...Option) (*nats.Msg, error) {
	return Msg(ctx, nc, &nats.Msg{Subject: subject, Data: body}, opts...)
}

// Msg sends m as a request and returns the reply. Each attempt ends at the earlier of ctx's
// deadline and its time from its start: Attempt (WithAttempt) for the first, doubling after each
// timeout up to MaxAttempt (or the first's, if longer); an attempt that timed out is sent again, and
// so is one answered "no responders" within WithNoResponders' patience, after a pause that grows
// from 10 ms to MaxBackoff. It returns the last attempt's error once ctx is done. Only a request
// that may be answered twice belongs here (a read, an idempotent write): the first reply may have
// been lost after the request took effect.
func Msg(ctx context.Context, nc *nats.Conn, m *nats.Msg, opts ...Option) (*nats.Msg, error) {
	c := config{attempt: Attempt}
	for _, o := range opts {
		o(&c)
	}
	var patience time.Time // when "no responders" stops being retried, set by the first one
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, MaxBackoff) {
		actx, cancel := context.WithTimeout(ctx, c.attempt)
		reply, err := nc.RequestMsgWithContext(actx, m)
		cancel()
		switch {
		case err == nil:
			return reply, nil
		case ctx.Err() != nil:
			return nil, err
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
			// the reply was lost, the responder died, or the reply is slow: ask again, waiting longer
			c.attempt = max(min(2*c.attempt, MaxAttempt), c.attempt)
		case errors.Is(err, nats.ErrNoResponders):
			if patience.IsZero() {
				patience = time.Now().Add(c.noResponders)
			}
			if !time.Now().Before(patience) {
				return nil, err
			}
		default:
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}
