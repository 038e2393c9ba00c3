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
	// later than a retry's first attempt (ackAttempt).
	copies := natstest.SlowReplies(t, nc, "slow.params", ackAttempt+ackAttempt/4, []byte(`{"stream":"SLOW","seq":1}`))

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
	// The asynchronous publish times out after 100 ms; the first retry, given twice ackAttempt, is
	// answered. One more if the machine is slow.
	if n := copies.Load(); n > 3 {
		t.Fatalf("the message was sent %d times, want at most 3", n)
	}
}
