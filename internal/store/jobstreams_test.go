package store_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// TestJobStreamStoreFailureRetried: a file-storage job's gradient stream whose store a server
// cannot create at first (its path taken by a file, as when the server removes an account's
// directory under a creation) is created again, and the job's streams are all there; without the
// retry, creating the job fails with JetStream's "error creating store for stream".
func TestJobStreamStoreFailureRetried(t *testing.T) {
	c, js, ctx := startCluster3(t)
	spec := job.Spec{
		ID:        "stored",
		Tensors:   []job.Tensor{{Name: "w", Shape: []int{1000}}},
		Ranks:     2,
		Function:  job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}},
		Init:      job.Init{Kind: "upload"},
		ShardSize: 4 << 10,
		Storage:   "file",
	}
	spec.Normalize()
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	rec := job.NewRecord(spec, time.Now())
	var blocks []string
	for i := range 3 {
		dir := filepath.Join(c.Node(i).JetStreamConfig().StoreDir, server.DEFAULT_GLOBAL_ACCOUNT, "streams")
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		block := filepath.Join(dir, wire.GradStream(spec.ID))
		if err := os.WriteFile(block, nil, 0o640); err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, block)
	}
	var retried []string
	store.SetOnStoreRace(func(stream string) {
		retried = append(retried, stream)
		for _, b := range blocks { // the server may have removed the failed store's path itself
			if err := os.Remove(b); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Error(err)
			}
		}
	})
	t.Cleanup(func() { store.SetOnStoreRace(nil) })
	if err := store.CreateJobStreams(ctx, js, &rec, 1<<20, nil); err != nil {
		t.Fatalf("the streams of a job whose gradient store could not be created at first: %v", err)
	}
	if len(retried) == 0 || retried[0] != wire.GradStream(spec.ID) {
		t.Fatalf("created again: %v; want the gradient stream: the fault did not hit", retried)
	}
	for _, name := range []string{wire.GradStream(spec.ID), wire.ParamsStream(spec.ID), wire.InitStream(spec.ID)} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if st.CachedInfo().Config.Storage.String() != "File" {
			t.Errorf("stream %s: %s storage, want file", name, st.CachedInfo().Config.Storage)
		}
	}
	if _, err := js.Publish(ctx, wire.GradSubject(spec.ID, 0), []byte("g")); err != nil {
		t.Errorf("a gradient to the stream created again: %v", err)
	}
}
