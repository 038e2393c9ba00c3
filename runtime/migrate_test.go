package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/runtime"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// placer writes placement as the autoscaler would: compare-and-set, epoch+1, naming the owner.
type placer struct {
	kv jetstream.KeyValue
}

func (p placer) place(t testing.TB, key, runtime string) {
	t.Helper()
	ctx := context.Background()
	e, err := p.kv.Get(ctx, key)
	var old wire.Placement
	var rev uint64
	if err == nil {
		_ = json.Unmarshal(e.Value(), &old)
		rev = e.Revision()
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatal(err)
	}
	val, _ := json.Marshal(wire.Placement{Runtime: runtime, Epoch: old.Epoch + 1, From: old.Runtime})
	if rev == 0 {
		_, err = p.kv.Create(ctx, key, val)
	} else {
		_, err = p.kv.Update(ctx, key, val, rev)
	}
	if err != nil {
		t.Fatalf("place %s on %s: %v", key, runtime, err)
	}
}

// movableJob starts two runtimes without an autoscaler (the test writes the placement), creates
// the job, and joins one worker per rank.
func movableJob(tb testing.TB, spec job.Spec) (*devstack.Stack, placer, *job.Record, []*sdk.Worker) {
	tb.Helper()
	ctx := context.Background()
	st, _, pl := placeableStack(tb)
	rec, err := st.Gateway.CreateJob(ctx, spec)
	if err != nil {
		tb.Fatal(err)
	}
	return st, pl, rec, rankWorkers(tb, rec.Spec.ID, spec.Ranks, func(int) string { return st.URL })
}

// placeableStack starts two runtimes without an autoscaler, for a test that writes the placement
// itself (placer), and returns a connection's JetStream to the stack; all end with the test.
func placeableStack(tb testing.TB) (*devstack.Stack, jetstream.JetStream, placer) {
	tb.Helper()
	return placeableStackOf(tb, 2)
}

// placeableStackOf is placeableStack with runtimes rt-0 .. rt-<runtimes-1>.
func placeableStackOf(tb testing.TB, runtimes int) (*devstack.Stack, jetstream.JetStream, placer) {
	tb.Helper()
	st, err := devstack.Start(context.Background(), devstack.Config{
		DataDir: tb.TempDir(), NATSPort: -1, Runtimes: runtimes, NoAutoscaler: true, Logger: testutil.Logger(),
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(st.Close)
	nc, err := nats.Connect(st.URL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	b, err := store.OpenBuckets(context.Background(), js)
	if err != nil {
		tb.Fatal(err)
	}
	return st, js, placer{b.Placement}
}

// TestMigrationsDuringTraining moves shards between two runtimes while four workers train, at
// random moments inside steps. Every step's parameters equal the reference byte for byte, the
// runtimes together apply exactly steps x shards updates, and every move is a measured handover.
func TestMigrationsDuringTraining(t *testing.T) {
	t.Parallel()
	for _, fn := range []string{"sgd", "adam"} {
		t.Run(fn, func(t *testing.T) { t.Parallel(); testMigrations(t, fn) }) // a stack each
	}
}

func testMigrations(t *testing.T, fn string) {
	st, pl, rec, workers := movableJob(t, testSpec("mig-"+fn, fn, map[string]float64{"lr": 0.05}))
	ctx := context.Background()
	rts := []string{"rt-0", "rt-1"}
	for _, s := range rec.Layout.Shards {
		pl.place(t, wire.PlacementKey(rec.Spec.ID, s.ID), rts[s.ID%2])
	}
	_, init, err := workers[0].Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(f, 4, rec.Layout.Ranges(), init)
	params := slices.Clone(init)
	grads := make([][]float32, 4)
	for r := range grads {
		grads[r] = make([]float32, len(params))
	}
	owner := map[int]string{}
	for _, s := range rec.Layout.Shards {
		owner[s.ID] = rts[s.ID%2]
	}
	rng := rand.New(rand.NewPCG(3, 4))
	const steps = 40
	moves := 0
	for step := int64(1); step <= steps; step++ {
		for r := range workers {
			testutil.Gradient(grads[r], params, step, r)
		}
		results := make([][]float32, 4)
		errs := make([]error, 4)
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var wg sync.WaitGroup
		late := time.Duration(rng.IntN(3)) * time.Millisecond
		for r, w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r == 3 { // the last rank arrives late, so moves land in the middle of steps
					time.Sleep(late)
				}
				results[r], errs[r] = w.Step(sctx, grads[r])
			}()
		}
		if step%3 == 0 { // move two shards while the step is under way
			for range 2 {
				id := rng.IntN(rec.Layout.NumShards())
				to := rts[0]
				if owner[id] == to {
					to = rts[1]
				}
				pl.place(t, wire.PlacementKey(rec.Spec.ID, id), to)
				owner[id] = to
				moves++
			}
		}
		wg.Wait()
		cancel()
		checkStep(t, step, ref, grads, results, errs)
		params = append(params[:0], results[0]...)
	}

	var applied, migrations int64
	var pauses []time.Duration
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		applied, migrations, pauses = 0, 0, nil
		for _, rt := range st.AllRuntimes() {
			s := rt.Stats()
			applied += s.Invocations
			migrations += s.Migrations
			pauses = append(pauses, s.Pauses...)
		}
		if want := int64(steps * rec.Layout.NumShards()); applied != want {
			return fmt.Errorf("runtimes applied %d updates, want exactly %d", applied, want)
		}
		// Moves of one shard in quick succession coalesce: an owner moved on before it served
		// passes the shard on without a handover of its own.
		if migrations < int64(moves)/2 {
			return fmt.Errorf("%d handovers measured for %d moves", migrations, moves)
		}
		return nil
	})
	slices.Sort(pauses)
	t.Logf("%s: %d moves, %d handovers; pause p50 %v, max %v", fn, moves, migrations, pauses[len(pauses)/2], pauses[len(pauses)-1])
}

