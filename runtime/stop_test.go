package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/runtime"
	"github.com/fanin-ml/fanin/wire"
)

// A runtime, whoever started it, stops at the autoscaler leader's request: it answers, stops its
// shards, deregisters and returns from Run. It refuses a request without a term, and one of a
// term older than the one holding the placement's fence (a deposed leader's).
func TestRuntimeStopsAtTheLeadersRequest(t *testing.T) {
	t.Parallel()
	nc, js := testutil.Connect(t, testutil.NATS(t))
	ctx := context.Background()
	b, err := store.OpenBuckets(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	r, err := runtime.New(nc, runtime.WithID("rt-stop"), runtime.WithLogger(testutil.Logger()), runtime.WithCores(1))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { done <- r.Run(rctx) }()
	testutil.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		_, err := b.Runtimes.Get(ctx, "rt-stop")
		return err
	})

	old := store.Term{Epoch: 1, Rev: 3, Leader: "as-old"}
	cur := store.Term{Epoch: 1, Rev: 7, Leader: "as-new"}
	if _, err := store.NewKVFence(js, wire.PlacementBucket, cur).Claim(ctx); err != nil {
		t.Fatal(err)
	}
	stop := func(term *store.Term) string {
		t.Helper()
		m := nats.NewMsg(wire.RuntimeStopSubject("rt-stop"))
		if term != nil {
			data, _ := json.Marshal(term)
			m.Header.Set(store.HdrTerm, string(data))
		}
		resp, err := nc.RequestMsg(m, 5*time.Second)
		if err != nil {
			t.Fatalf("stop request: %v", err)
		}
		return string(resp.Data)
	}
	for name, term := range map[string]*store.Term{"no term": nil, "a deposed leader's term": &old} {
		if got := stop(term); !strings.HasPrefix(got, "refused") {
			t.Fatalf("a stop request with %s: %q, want it refused", name, got)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("the runtime stopped at a refused request: %v", err)
	default:
	}
	if got := stop(&cur); got != wire.RuntimeStopping {
		t.Fatalf("the leader's stop request: %q", got)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the runtime did not stop")
	}
	if _, err := b.Runtimes.Get(ctx, "rt-stop"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the stopped runtime is still registered: %v", err)
	}
}
