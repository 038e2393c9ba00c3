package runtime

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// fakeConsumer answers Info as its info function says; every other method of the interface is
// nil and panics if called.
type fakeConsumer struct {
	jetstream.Consumer
	info func() (*jetstream.ConsumerInfo, error)
}

func (f fakeConsumer) Info(context.Context) (*jetstream.ConsumerInfo, error) { return f.info() }

// fakeConsumeContext is a consumption whose end the test decides.
type fakeConsumeContext struct{ closed chan struct{} }

func (f fakeConsumeContext) Stop()                   {}
func (f fakeConsumeContext) Drain()                  {}
func (f fakeConsumeContext) Closed() <-chan struct{} { return f.closed }

func delivered(n uint64) func() (*jetstream.ConsumerInfo, error) {
	return func() (*jetstream.ConsumerInfo, error) {
		return &jetstream.ConsumerInfo{Delivered: jetstream.SequenceInfo{Consumer: n}}, nil
	}
}

func failing(err error) func() (*jetstream.ConsumerInfo, error) {
	return func() (*jetstream.ConsumerInfo, error) { return nil, err }
}

// TestIdleCheck drives checkIdle through each way an idle consumer is found lost, and the ways it
// is not: each check is one call, as watch makes them.
func TestIdleCheck(t *testing.T) {
	ctx := context.Background()
	newG := func(dseq uint64) *gradConsumer { return &gradConsumer{dseq: dseq, lost: make(chan struct{}, 1)} }
	timeout := errors.New("nats: timeout")

	t.Run("healthy", func(t *testing.T) {
		g, c := newG(3), &idleCheck{seen: 3}
		for i := range 20 {
			if why := g.checkIdle(ctx, fakeConsumer{info: delivered(3)}, c); why != "" {
				t.Fatalf("check %d: %q for a consumer that delivered what arrived", i, why)
			}
		}
		if c.quiet != 20 {
			t.Fatalf("quiet = %d after 20 idle checks, want 20 (the interval grows)", c.quiet)
		}
	})
	t.Run("a delivery that never arrived", func(t *testing.T) {
		g, c := newG(3), &idleCheck{seen: 3}
		if why := g.checkIdle(ctx, fakeConsumer{info: delivered(4)}, c); why != "" {
			t.Fatalf("first check: %q; a delivery may still be on its way", why)
		}
		if why := g.checkIdle(ctx, fakeConsumer{info: delivered(4)}, c); !strings.Contains(why, "never arrived") {
			t.Fatalf("second check: %q, want the delivery taken for lost", why)
		}
	})
	t.Run("not found", func(t *testing.T) {
		g, c := newG(3), &idleCheck{seen: 3}
		if why := g.checkIdle(ctx, fakeConsumer{info: failing(jetstream.ErrConsumerNotFound)}, c); !strings.Contains(why, "does not exist") {
			t.Fatalf("%q, want the consumer taken for lost at once", why)
		}
	})
	t.Run("info failing", func(t *testing.T) {
		g, c := newG(3), &idleCheck{seen: 3, quiet: 4}
		for i := 1; i < idleFailed; i++ {
			if why := g.checkIdle(ctx, fakeConsumer{info: failing(timeout)}, c); why != "" {
				t.Fatalf("failure %d of %d: %q", i, idleFailed, why)
			}
			if c.quiet != 0 {
				t.Fatalf("failure %d: quiet = %d: the next check must come within consumerCheck", i, c.quiet)
			}
		}
		if why := g.checkIdle(ctx, fakeConsumer{info: failing(timeout)}, c); !strings.Contains(why, "failed in 5 checks") {
			t.Fatalf("failure %d: %q, want the consumer taken for lost", idleFailed, why)
		}
	})
	t.Run("info failing, then a message", func(t *testing.T) {
		g, c := newG(3), &idleCheck{seen: 3}
		for range idleFailed - 1 {
			g.checkIdle(ctx, fakeConsumer{info: failing(timeout)}, c)
		}
		g.dseq = 4 // a message arrived: the consumer delivers
		for i := range idleFailed {
			if why := g.checkIdle(ctx, fakeConsumer{info: failing(timeout)}, c); why != "" {
				t.Fatalf("check %d after a delivery: %q; the failures before it must not count", i, why)
			}
		}
	})
	t.Run("stopping", func(t *testing.T) {
		g, c := newG(3), &idleCheck{seen: 3}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		for i := range 2 * idleFailed {
			if why := g.checkIdle(cctx, fakeConsumer{info: failing(context.Canceled)}, c); why != "" {
				t.Fatalf("check %d while stopping: %q", i, why)
			}
		}
	})
}

// TestWatchEndsWithTheConsumption: a consumption the library ended by itself is a loss, reported
// with the last error it gave; a report of an older consumer does not end the current one's watch.
func TestWatchEndsWithTheConsumption(t *testing.T) {
	g := &gradConsumer{lost: make(chan struct{}, 1), gen: 2}
	g.markLost(1) // an older generation's report: dropped
	g.noteErr(2, jetstream.ErrBadRequest)
	cc := fakeConsumeContext{closed: make(chan struct{})}
	close(cc.closed)
	why := g.watch(context.Background(), fakeConsumer{info: delivered(0)}, cc)
	if !strings.Contains(why, "stopped consuming") || !strings.Contains(why, jetstream.ErrBadRequest.Error()) {
		t.Fatalf("watch: %q, want the consumption's end and its last error", why)
	}
	select {
	case <-g.lost:
		t.Fatal("an older consumer's loss reached the current one")
	default:
	}
	if !consumerLost(jetstream.ErrBadRequest) {
		t.Fatal("a 400 Bad Request ends the consumption: it must count as a loss")
	}
}