// BenchmarkMigrationPause moves a 1 MiB shard between two runtimes at step boundaries while two
// workers train, and reports the handover pause (old owner stops -> new owner serves) p50 and p99.
func BenchmarkMigrationPause(b *testing.B) {
	for _, fn := range []string{"sgd", "adam"} {
		b.Run("fn="+fn+",Shard=1MiB", func(b *testing.B) { benchMigration(b, fn) })
	}
}

func benchMigration(b *testing.B, fn string) {
	spec := testSpec("pause-"+fn, fn, map[string]float64{"lr": 0.01})
	spec.Ranks = 2
	spec.Tensors = []job.Tensor{{Name: "w", Shape: []int{1 << 18}}} // 1 MiB: one shard
	spec.ShardSize = 1 << 20
	st, pl, rec, workers := movableJob(b, spec)
	ctx := context.Background()
	key := wire.PlacementKey(rec.Spec.ID, 0)
	pl.place(b, key, "rt-0")
	grads := make([]float32, 1<<18)
	step := func() {
		var wg sync.WaitGroup
		for _, w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := w.Step(ctx, grads); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	step()
	owner := 0
	for b.Loop() {
		owner = 1 - owner
		pl.place(b, key, fmt.Sprintf("rt-%d", owner))
		step() // completes only once the new owner serves
	}
	var pauses []time.Duration
	for _, rt := range st.AllRuntimes() {
		pauses = append(pauses, rt.Stats().Pauses...)
	}
	if len(pauses) == 0 {
		b.Fatal("no handover measured")
	}
	slices.Sort(pauses)
	b.ReportMetric(float64(pauses[len(pauses)/2].Microseconds())/1000, "p50-pause-ms")
	b.ReportMetric(float64(pauses[len(pauses)*99/100].Microseconds())/1000, "p99-pause-ms")
	b.ReportMetric(float64(len(pauses)), "handovers")
}

// TestRapidMovesKeepTheChain moves a stateful shard back and forth at the start of every step, so
// an owner is often told to move on before it ever served the shard. The handover chain must hold:
// an owner releases only after its predecessor did, so nobody restores a checkpoint older than the
// newest one (which would strand it behind gradients already purged).
//
// It also catches a placement watcher that misses revisions: with one revision of history, a
// runtime that fell behind saw only the newest entry, never started the shard placed on it, and so
// never released it (about one run in five stalled).
func TestRapidMovesKeepTheChain(t *testing.T) {
	t.Parallel()
	spec := testSpec("chain", "adam", map[string]float64{"lr": 0.01})
	spec.Ranks = 2
	spec.Tensors = []job.Tensor{{Name: "w", Shape: []int{1 << 14}}}
	spec.ShardSize = 64 << 10
	_, pl, rec, workers := movableJob(t, spec)
	ctx := context.Background()
	key := wire.PlacementKey(rec.Spec.ID, 0)
	grads := make([]float32, 1<<14)
	for i := range 150 {
		pl.place(t, key, fmt.Sprintf("rt-%d", i%2))
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r, w := range workers {
			wg.Add(1)
			go func() { defer wg.Done(); _, errs[r] = w.Step(sctx, grads) }()
		}
		wg.Wait()
		cancel()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("move %d: %v", i, err)
		}
	}
}

