package natsreq_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/internal/natsreq"
	"github.com/fanin-ml/fanin/internal/natstest"
)

// A reply lost on the way (a responder that swallows the first request, as a stream leader that
// dies before it answers) is asked for again: the request returns the second attempt's reply, with
// a caller's context that has no deadline.
func TestLostReplyIsAskedAgain(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t)
	var seen atomic.Int32
	sub, err := nc.Subscribe("svc", func(m *nats.Msg) {
		if seen.Add(1) == 1 {
			return // lost
		}
		_ = m.Respond([]byte("answer to " + string(m.Data)))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := natsreq.Request(context.Background(), nc, "svc", []byte("q"), natsreq.WithAttempt(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "answer to q" || seen.Load() != 2 {
		t.Fatalf("reply %q after %d requests, want the second's answer", m.Data, seen.Load())
	}
}

// A reply slower than the first attempt's time (a shard's parameters over a slow link) still
// comes: each attempt after a timeout waits twice as long. With a fixed time, every attempt would
// time out and be sent again.
func TestSlowReplyComes(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t)
	seen := natstest.SlowReplies(t, nc, "svc", 300*time.Millisecond, []byte("slow answer"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := natsreq.Request(ctx, nc, "svc", nil, natsreq.WithAttempt(20*time.Millisecond))
	if err != nil {
		t.Fatalf("a reply slower than the first attempt, after %d requests: %v", seen.Load(), err)
	}
	t.Logf("%q after %d requests", m.Data, seen.Load())
}

// The retries end with the caller's context, with the last attempt's error.
func TestRetriesEndWithTheContext(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t)
	ctx, cancel := context.WithCancel(context.Background())
	var seen atomic.Int32
	sub, err := nc.Subscribe("svc", func(*nats.Msg) {
		if seen.Add(1) == 3 {
			cancel()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	_, err = natsreq.Request(ctx, nc, "svc", nil, natsreq.WithAttempt(20*time.Millisecond))
	if err == nil || ctx.Err() == nil || seen.Load() < 3 {
		t.Fatalf("err %v after %d requests, context %v", err, seen.Load(), ctx.Err())
	}
}

// "No responders" is returned at once, unless the caller allows a patience; then it is retried,
// and returned once the patience is over.
func TestNoResponders(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t)
	if _, err := natsreq.Request(context.Background(), nc, "nobody", nil); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("no responders: %v", err)
	}
	if _, err := natsreq.Request(context.Background(), nc, "nobody", nil, natsreq.WithNoResponders(50*time.Millisecond)); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("no responders, with patience: %v", err)
	}
}
