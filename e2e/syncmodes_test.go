package e2e

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

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

	applied := testutil.RecordApplied(t, nc, asp.Spec.ID)

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
			if _, ok := killRandomRuntime(rng); ok {
				kills++
			}
		}
	}()
	var wg sync.WaitGroup
	var sspUse, aspUse []testutil.AsyncUse
	pause := func(r int) time.Duration { return time.Duration(5+20*(r/2)) * time.Millisecond } // rank 2 slower
	wg.Add(2)
	go func() { defer wg.Done(); sspUse = testutil.TrainAsync(t, nn.url(), ssp, steps, pause) }()
	go func() { defer wg.Done(); aspUse = testutil.TrainAsync(t, nn.url(), asp, steps, pause) }()
	wg.Wait()
	close(done)
	if t.Failed() {
		return
	}
	t.Logf("%d runtime SIGKILLs during training", kills)

	// ssp: recompute every gradient from the versions recorded.
	want := testutil.ReplaySSP(t, ssp, steps, testutil.VersionsOf(sspUse))
	got := testutil.ParamsAt(t, testutil.DirectGetter(nc, wire.ParamsStream(ssp.Spec.ID)), ssp, steps)
	if !bytes.Equal(f32bytes(got), f32bytes(want)) {
		t.Fatal("ssp: the parameters differ from the reference replayed from the recorded versions")
	}

	// asp: apply the same gradients in the order the shards applied them.
	final := testutil.ParamsAt(t, testutil.DirectGetter(nc, wire.ParamsStream(asp.Spec.ID)), asp, 3*steps)
	want, _ = testutil.ReplayASP(t, asp, 3*steps, applied, testutil.VersionsOf(aspUse))
	if !bytes.Equal(f32bytes(final), f32bytes(want)) {
		t.Fatal("asp: the parameters differ from the reference applying the gradients in the shards' order")
	}
	t.Logf("ssp (s = 2) and asp, %d steps of 3 ranks each, byte-identical across %d runtime SIGKILLs", steps, kills)
}