// TestUnservedPlacementIsReleased: a runtime named as the shard's previous owner, though it never
// served the shard (here it restarts under the same id after the shard was placed on it and moved
// on), writes the handover its successor waits for instead of leaving it waiting forever.
func TestUnservedPlacementIsReleased(t *testing.T) {
	t.Parallel()
	st, pl, key, workers := oneShardJob(t, "unserved", 2)
	ctx := context.Background()
	step := func(what string) { t.Helper(); stepAll(t, workers, 1<<12, 20*time.Second, what) }
	pl.place(t, key, "rt-0")
	step("step on rt-0")

	// rt-2 is registered (alive, as after a restart) but its runtime is not running yet.
	b := stackBuckets(t, st)
	info, _ := json.Marshal(wire.RuntimeInfo{ID: "rt-2", Cores: 1, Started: time.Now().UTC(), Beat: time.Now().UTC()})
	if _, err := b.Runtimes.Put(ctx, "rt-2", info); err != nil {
		t.Fatal(err)
	}
	pl.place(t, key, "rt-2")                    // rt-0 releases to rt-2, which does not serve it
	pl.place(t, key, "rt-1")                    // rt-1 waits for rt-2's release
	if _, err := st.AddRuntime(1); err != nil { // rt-2 comes up and finds itself named as From
		t.Fatal(err)
	}
	// The chain completes: rt-2 releases epoch 3 (rt-0 may serve a step or two before it lets go).
	awaitHandover(t, b, key, "rt-2", 3, 20*time.Second)
	step("step on rt-1 after the unserved hop")
	if got := st.Runtimes()[1].Shards(); len(got) != 1 || got[0] != key {
		t.Fatalf("rt-1 serves %v, want %s", got, key)
	}
}

// TestFailedStartIsRetried: a shard placed on a runtime that cannot start it yet (here its job's
// streams do not exist for a moment) is started once it can, without another placement change.
func TestFailedStartIsRetried(t *testing.T) {
	t.Parallel()
	st, err := devstack.Start(context.Background(), devstack.Config{
		DataDir: t.TempDir(), NATSPort: -1, Runtimes: 1, NoAutoscaler: true, Logger: testutil.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	nc, err := st.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	b, err := store.OpenBuckets(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	spec := testSpec("late-streams", "sgd", map[string]float64{"lr": 0.1})
	spec.Normalize()
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	rec := job.NewRecord(spec, time.Now())
	val, _ := json.Marshal(rec)
	if _, err := b.Jobs.Put(ctx, spec.ID, val); err != nil {
		t.Fatal(err)
	}
	key := wire.PlacementKey(spec.ID, 0)
	placer{b.Placement}.place(t, key, "rt-0")
	rt := st.Runtimes()[0]
	testutil.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { // no streams yet
		if n := rt.Stats().StartRetries; n == 0 {
			return errors.New("the shard's start has not failed yet")
		}
		return nil
	})
	if err := store.CreateJobStreams(ctx, js, &rec, nc.MaxPayload(), nil); err != nil {
		t.Fatal(err)
	}
	if err := store.PublishInitial(ctx, js, &rec); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := rt.Shards(); len(got) != 1 || got[0] != key {
			return fmt.Errorf("rt-0 serves %v, want %s", got, key)
		}
		return nil
	})
}

// TestHandoverRecordedAfterFailures: a runtime whose handover record cannot be written at first
// (its requests time out behind a full link) writes it again until it is stored. Its successor
// serves only once it finds the record or finds the runtime gone, and the runtime is not gone:
// given up on, the record held the shard, and the job's steps, until a runtime was stopped by hand.
func TestHandoverRecordedAfterFailures(t *testing.T) {
	t.Parallel()
	st, pl, key, workers := oneShardJob(t, "handover-retry", 2)
	step := func(what string) { t.Helper(); stepAll(t, workers, 1<<12, 30*time.Second, what) }
	pl.place(t, key, "rt-0")
	step("step on rt-0")

	const failures = 3
	var mu sync.Mutex
	writes := 0
	undo := runtime.FailHandovers(key, func() error {
		mu.Lock()
		defer mu.Unlock()
		if writes++; writes <= failures {
			return fmt.Errorf("write %d of the handover record: %w", writes, context.DeadlineExceeded)
		}
		return nil
	})
	defer undo()
	pl.place(t, key, "rt-1")
	// rt-0 stores the record of epoch 2 in the end (given up on, it never would: rt-1 would wait for
	// it, alive, for good); then rt-1 serves the next step.
	awaitHandover(t, stackBuckets(t, st), key, "rt-0", 2, 30*time.Second)
	mu.Lock()
	n := writes
	mu.Unlock()
	if n != failures+1 {
		t.Fatalf("the handover record was written %d times, want %d (%d failed, then stored)", n, failures+1, failures)
	}
	step("step on rt-1 after the handover's failed writes")
	if got := st.Runtimes()[1].Shards(); len(got) != 1 || got[0] != key {
		t.Fatalf("rt-1 serves %v, want %s", got, key)
	}
	if got := st.Runtimes()[0].Shards(); len(got) != 0 {
		t.Fatalf("rt-0 still serves %v", got)
	}
}

