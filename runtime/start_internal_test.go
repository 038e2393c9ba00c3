package runtime

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/natstest"
	"github.com/fanin-ml/fanin/internal/store"
)

// A runtime stopped between its registration and its placement watch (the leader's stop request
// or its caller, as it starts) returns nil and deregisters, as a stop at any other time does. It
// used to return the canceled watch as an error and leave its registration to expire.
func TestStoppedWhileStarting(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t)
	r, err := New(nc, WithID("rt-starting"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.registered = func(context.Context) { cancel() }
	if err := r.Run(ctx); err != nil {
		t.Fatalf("stopped while starting: %v", err)
	}
	b, err := store.OpenBuckets(context.Background(), r.js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Runtimes.Get(context.Background(), "rt-starting"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the runtime stopped while starting is still registered: %v", err)
	}
}
