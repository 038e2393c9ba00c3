package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// On one server every bucket is one file-storage replica; a runtime registry an older fanin made in
// memory is recreated on file, and a job bucket's data is never dropped to change its storage.
func TestBucketsOnOneServer(t *testing.T) {
	t.Parallel()
	_, js := testutil.Connect(t, testutil.NATS(t))
	ctx := context.Background()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.RuntimesBucket, Storage: jetstream.MemoryStorage, TTL: store.RuntimeTTL}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.JobsBucket, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.OpenBuckets(ctx, js); err == nil || !strings.Contains(err.Error(), "memory storage, fanin needs file") {
		t.Fatalf("a memory jobs bucket was accepted or silently replaced: %v", err)
	}
	if err := js.DeleteKeyValue(ctx, wire.JobsBucket); err != nil {
		t.Fatal(err)
	}
	b, err := store.OpenBuckets(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []jetstream.KeyValue{b.Jobs, b.Placement, b.Runtimes, b.Handover, b.Leader, b.Policy} {
		st, _ := kv.Status(ctx)
		cfg := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
		if cfg.Storage != jetstream.FileStorage || cfg.Replicas != 1 {
			t.Errorf("%s: %s storage, %d replicas; want file, 1", kv.Bucket(), cfg.Storage, cfg.Replicas)
		}
	}
	// Asking one server for three replicas says why it cannot.
	_, err = store.EnsureKV(ctx, js, jetstream.KeyValueConfig{Bucket: "x", Storage: jetstream.FileStorage, Replicas: 3})
	if err == nil || !strings.Contains(err.Error(), "not clustered") {
		t.Fatalf("3 replicas on one server: %v", err)
	}
}

// A bucket made by an older fanin with a shorter TTL (the leader lock's was 5 s) gets the TTL
// fanin asks for now; a longer one is kept (an older fanin's opening does not shorten it).
func TestBucketTTLRaised(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := testutil.Connect(t, testutil.NATS(t))
	open := func(ttl time.Duration) time.Duration {
		t.Helper()
		kv, err := store.EnsureKV(ctx, js, jetstream.KeyValueConfig{Bucket: "lock", History: 1, TTL: ttl, Storage: jetstream.FileStorage})
		if err != nil {
			t.Fatal(err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.TTL()
	}
	for _, c := range []struct{ ask, want time.Duration }{{5 * time.Second, 5 * time.Second}, {10 * time.Second, 10 * time.Second}, {5 * time.Second, 10 * time.Second}} {
		if got := open(c.ask); got != c.want {
			t.Fatalf("opened asking for a TTL of %v: %v, want %v", c.ask, got, c.want)
		}
	}
}

// In a 3-node cluster every bucket and stream of fanin's has 3 replicas, buckets made with one are
// raised to three, and the state stays readable and writable with any one node down. Not
// parallel: its servers listen on ports FreePort found free, which a test beside it could take.
func TestBucketsSurviveANode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	c := testutil.StartCluster(t, 3)
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if r := store.StateReplicas(nc); r != 3 {
		t.Fatalf("StateReplicas in a 3-node cluster = %d", r)
	}
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.PolicyBucket, Storage: jetstream.FileStorage, History: 64}); err != nil {
		t.Fatal(err)
	}
	b, err := store.OpenBuckets(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.EnsureStream(ctx, js, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if r := st.CachedInfo().Config.Replicas; r != 3 {
		t.Errorf("stream: %d replicas", r)
	}
	for _, kv := range []jetstream.KeyValue{b.Jobs, b.Placement, b.Runtimes, b.Handover, b.Leader, b.Policy} {
		st, _ := kv.Status(ctx)
		if r := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas; r != 3 {
			t.Errorf("%s: %d replicas", kv.Bucket(), r)
		}
	}
	// The policy bucket, raised from one replica, is caught up on all three before a node goes.
	testutil.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		st, err := b.Policy.Status(ctx)
		if err != nil {
			return err
		}
		cl := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Cluster
		if cl == nil || cl.Leader == "" || len(cl.Replicas) != 2 {
			return fmt.Errorf("policy bucket cluster %+v", cl)
		}
		for _, p := range cl.Replicas {
			if !p.Current {
				return fmt.Errorf("policy replica %s not current", p.Name)
			}
		}
		return nil
	})
	// Stop the node leading the jobs bucket: reads and writes go on.
	st2, _ := b.Jobs.Status(ctx)
	leader := st2.(*jetstream.KeyValueBucketStatus).StreamInfo().Cluster.Leader
	c.Stop(c.Index(leader))
	testutil.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, err := b.Jobs.Put(wctx, "j", []byte("v")); err != nil {
			return err
		}
		_, err := b.Jobs.Get(wctx, "j")
		return err
	})
	// Reopening with a node down works: nothing needs creating.
	if _, err := store.OpenBuckets(ctx, js); err != nil {
		t.Fatalf("open with one node down: %v", err)
	}
}

