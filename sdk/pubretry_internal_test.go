package sdk

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/natstest"
	"github.com/fanin-ml/fanin/job"
)

// A gradient whose acknowledgement is slower than a retry's first attempt (it crosses a full link
// to its stream's server) is stored in the end: each retry after one that got no answer waits
// twice as long. With a fixed attempt time every retry would be cut short and its bytes sent again
// on top of the last's, until the step's context ended.
func TestSlowGradientAckComes(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t)
	// The stream's server, as seen over a slow link: each copy is acknowledged later than
	// pubAttempt after it came.
	copies := natstest.SlowReplies(t, nc, "slow.grad", pubAttempt+pubAttempt/4, []byte(`{"stream":"SLOW","seq":1}`))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{c: &Client{nc: nc, js: js}}
	ctx, cancel := context.WithTimeout(context.Background(), 4*pubAttemptMax)
	defer cancel()
	// As after an asynchronous publish that got no acknowledgement in ackTimeout.
	err = w.publishRetrying(ctx, job.Shard{ID: 0}, 0, &nats.Msg{Subject: "slow.grad", Data: []byte("a gradient")}, jetstream.ErrAsyncPublishTimeout)
	if err != nil {
		t.Fatalf("the gradient was not stored after %d copies: %v", copies.Load(), err)
	}
	// The first retry, given twice pubAttempt after the asynchronous publish's timeout, is
	// answered; one more if the machine is slow.
	if n := copies.Load(); n > 2 {
		t.Fatalf("the gradient was sent %d times by the retries, want at most 2", n)
	}
}