// TestUnwantedHandoverIsNotWritten: a handover record that could not be written is not written any
// more once the shard's placement is cleared (its job paused or deleted: the gateway clears the
// records too). Written late, it would come back among the cleared ones, and a later move to its
// epoch would find it and serve without waiting for the real previous owner.
func TestUnwantedHandoverIsNotWritten(t *testing.T) {
	t.Parallel()
	_, pl, key, workers := oneShardJob(t, "handover-unwanted", 1)
	ctx := context.Background()
	pl.place(t, key, "rt-0")
	stepAll(t, workers, 1<<12, 30*time.Second, "step on rt-0")

	var mu sync.Mutex
	writes := 0
	first := make(chan struct{})
	undo := runtime.FailHandovers(key, func() error {
		mu.Lock()
		defer mu.Unlock()
		if writes++; writes == 1 {
			close(first)
		}
		return fmt.Errorf("write %d of the handover record: %w", writes, context.DeadlineExceeded)
	})
	defer undo()
	pl.place(t, key, "rt-1")
	<-first
	if err := pl.kv.Delete(ctx, key); err != nil { // as the gateway does when the job pauses
		t.Fatal(err)
	}
	mu.Lock()
	before := writes
	mu.Unlock()
	// Unchecked, the retries (100, 200, 400, 800 ms apart, and on) would write again three times
	// or more in this time; checked, at most the one already under way.
	time.Sleep(3 * time.Second)
	mu.Lock()
	after := writes
	mu.Unlock()
	if after-before > 1 {
		t.Fatalf("the handover record was written %d more times after its placement was cleared, want at most 1", after-before)
	}
}

// oneShardJob is movableJob of an adam job of 4096 elements in one shard, with ranks workers; it
// returns the shard's placement key. stepAll steps it.
func oneShardJob(t *testing.T, id string, ranks int) (*devstack.Stack, placer, string, []*sdk.Worker) {
	t.Helper()
	spec := testSpec(id, "adam", map[string]float64{"lr": 0.01})
	spec.Ranks = ranks
	spec.Tensors = []job.Tensor{{Name: "w", Shape: []int{1 << 12}}}
	spec.ShardSize = 16 << 10 // one shard
	st, pl, rec, workers := movableJob(t, spec)
	return st, pl, wire.PlacementKey(rec.Spec.ID, 0), workers
}

// stackBuckets opens fanin's buckets over a connection of the test's to st.
func stackBuckets(t *testing.T, st *devstack.Stack) *store.Buckets {
	t.Helper()
	_, js := testutil.Connect(t, st.URL)
	b, err := store.OpenBuckets(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// awaitHandover waits up to wait for shard key's handover record to be from's release of epoch.
func awaitHandover(t *testing.T, b *store.Buckets, key, from string, epoch uint64, wait time.Duration) {
	t.Helper()
	testutil.CheckFor(t, wait, 20*time.Millisecond, func() error {
		e, err := b.Handover.Get(context.Background(), key)
		if err != nil {
			return err
		}
		var h wire.Handover
		if err := json.Unmarshal(e.Value(), &h); err != nil || h.From != from || h.Epoch != epoch {
			return fmt.Errorf("handover record = %+v (%v), want epoch %d from %s", h, err, epoch, from)
		}
		return nil
	})
}

// stepAll runs one step of every worker at once, each with a zero gradient of n elements, within
// wait; it fails the test, saying what the step was, if any worker's fails.
func stepAll(t *testing.T, workers []*sdk.Worker, n int, wait time.Duration, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	errs := make([]error, len(workers))
	var wg sync.WaitGroup
	for r, w := range workers {
		wg.Go(func() { _, errs[r] = w.Step(ctx, make([]float32, n)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
