package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/lab/testutil"
)

// A fence admits one term's writes: a later term's claim makes the server refuse the earlier
// term's writes, an earlier term cannot claim it back, and a fence lost with its bucket is claimed
// again by the term that held it.
func TestFenceAdmitsOneTerm(t *testing.T) {
	t.Parallel()
	_, js := testutil.Connect(t, testutil.NATS(t))
	ctx := context.Background()
	cfg := jetstream.KeyValueConfig{Bucket: "fenced", History: 4}
	kv, err := js.CreateKeyValue(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t2, t3 := store.Term{Epoch: 1, Rev: 2, Leader: "a"}, store.Term{Epoch: 1, Rev: 3, Leader: "b"}
	a, b := store.NewKVFence(js, "fenced", t2), store.NewKVFence(js, "fenced", t3)
	if _, err := a.Put(ctx, "k", []byte("x")); err == nil {
		t.Fatal("a write before the claim went through")
	}
	if _, err := a.Claim(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Put(ctx, "k", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Claim(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Put(ctx, "k", []byte("a2")); !errors.Is(err, store.ErrFenced) || !store.Refused(err) {
		t.Fatalf("the earlier term's write after a later claim: %v, want refused", err)
	}
	if err := a.Purge(ctx, "k"); err == nil {
		t.Fatal("the earlier term's purge went through")
	}
	if _, err := a.Claim(ctx); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("the earlier term claimed the fence back: %v", err)
	}
	if _, err := b.Put(ctx, "k", []byte("b")); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "b" {
		t.Fatalf("k = %v (%v), want b's write", e, err)
	}
	m, err := js.Stream(ctx, "KV_fenced")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := m.GetLastMsgForSubject(ctx, "$KV.fenced.k")
	if err != nil {
		t.Fatal(err)
	}
	var got store.Term
	if err := json.Unmarshal([]byte(raw.Header.Get(store.HdrTerm)), &got); err != nil || got != t3 {
		t.Fatalf("the write carries term %+v (%v), want %+v", got, err, t3)
	}
	if cur, err := store.BucketTerm(ctx, js, "fenced"); err != nil || cur != t3 {
		t.Fatalf("BucketTerm = %+v, %v", cur, err)
	}

	// The bucket is lost and recreated: b's write is refused, and b claims the fence again.
	if err := js.DeleteKeyValue(ctx, "fenced"); err != nil {
		t.Fatal(err)
	}
	// Created again at once, the bucket can meet the server still removing the deleted one's store:
	// JetStream's "error creating store for stream" (10049), seen once under the race detector.
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		_, err := js.CreateKeyValue(ctx, cfg)
		return err
	})
	if _, err := b.Put(ctx, "k", []byte("b2")); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("a write after the fence was lost: %v", err)
	}
	if _, err := b.Claim(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, "k", []byte("b2")); err != nil {
		t.Fatal(err)
	}
}
