package runtime

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/natstest"
)

// An acknowledgement slower than a retry's first attempt (a shard's parameters crossing a full
// link to their stream's server) still comes: each retry after a timeout waits twice as long as
// the one before. With a fixed attempt time every retry would be cut short and sent again, its
// bytes on top of the last's, until the publish failed.
func TestSlowAckComes(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t)
	// The stream's server, as seen from a slow link: each copy of the message is acknowledged
	// later than the acker's first wait (ackTimeout).
	copies := natstest.SlowReplies(t, nc, "slow.params", ackTimeout+ackTimeout/4, []byte(`{"stream":"SLOW","seq":1}`))

	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	a := newAcker(js, slog.New(slog.NewTextHandler(t.Output(), nil)))
	ctx, cancel := context.WithTimeout(context.Background(), ackRetryFor/2)
	defer cancel()
	go a.run(ctx)
	done := make(chan bool, 1)
	a.submit(&nats.Msg{Subject: "slow.params", Data: []byte("a shard's parameters")}, nil, func(ok bool) { done <- ok })
	if !<-done {
		t.Fatalf("the publish was not acknowledged after %d copies", copies.Load())
	}
	// The asynchronous publish times out after 100 ms; the first retry, given twice ackTimeout, is
	// answered. One more if the machine is slow.
	if n := copies.Load(); n > 3 {
		t.Fatalf("the message was sent %d times, want at most 3", n)
	}
}

// Acknowledgements that all come later than ackTimeout (the parameter stream's server across a
// full link) have the first message published twice, and the next ones once: the acker's timer
// backs off after the timeout and then follows the acknowledgements' round trips. With the fixed
// timeout each message was published twice, and a parameter message's copy went to every worker
// too.
func TestAckTimerFollowsRoundTrips(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t)
	copies := natstest.SlowReplies(t, nc, "late.params", ackTimeout+time.Second, []byte(`{"stream":"LATE","seq":1}`))
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(ackAttemptMax)) // as the runtime's
	if err != nil {
		t.Fatal(err)
	}
	a := newAcker(js, slog.New(slog.NewTextHandler(t.Output(), nil)))
	var seen []time.Duration // read once the acker has stopped
	a.seen = func(rtt time.Duration) { seen = append(seen, rtt) }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stopped := make(chan struct{})
	go func() { a.run(ctx); close(stopped) }()
	var sent []int32
	for range 3 {
		before := copies.Load()
		done := make(chan bool, 1)
		a.submit(&nats.Msg{Subject: "late.params", Data: []byte("a shard's parameters")}, nil, func(ok bool) { done <- ok })
		if !<-done {
			t.Fatalf("not acknowledged after %d copies", copies.Load()-before)
		}
		sent = append(sent, copies.Load()-before)
	}
	if sent[1] != 1 || sent[2] != 1 {
		t.Fatalf("copies of each of 3 messages %v: want the second and third published once", sent)
	}
	// The round trips go to the heartbeats' lapse too: the second and third messages' (the first
	// had none, only a timeout).
	cancel()
	<-stopped
	if len(seen) != 2 || seen[0] < ackTimeout || seen[1] < ackTimeout {
		t.Fatalf("round trips seen %v, want 2 of %v or more", seen, ackTimeout)
	}
}
