package testutil

import (
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
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// AsyncUse is one gradient a worker of an ssp or asp job published: the versions, per shard, of
// the parameters it was computed from.
type AsyncUse struct {
	Rank     int
	Step     int64
	Versions []int64
}

// TrainAsync runs every rank of an ssp or asp job, each on its own connection to url, for steps
// steps of Gradient, rank r pausing pause(r) after each step, and returns what they used. A
// failure is reported with t.Errorf (TrainAsync may run off the test's goroutine): check t.Failed.
func TrainAsync(t testing.TB, url string, rec *job.Record, steps int64, pause func(rank int) time.Duration) []AsyncUse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var mu sync.Mutex
	var all []AsyncUse
	var wg sync.WaitGroup
	errs := make(chan error, rec.Spec.Ranks)
	for r := range rec.Spec.Ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := trainAsyncRank(ctx, url, rec, r, steps, pause(r), func(u AsyncUse) {
				mu.Lock()
				all = append(all, u)
				mu.Unlock()
			}); err != nil {
				errs <- fmt.Errorf("%s rank %d: %w", rec.Spec.ID, r, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return all
}

func trainAsyncRank(ctx context.Context, url string, rec *job.Record, r int, steps int64, pause time.Duration, use func(AsyncUse)) error {
	c, err := sdk.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close()
	w, err := c.Worker(ctx, rec.Spec.ID, r)
	if err != nil {
		return err
	}
	defer w.Close()
	_, params, err := w.Params(ctx)
	if err != nil {
		return err
	}
	g := make([]float32, len(params))
	for s := int64(1); s <= steps; s++ {
		u := AsyncUse{Rank: r, Step: s, Versions: w.Versions()}
		Gradient(g, params, s, r)
		if params, err = w.Step(ctx, g); err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
		if w.OwnStep() != s {
			return fmt.Errorf("own step %d after step %d", w.OwnStep(), s)
		}
		use(u)
		time.Sleep(pause)
	}
	return nil
}

// VersionsOf indexes what TrainAsync returned: the version of shard i that rank's gradient of
// step was computed from, and whether it was recorded.
func VersionsOf(uses []AsyncUse) func(rank int, step int64, shard int) (int64, bool) {
	by := map[[2]int64][]int64{}
	for _, u := range uses {
		by[[2]int64{int64(u.Rank), u.Step}] = u.Versions
	}
	return func(rank int, step int64, shard int) (int64, bool) {
		v, ok := by[[2]int64{int64(rank), step}]
		if !ok {
			return 0, false
		}
		return v[shard], true
	}
}

// Reference is the single-process reference of the job rec at its initial parameters (step 0
// of its init), over all its ranks.
func Reference(t testing.TB, rec *job.Record) *functions.Reference {
	t.Helper()
	p0 := make([]float32, rec.Layout.Elements)
	rec.Spec.InitShard(0, p0)
	fn, err := rec.Spec.NewFunc()
	if err != nil {
		t.Fatal(err)
	}
	return functions.NewReference(fn, rec.Spec.Ranks, rec.Layout.Ranges(), p0)
}

// ReplaySSP is the reference of a bsp or ssp job trained with Gradient: steps steps of every rank,
// each rank's gradient computed, shard by shard, from the reference's own parameters at the
// version version(rank, step, shard) says (Gradient is elementwise, so a shard's slice of it needs
// that shard's parameters only). It returns the reference's parameters.
func ReplaySSP(t testing.TB, rec *job.Record, steps int64, version func(rank int, step int64, shard int) (int64, bool)) []float32 {
	t.Helper()
	ranks := rec.Spec.Ranks
	ref := Reference(t, rec)
	p0 := slices.Clone(ref.Params())
	history := [][]float32{p0}
	g := make([][]float32, ranks)
	for r := range g {
		g[r] = make([]float32, len(p0))
	}
	from := make([]float32, len(p0))
	for step := int64(1); step <= steps; step++ {
		for r := range g {
			for i, sh := range rec.Layout.Shards {
				v, ok := version(r, step, i)
				if !ok {
					t.Fatalf("no version recorded for rank %d step %d shard %d", r, step, i)
				}
				copy(from[sh.Off:sh.Off+sh.Len], history[v][sh.Off:sh.Off+sh.Len])
			}
			Gradient(g[r], from, step, r)
		}
		ref.Step(g, nil)
		history = append(history, slices.Clone(ref.Params()))
	}
	return ref.Params()
}

// ReplayASP is the reference of an asp job trained with Gradient: for every shard, versions 1 to
// updates, each the gradient applied(shard, version) names ("<rank>.<step>", from the parameters'
// Fanin-Applied), computed from the shard's version version(rank, step, shard) says. It returns
// the reference's parameters and whether the updates' ranks interleaved on some shard.
func ReplayASP(t testing.TB, rec *job.Record, updates int64, applied func(shard int, v int64) (string, bool),
	version func(rank int, step int64, shard int) (int64, bool)) (params []float32, interleaved bool) {
	t.Helper()
	ref := Reference(t, rec)
	p0 := slices.Clone(ref.Params())
	g := make([]float32, len(p0))
	for i := range rec.Layout.Shards {
		hist := [][]float32{slices.Clone(p0)} // the whole vector per version; shard i's slice matters
		prev := -1
		for v := int64(1); v <= updates; v++ {
			a, ok := applied(i, v)
			if !ok {
				t.Fatalf("shard %d: no parameters of version %d were seen", i, v)
			}
			rs, ss, _ := strings.Cut(a, ".")
			rank, err1 := strconv.Atoi(rs)
			step, err2 := strconv.ParseInt(ss, 10, 64)
			if err1 != nil || err2 != nil {
				t.Fatalf("shard %d version %d: Fanin-Applied %q", i, v, a)
			}
			if prev >= 0 && rank != prev {
				interleaved = true
			}
			prev = rank
			from, ok := version(rank, step, i)
			if !ok {
				t.Fatalf("shard %d version %d: %q was applied, no worker recorded it", i, v, a)
			}
			Gradient(g, hist[from], step, rank) // elementwise: shard i's slice needs shard i's version only
			ref.ApplyRank(i, g, 1)
			hist = append(hist, slices.Clone(ref.Params()))
		}
	}
	return ref.Params(), interleaved
}

// RecordApplied follows an asp job's parameters on nc and records, per shard and version, the
// gradient that made it (Fanin-Applied). A version published again after a restore must name the
// same gradient; the test fails if it does not. The returned function reads the record.
func RecordApplied(t testing.TB, nc *nats.Conn, jobID string) func(shard int, v int64) (string, bool) {
	t.Helper()
	var mu sync.Mutex
	order := map[int]map[int64]string{}
	sub, err := nc.Subscribe(wire.ParamsWildcard(jobID), func(m *nats.Msg) {
		shard, _ := wire.ShardFromSubject(m.Subject)
		v, _ := wire.ParseStep(m.Header)
		a := m.Header.Get(wire.HdrApplied)
		mu.Lock()
		defer mu.Unlock()
		if order[shard] == nil {
			order[shard] = map[int64]string{}
		}
		if old, ok := order[shard][v]; ok && old != a {
			t.Errorf("asp shard %d version %d published as %s and, after a restore, as %s", shard, v, old, a)
		}
		order[shard][v] = a
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return func(shard int, v int64) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		a, ok := order[shard][v]
		return a, ok
	}
}
