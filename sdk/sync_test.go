package sdk_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/internal/testutil"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// used is what a worker recorded of one step: the versions, per shard, of the parameters its
// gradient was computed from.
type used struct {
	rank     int
	step     int64
	versions []int64
}

// trainAsync runs ranks workers of an ssp or asp job for steps steps each, rank slow sleeping
// between steps, and returns what they recorded.
func trainAsync(t *testing.T, url string, rec *job.Record, steps int64, slow int) []used {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var mu sync.Mutex
	var all []used
	var wg sync.WaitGroup
	errs := make(chan error, rec.Spec.Ranks)
	for r := range rec.Spec.Ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := sdk.Connect(ctx, url)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			w, err := c.Worker(ctx, rec.Spec.ID, r)
			if err != nil {
				errs <- err
				return
			}
			defer w.Close()
			_, params, err := w.Params(ctx)
			if err != nil {
				errs <- err
				return
			}
			g := make([]float32, len(params))
			for s := int64(1); s <= steps; s++ {
				u := used{rank: r, step: s, versions: w.Versions()}
				testutil.Gradient(g, params, s, r)
				if params, err = w.Step(ctx, g); err != nil {
					errs <- fmt.Errorf("rank %d step %d: %w", r, s, err)
					return
				}
				if w.OwnStep() != s {
					errs <- fmt.Errorf("rank %d: own step %d after step %d", r, w.OwnStep(), s)
					return
				}
				mu.Lock()
				all = append(all, u)
				mu.Unlock()
				if r == slow {
					time.Sleep(15 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return all
}

// mix is the parameter vector whose shard i is hist[versions[i]]'s.
func mix(rec *job.Record, hist func(shard int, v int64) []float32, versions []int64) []float32 {
	p := make([]float32, rec.Layout.Elements)
	for i, s := range rec.Layout.Shards {
		copy(p[s.Off:s.Off+s.Len], hist(i, versions[i])[s.Off:s.Off+s.Len])
	}
	return p
}

// finalParams waits until every shard's newest parameters are at version want and returns them.
func finalParams(t *testing.T, url string, rec *job.Record, want int64) []float32 {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	return testutil.ParamsAt(t, testutil.DirectGetter(nc, wire.ParamsStream(rec.Spec.ID)), rec, want)
}

// TestSSPMatchesTheReplayedReference: an ssp job (s = 2) trained by three workers, one slow. The
// fast ones run ahead on stale parameters; the runtimes still sum each step in rank order, so the
// reference, recomputing every gradient from the versions the workers recorded, gives the same bits.
func TestSSPMatchesTheReplayedReference(t *testing.T) {
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := spec("ssp", "adam", 3)
	s.Function.Hyper["lr"] = 0.01
	s.Sync, s.Staleness = "ssp", 2
	rec, err := sdk.NewAdmin(st.HTTPURL).CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	const steps = 30
	rec0 := *rec
	all := trainAsync(t, st.URL, &rec0, steps, 2)

	p0 := make([]float32, rec.Layout.Elements)
	rec.Spec.InitShard(0, p0)
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 3, rec.Layout.Ranges(), p0)
	history := [][]float32{slices.Clone(p0)}
	byStep := map[[2]int64][]int64{}
	stale := 0
	for _, u := range all {
		byStep[[2]int64{int64(u.rank), u.step}] = u.versions
		if slices.Min(u.versions) < u.step-1 {
			stale++
		}
		if slices.Min(u.versions) < u.step-1-2 {
			t.Fatalf("rank %d step %d computed from versions %v: beyond the bound", u.rank, u.step, u.versions)
		}
	}
	if stale == 0 {
		t.Fatal("no gradient was computed from stale parameters: the run did not exercise ssp")
	}
	hist := func(_ int, v int64) []float32 { return history[v] }
	g := make([][]float32, 3)
	for r := range g {
		g[r] = make([]float32, len(p0))
	}
	for step := int64(1); step <= steps; step++ {
		for r := range g {
			testutil.Gradient(g[r], mix(rec, hist, byStep[[2]int64{int64(r), step}]), step, r)
		}
		ref.Step(g, nil)
		history = append(history, slices.Clone(ref.Params()))
	}
	got := finalParams(t, st.URL, rec, steps)
	if !bytes.Equal(bits(got), bits(ref.Params())) {
		t.Fatal("the ssp run differs from the reference replayed from the recorded versions")
	}
	t.Logf("%d steps, %d of %d gradients computed from stale parameters, byte-identical", steps, stale, len(all))
}

// TestASPMatchesTheStreamOrder: an asp job trained by two workers; every update is one rank's
// gradient, applied in the order the stream holds them. An observer records that order from the
// parameters' Fanin-Applied headers, and the reference applying the same gradients in that order
// gives the same bits.
func TestASPMatchesTheStreamOrder(t *testing.T) {
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := spec("asp", "adam", 2)
	s.Function.Hyper["lr"] = 0.01
	s.Sync = "asp"
	rec, err := sdk.NewAdmin(st.HTTPURL).CreateJob(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(st.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	order := map[int]map[int64]string{} // shard -> version -> "rank.step"
	sub, err := nc.Subscribe(wire.ParamsWildcard(rec.Spec.ID), func(m *nats.Msg) {
		shard, _ := wire.ShardFromSubject(m.Subject)
		v, _ := wire.ParseStep(m.Header)
		mu.Lock()
		if order[shard] == nil {
			order[shard] = map[int64]string{}
		}
		order[shard][v] = m.Header.Get(wire.HdrApplied)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = sub.SetPendingLimits(-1, -1)
	const steps = 20
	all := trainAsync(t, st.URL, rec, steps, 1)
	final := finalParams(t, st.URL, rec, 2*steps)

	p0 := make([]float32, rec.Layout.Elements)
	rec.Spec.InitShard(0, p0)
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 2, rec.Layout.Ranges(), p0)
	byStep := map[string][]int64{}
	for _, u := range all {
		byStep[fmt.Sprint(u.rank, ".", u.step)] = u.versions
	}
	n := rec.Layout.NumShards()
	history := make([][][]float32, n) // shard -> version -> the whole vector (only the shard's slice matters)
	for i := range history {
		history[i] = [][]float32{slices.Clone(p0)}
	}
	hist := func(shard int, v int64) []float32 { return history[shard][v] }
	g := make([]float32, len(p0))
	mu.Lock()
	defer mu.Unlock()
	interleaved := false
	for i := range n {
		prev := -1
		for v := int64(1); v <= 2*steps; v++ {
			applied, ok := order[i][v]
			if !ok {
				t.Fatalf("shard %d: no parameters of version %d were seen", i, v)
			}
			rs, ss, _ := strings.Cut(applied, ".")
			rank, _ := strconv.Atoi(rs)
			step, _ := strconv.ParseInt(ss, 10, 64)
			if prev >= 0 && rank != prev {
				interleaved = true
			}
			prev = rank
			versions, ok := byStep[applied]
			if !ok {
				t.Fatalf("shard %d version %d: %q was applied, no worker recorded it", i, v, applied)
			}
			// testutil.Gradient is elementwise: shard i's slice of the gradient depends on shard
			// i's parameters only, so the vector of shard i's version serves.
			testutil.Gradient(g, hist(i, versions[i]), step, rank)
			ref.ApplyRank(i, g, 1)
			history[i] = append(history[i], slices.Clone(ref.Params()))
		}
	}
	if !interleaved {
		t.Log("the two ranks' updates did not interleave on any shard")
	}
	if !bytes.Equal(bits(final), bits(ref.Params())) {
		t.Fatal("the asp run differs from the reference applying the same gradients in the stream's order")
	}
}
