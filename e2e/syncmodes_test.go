package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/internal/testutil"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// asyncUse is one gradient a worker of an ssp or asp job published: the versions, per shard, of
// the parameters it was computed from.
type asyncUse struct {
	rank     int
	step     int64
	versions []int64
}

// TestSyncModesRuntimeKills trains an ssp job (s = 2, Adam, one slow worker) and an asp job (Adam)
// side by side while runtime processes are SIGKILLed, and checks both against the reference replayed
// from what the workers recorded (ssp: the versions each gradient was computed from) and from the
// order the shards applied the gradients in (asp: the parameters' Fanin-Applied headers, as an
// observer saw them). The restores replay held gradients and per-rank steps: a decision taken
// differently on replay would change the bits.
func TestSyncModesRuntimeKills(t *testing.T) {
	skipShort(t)
	nn := startNATS(t, 1)
	f := startFanin(t, nn, 1)
	nc, err := nats.Connect(nn.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	mk := func(id, mode string, s int) *job.Record {
		spec := clusterSpec(id, "adam")
		spec.Ranks, spec.Sync, spec.Staleness = 3, mode, s
		var rec *job.Record
		testutil.CheckFor(t, 60*time.Second, 250*time.Millisecond, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := sdk.NewAdmin(f.api).CreateJob(ctx, spec)
			rec = r
			return err
		})
		return rec
	}
	ssp, asp := mk("ssp-kills", "ssp", 2), mk("asp-kills", "asp", 0)

	var omu sync.Mutex
	order := map[int]map[int64]string{} // asp: shard -> version -> "rank.step"
	sub, err := nc.Subscribe(wire.ParamsWildcard(asp.Spec.ID), func(m *nats.Msg) {
		shard, _ := wire.ShardFromSubject(m.Subject)
		v, _ := wire.ParseStep(m.Header)
		omu.Lock()
		defer omu.Unlock()
		if order[shard] == nil {
			order[shard] = map[int64]string{}
		}
		if old, ok := order[shard][v]; ok && old != m.Header.Get(wire.HdrApplied) {
			t.Errorf("asp shard %d version %d published as %s and, after a restore, as %s", shard, v, old, m.Header.Get(wire.HdrApplied))
		}
		order[shard][v] = m.Header.Get(wire.HdrApplied)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = sub.SetPendingLimits(-1, -1)

	const steps = 80
	done := make(chan struct{})
	var kills int
	go func() { // SIGKILL a runtime every 200-500 ms until the workers are done
		rng := rand.New(rand.NewPCG(3, 4))
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Duration(200+rng.IntN(300)) * time.Millisecond):
			}
			ids := slices.Sorted(func(yield func(string) bool) {
				for id := range runtimePids() {
					if !yield(id) {
						return
					}
				}
			})
			if len(ids) == 0 {
				continue
			}
			for _, pid := range runtimePids()[ids[rng.IntN(len(ids))]] {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			kills++
		}
	}()
	var wg sync.WaitGroup
	var sspUse, aspUse []asyncUse
	wg.Add(2)
	go func() { defer wg.Done(); sspUse = trainAsyncWorkers(t, nn.url(), ssp, steps) }()
	go func() { defer wg.Done(); aspUse = trainAsyncWorkers(t, nn.url(), asp, steps) }()
	wg.Wait()
	close(done)
	if t.Failed() {
		return
	}
	t.Logf("%d runtime SIGKILLs during training", kills)

	// ssp: recompute every gradient from the versions recorded.
	p0 := make([]float32, ssp.Layout.Elements)
	ssp.Spec.InitShard(0, p0)
	fn, _ := ssp.Spec.NewFunc()
	ref := functions.NewReference(fn, 3, ssp.Layout.Ranges(), p0)
	history := [][]float32{slices.Clone(p0)}
	byStep := map[string][]int64{}
	for _, u := range sspUse {
		byStep[fmt.Sprint(u.rank, ".", u.step)] = u.versions
	}
	g := make([][]float32, 3)
	for r := range g {
		g[r] = make([]float32, len(p0))
	}
	mixed := make([]float32, len(p0))
	for s := int64(1); s <= steps; s++ {
		for r := range g {
			for i, sh := range ssp.Layout.Shards {
				v := byStep[fmt.Sprint(r, ".", s)][i]
				copy(mixed[sh.Off:sh.Off+sh.Len], history[v][sh.Off:sh.Off+sh.Len])
			}
			testutil.Gradient(g[r], mixed, s, r)
		}
		ref.Step(g, nil)
		history = append(history, slices.Clone(ref.Params()))
	}
	got := testutil.ParamsAt(t, testutil.DirectGetter(nc, wire.ParamsStream(ssp.Spec.ID)), ssp, steps)
	if !bytes.Equal(f32bytes(got), f32bytes(ref.Params())) {
		t.Fatal("ssp: the parameters differ from the reference replayed from the recorded versions")
	}

	// asp: apply the same gradients in the order the shards applied them.
	final := testutil.ParamsAt(t, testutil.DirectGetter(nc, wire.ParamsStream(asp.Spec.ID)), asp, 3*steps)
	aref := functions.NewReference(fn, 3, asp.Layout.Ranges(), p0)
	byStep = map[string][]int64{}
	for _, u := range aspUse {
		byStep[fmt.Sprint(u.rank, ".", u.step)] = u.versions
	}
	grad := make([]float32, len(p0))
	omu.Lock()
	defer omu.Unlock()
	for i := range asp.Layout.Shards {
		hist := [][]float32{slices.Clone(p0)}
		for v := int64(1); v <= 3*steps; v++ {
			applied, ok := order[i][v]
			if !ok {
				t.Fatalf("asp shard %d: version %d was never seen", i, v)
			}
			rs, ss, _ := strings.Cut(applied, ".")
			rank, _ := strconv.Atoi(rs)
			step, _ := strconv.ParseInt(ss, 10, 64)
			versions, ok := byStep[applied]
			if !ok {
				t.Fatalf("asp shard %d version %d: %q applied, recorded by no worker", i, v, applied)
			}
			testutil.Gradient(grad, hist[versions[i]], step, rank) // elementwise: shard i's slice needs shard i's version only
			aref.ApplyRank(i, grad, 1)
			hist = append(hist, slices.Clone(aref.Params()))
		}
	}
	if !bytes.Equal(f32bytes(final), f32bytes(aref.Params())) {
		t.Fatal("asp: the parameters differ from the reference applying the gradients in the shards' order")
	}
	t.Logf("ssp (s = 2) and asp, %d steps of 3 ranks each, byte-identical across %d runtime SIGKILLs", steps, kills)
}

// trainAsyncWorkers runs the ranks of an ssp or asp job, rank 2 slower, and returns what they used.
func trainAsyncWorkers(t *testing.T, url string, rec *job.Record, steps int64) []asyncUse {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var mu sync.Mutex
	var out []asyncUse
	var wg sync.WaitGroup
	for r := range rec.Spec.Ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := sdk.Connect(ctx, url)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			w, err := c.Worker(ctx, rec.Spec.ID, r)
			if err != nil {
				t.Error(err)
				return
			}
			defer w.Close()
			_, params, err := w.Params(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			g := make([]float32, len(params))
			for s := int64(1); s <= steps; s++ {
				u := asyncUse{rank: r, step: s, versions: w.Versions()}
				testutil.Gradient(g, params, s, r)
				if params, err = w.Step(ctx, g); err != nil {
					t.Errorf("%s rank %d step %d: %v", rec.Spec.ID, r, s, err)
					return
				}
				mu.Lock()
				out = append(out, u)
				mu.Unlock()
				time.Sleep(time.Duration(5+20*(r/2)) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	return out
}
