package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
)

// burstPolicy makes a small machine's load look large: low target utilization, short windows.
const burstPolicy = `
min_runtimes: 1
max_runtimes: 4
target_utilization: 0.02
stable_window: 3s
scale_down_cooldown: 1s
panic_window: 2s
startup_grace: 1s
`

// TestBurstGrowsAndShrinksPool runs the autoscaler with the process driver: it starts 'fanin
// runtime' processes itself. A burst of three jobs training at once grows the pool beyond its
// minimum; when the jobs end, the pool drains back to one runtime.
func TestBurstGrowsAndShrinksPool(t *testing.T) {
	t.Parallel()
	skipShort(t)
	url := testutil.NATS(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(burstPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	gw := start(t, "gateway", "gateway", "--nats", url, "--http", "127.0.0.1:0")
	api := gw.waitFor(t, httpURL, 20*time.Second)
	as := start(t, "autoscaler", "autoscaler", "--nats", url, "--driver", "process", "--policy", policy,
		"--runtime-binary", faninBin, "--interval", "250ms")

	_, js := testutil.Connect(t, url)
	b, err := store.OpenBuckets(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	poolSize := func() int {
		keys, err := b.Runtimes.Keys(context.Background())
		if err != nil {
			return 0
		}
		return len(keys)
	}
	waitPool := func(want int, within time.Duration) time.Duration {
		start := time.Now()
		for time.Since(start) < within {
			if poolSize() == want {
				return time.Since(start)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("pool has %d runtimes after %v, want %d\nautoscaler:\n%s", poolSize(), within, want, as.output())
		return 0
	}
	waitPool(1, 20*time.Second)

	ctx := context.Background()
	admin := sdk.NewAdmin(api)
	var wg sync.WaitGroup
	var stoppers []*stepBarrier
	burst := time.Now()
	var peak atomic.Int64
	for j := range 3 {
		spec := job.Spec{
			ID: fmt.Sprintf("burst-%d", j), Ranks: 4, ShardSize: 256 << 10,
			Tensors:  []job.Tensor{{Name: "w", Shape: []int{1 << 20}}},
			Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.01}},
		}
		if _, err := admin.CreateJob(ctx, spec); err != nil {
			t.Fatal(err)
		}
		stopper := &stepBarrier{}
		stoppers = append(stoppers, stopper)
		for r := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := sdk.Connect(ctx, url)
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				w, err := c.Worker(ctx, spec.ID, r)
				if err != nil {
					t.Error(err)
					return
				}
				if _, _, err := w.Params(ctx); err != nil { // StepCount is the step to follow from here
					t.Error(err)
					return
				}
				grads := make([]float32, 1<<20)
				for stopper.next(w.StepCount() + 1) {
					sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
					_, err := w.Step(sctx, grads)
					cancel()
					if err != nil {
						t.Errorf("%s rank %d: %v", spec.ID, r, err)
						return
					}
				}
			}()
		}
	}
	grown := time.Duration(0)
	for time.Since(burst) < 20*time.Second && grown == 0 {
		if n := int64(poolSize()); n > 1 {
			grown = time.Since(burst)
			peak.Store(n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop := func() {
		for _, b := range stoppers {
			b.stop()
		}
		wg.Wait()
	}
	if grown == 0 {
		stop()
		t.Fatalf("the pool did not grow under the burst\nautoscaler:\n%s", as.output())
	}
	time.Sleep(3 * time.Second) // keep training while the pool serves the burst
	during := int64(poolSize())
	peak.Store(max(peak.Load(), during))
	stop()
	for j := range 3 {
		if err := admin.DeleteJob(ctx, fmt.Sprintf("burst-%d", j)); err != nil {
			t.Fatal(err)
		}
	}
	if during < 2 {
		t.Fatalf("the pool shrank to %d runtime(s) while the burst was still training\nautoscaler:\n%s", during, as.output())
	}
	shrunk := waitPool(1, 60*time.Second)
	t.Logf("pool grew %v after the burst began; %d runtimes 3 s later (peak %d); back to 1 runtime %v after the jobs ended",
		grown.Round(time.Millisecond), during, peak.Load(), shrunk.Round(time.Millisecond))
}

// stepBarrier stops the ranks of a job at a common step. A rank that stopped on a flag as soon as
// it saw it could quit before a step its peers had already published to, leaving them waiting for
// its gradient until they timed out.
type stepBarrier struct {
	mu       sync.Mutex
	stopping bool
	started  int64 // the latest step any rank started
}

// next reports whether a rank may start step; once stopping, only steps some rank already started.
func (b *stepBarrier) next(step int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopping && step > b.started {
		return false
	}
	b.started = max(b.started, step)
	return true
}

func (b *stepBarrier) stop() {
	b.mu.Lock()
	b.stopping = true
	b.mu.Unlock()
}
