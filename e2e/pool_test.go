package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
)

// TestProcessPoolSurvivesStopAndKill runs the gateway, the placer and three runtimes as separate
// fanin processes against one NATS server with file storage, and trains a job with four SDK
// workers. Mid-training one runtime is stopped with SIGTERM (it checkpoints and hands its shards
// over) and later another is killed with SIGKILL (its shards are recovered from checkpoints and
// the replayed stream by the survivors). Every step's parameters equal the reference byte for byte.
func TestProcessPoolSurvivesStopAndKill(t *testing.T) {
	t.Parallel()
	skipShort(t)
	url := testutil.NATS(t)

	gw := start(t, "gateway", "gateway", "--nats", url, "--http", "127.0.0.1:0")
	api := gw.waitFor(t, httpURL, 20*time.Second)
	start(t, "placer", "autoscaler", "--nats", url)
	rts := map[string]*proc{}
	for _, id := range []string{"rt-0", "rt-1", "rt-2"} {
		rts[id] = start(t, id, "runtime", "--nats", url, "--id", id)
	}

	ctx := context.Background()
	spec := job.Spec{
		ID:        "pool",
		Tensors:   []job.Tensor{{Name: "w", Shape: []int{96, 64}}, {Name: "b", Shape: []int{64}}},
		Ranks:     4,
		Function:  job.Function{Name: "adam", Hyper: map[string]float64{"lr": 0.01}},
		Init:      job.Init{Kind: "uniform", Seed: 11, Scale: 0.1},
		ShardSize: 4 << 10,
		Storage:   "file",
	}
	rec, err := sdk.NewAdmin(api).CreateJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	workers := make([]*sdk.Worker, 4)
	for r := range workers {
		c, err := sdk.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if workers[r], err = c.Worker(ctx, rec.Spec.ID, r); err != nil {
			t.Fatal(err)
		}
	}
	_, init, err := workers[0].Params(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fn, _ := rec.Spec.NewFunc()
	ref := functions.NewReference(fn, 4, rec.Layout.Ranges(), init)
	params := append([]float32(nil), init...)
	grads := make([][]float32, 4)
	for r := range grads {
		grads[r] = make([]float32, len(params))
	}
	const steps = 40
	for step := int64(1); step <= steps; step++ {
		switch step {
		case 11:
			rts["rt-1"].stop(syscall.SIGTERM)
			if err := rts["rt-1"].err; err != nil {
				t.Fatalf("rt-1 did not exit cleanly on SIGTERM: %v\n%s", err, rts["rt-1"].output())
			}
		case 26:
			rts["rt-2"].stop(syscall.SIGKILL)
			rts["rt-3"] = start(t, "rt-3", "runtime", "--nats", url, "--id", "rt-3")
		}
		for r := range workers {
			testutil.Gradient(grads[r], params, step, r)
		}
		results := make([][]float32, 4)
		errs := make([]error, 4)
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		var wg sync.WaitGroup
		for r, w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[r], errs[r] = w.Step(sctx, grads[r])
			}()
		}
		wg.Wait()
		cancel()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		ref.Step(grads, nil)
		for r := range results {
			if !bytes.Equal(f32bytes(results[r]), f32bytes(ref.Params())) {
				t.Fatalf("step %d: rank %d's parameters differ from the reference", step, r)
			}
		}
		params = append(params[:0], results[0]...)
	}
	if out := rts["rt-0"].output(); !regexp.MustCompile(`runtime started`).MatchString(out) {
		t.Fatalf("rt-0 output lacks its start line:\n%s", out)
	}
	fmt.Fprintln(testWriter{t}, "trained", steps, "steps bit-exact across a SIGTERM and a SIGKILL")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimSpace(p)))
	return len(p), nil
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	functions.EncodeLE(b, v)
	return b
}