// A Watcher keeps following its bucket across a server restart (nats.go's watch goes silent for
// good) and across the bucket being deleted and recreated, and its follower ends up with exactly
// the bucket's keys: the ones deleted while it was blind are deleted for it. Not parallel: the
// server comes back on the port FreePort found free, which a test beside it could take meanwhile.
func TestWatcherHeals(t *testing.T) {
	store.CheckInterval = 200 * time.Millisecond
	dir, port := t.TempDir(), testutil.FreePort(t)
	start := func() *server.Server {
		ns, err := embed.Start(embed.Config{Port: port, StoreDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return ns
	}
	ns := start()
	_, js := testutil.Connect(t, ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	ctx := context.Background()
	cfg := jetstream.KeyValueConfig{Bucket: "b", Storage: jetstream.FileStorage}
	kv, err := js.CreateKeyValue(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustPut := func(k, v string) {
		t.Helper()
		testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error { _, err := kv.Put(ctx, k, []byte(v)); return err })
	}
	mustPut("a", "1")
	mustPut("gone", "x")

	var mu sync.Mutex
	mirror := map[string]string{}
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	ready, err := store.Follow(wctx, js, kv, ">", &wg, func(e jetstream.KeyValueEntry) {
		mu.Lock()
		defer mu.Unlock()
		if e.Operation() == jetstream.KeyValuePut {
			mirror[e.Key()] = string(e.Value())
		} else {
			delete(mirror, e.Key())
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	<-ready
	want := func(w map[string]string) {
		t.Helper()
		testutil.CheckFor(t, 15*time.Second, 50*time.Millisecond, func() error {
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(mirror) != fmt.Sprint(w) {
				return fmt.Errorf("mirror %v, want %v", mirror, w)
			}
			return nil
		})
	}
	want(map[string]string{"a": "1", "gone": "x"})

	ns.Shutdown()
	ns.WaitForShutdown()
	ns = start()
	defer ns.Shutdown()
	mustPut("a", "2")
	if err := kv.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	mustPut("b", "3")
	want(map[string]string{"a": "2", "b": "3"})

	if err := js.DeleteKeyValue(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if kv, err = js.CreateKeyValue(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	mustPut("c", "4")
	want(map[string]string{"c": "4"})
}

// On a fresh 3-node cluster, a bucket that another component has just created, or that is deleted
// between being opened and being used, is waited for (and created again), not an error: the gateway
// used to exit with "open bucket fanin-handover: stream not found" and the runtimes on fanin-jobs.
// A watch of a bucket deleted meanwhile waits until the bucket is back. Not parallel: it listens
// to the process's default logger, and its servers' ports are FreePort's.
func TestBucketsWaitedForAtStart(t *testing.T) {
	_, js, ctx := startCluster3(t)
	var mu sync.Mutex
	vanished := map[string]bool{}
	store.SetAfterOpen(func(bucket string) { // each bucket vanishes once, right after it was opened
		mu.Lock()
		defer mu.Unlock()
		if !vanished[bucket] {
			vanished[bucket] = true
			if err := js.DeleteKeyValue(ctx, bucket); err != nil {
				t.Errorf("delete %s: %v", bucket, err)
			}
		}
	})
	defer store.SetAfterOpen(nil)
	b, err := store.OpenBuckets(ctx, js)
	if err != nil {
		t.Fatalf("a bucket gone between open and use: %v", err)
	}
	if len(vanished) != 7 {
		t.Fatalf("the fault hit %d buckets, want 7: %v", len(vanished), vanished)
	}
	for _, kv := range []jetstream.KeyValue{b.Jobs, b.Placement, b.Runtimes, b.Handover, b.Leader, b.Policy, b.Assign} {
		if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
			t.Errorf("%s after start: %v", kv.Bucket(), err)
		}
	}

	// Deleted after it was opened: the watch waits for it, and follows it once it is back.
	waiting := make(chan struct{})
	prev := slog.Default()
	slog.SetDefault(slog.New(&signalHandler{msg: "NATS is not ready; retrying", attr: "watch of bucket " + wire.HandoverBucket, hit: sync.OnceFunc(func() { close(waiting) })}))
	defer slog.SetDefault(prev)
	if err := js.DeleteKeyValue(ctx, wire.HandoverBucket); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wctx, stop := context.WithCancel(ctx)
	defer func() { stop(); wg.Wait() }()
	got := make(chan string, 1)
	followed := make(chan error, 1)
	wg.Go(func() {
		ready, err := store.Follow(wctx, js, b.Handover, ">", &wg, func(e jetstream.KeyValueEntry) { got <- e.Key() })
		if err == nil {
			<-ready
		}
		followed <- err
	})
	select { // it waits...
	case <-waiting:
	case err := <-followed:
		t.Fatalf("a watch of a bucket deleted meanwhile did not wait: %v", err)
	}
	if _, err := store.OpenBuckets(ctx, js); err != nil { // ...until the next component to start creates it
		t.Fatal(err)
	}
	if err := <-followed; err != nil {
		t.Fatalf("a watch of a bucket deleted meanwhile: %v", err)
	}
	if _, err := b.Handover.Put(ctx, "after", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if k := <-got; k != "after" {
		t.Fatalf("the watch delivered %q", k)
	}
}

// signalHandler calls hit on the first record with message msg and an attribute of value attr.
type signalHandler struct {
	msg, attr string
	hit       func()
}

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *signalHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *signalHandler) WithGroup(string) slog.Handler            { return h }
func (h *signalHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		r.Attrs(func(a slog.Attr) bool {
			if a.Value.String() == h.attr {
				h.hit()
			}
			return true
		})
	}
	return nil
}

// On a cluster, a bucket whose store a server cannot create at first is created once it can: a
// server enabling JetStream for an account removes the account's empty directory, and a stream
// being created in it at that moment failed with "error creating store for stream", which made a
// component exit at start. Here a file stands where one bucket's store directory goes on every
// server: the first creation fails with that error (the servers then remove the path themselves;
// the test removes any left at the first retry). Not parallel: it listens to the process's default
// logger.
func TestBucketStoreFailureWaitedFor(t *testing.T) {
	c, js, ctx := startCluster3(t)
	var blocks []string
	for i := range 3 {
		dir := filepath.Join(c.Node(i).JetStreamConfig().StoreDir, server.DEFAULT_GLOBAL_ACCOUNT, "streams")
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		block := filepath.Join(dir, "KV_"+wire.JobsBucket)
		if err := os.WriteFile(block, nil, 0o640); err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, block)
	}
	retried := make(chan struct{})
	prev := slog.Default()
	slog.SetDefault(slog.New(&signalHandler{msg: "NATS is not ready; retrying", attr: "bucket " + wire.JobsBucket, hit: sync.OnceFunc(func() {
		for _, b := range blocks { // the server may have removed the failed store's path itself
			if err := os.Remove(b); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Error(err)
			}
		}
		close(retried)
	})}))
	defer slog.SetDefault(prev)
	kv, err := store.EnsureKV(ctx, js, jetstream.KeyValueConfig{Bucket: wire.JobsBucket, Replicas: 3, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatalf("a bucket whose store could not be created at first: %v", err)
	}
	select {
	case <-retried:
	default:
		t.Fatal("the bucket was created without a retry: the fault did not hit")
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

// startCluster3 starts a 3-node cluster (skipped with -short) and connects to it; ctx ends with the
// test, or after a minute.
func startCluster3(t *testing.T) (*testutil.Cluster, jetstream.JetStream, context.Context) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	c := testutil.StartCluster(t, 3)
	_, js := testutil.Connect(t, c.URLs())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c, js, ctx
}
