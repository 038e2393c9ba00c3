package sdk_test

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

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

// slowRank pauses rank slow 15 ms after each step, the others not at all.
func slowRank(slow int) func(int) time.Duration {
	return func(r int) time.Duration {
		if r == slow {
			return 15 * time.Millisecond
		}
		return 0
	}
}

// TestSSPMatchesTheReplayedReference: an ssp job (s = 2) trained by three workers, one slow. The
// fast ones run ahead on stale parameters; the runtimes still sum each step in rank order, so the
// reference, recomputing every gradient from the versions the workers recorded, gives the same bits.
func TestSSPMatchesTheReplayedReference(t *testing.T) {
	t.Parallel()
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
	all := testutil.TrainAsync(t, st.URL, rec, steps, slowRank(2))
	if t.Failed() {
		t.FailNow()
	}
	stale := 0
	for _, u := range all {
		if slices.Min(u.Versions) < u.Step-1 {
			stale++
		}
		if slices.Min(u.Versions) < u.Step-1-2 {
			t.Fatalf("rank %d step %d computed from versions %v: beyond the bound", u.Rank, u.Step, u.Versions)
		}
	}
	if stale == 0 {
		t.Fatal("no gradient was computed from stale parameters: the run did not exercise ssp")
	}
	want := testutil.ReplaySSP(t, rec, steps, testutil.VersionsOf(all))
	got := finalParams(t, st.URL, rec, steps)
	if !bytes.Equal(bits(got), bits(want)) {
		t.Fatal("the ssp run differs from the reference replayed from the recorded versions")
	}
	t.Logf("%d steps, %d of %d gradients computed from stale parameters, byte-identical", steps, stale, len(all))
}

// TestASPMatchesTheStreamOrder: an asp job trained by two workers; every update is one rank's
// gradient, applied in the order the stream holds them. An observer records that order from the
// parameters' Fanin-Applied headers, and the reference applying the same gradients in that order
// gives the same bits.
func TestASPMatchesTheStreamOrder(t *testing.T) {
	t.Parallel()
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
	applied := testutil.RecordApplied(t, nc, rec.Spec.ID)
	const steps = 20
	all := testutil.TrainAsync(t, st.URL, rec, steps, slowRank(1))
	if t.Failed() {
		t.FailNow()
	}
	final := finalParams(t, st.URL, rec, 2*steps)
	want, interleaved := testutil.ReplayASP(t, rec, 2*steps, applied, testutil.VersionsOf(all))
	if !interleaved {
		t.Log("the two ranks' updates did not interleave on any shard")
	}
	if !bytes.Equal(bits(final), bits(want)) {
		t.Fatal("the asp run differs from the reference applying the same gradients in the stream's order")
	}
}
