package autoscaler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// templatePool is a pool driver whose runtimes a template sizes (as the Kubernetes Deployment's pod
// template does): it counts the replicas it was asked for, and says the policy does not size them.
type templatePool struct {
	mu sync.Mutex
	n  int
}

func (p *templatePool) Scale(_ context.Context, n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n = max(p.n, n)
	return nil
}
func (p *templatePool) Remove(context.Context, string) error { return nil }
func (p *templatePool) Size() int                            { p.mu.Lock(); defer p.mu.Unlock(); return p.n }
func (p *templatePool) TemplateSized() bool                  { return true }

// On Kubernetes the Deployment's CPU request sizes a runtime, and the runtimes report it as their
// cores; the policy's cores_per_runtime (4 by default) sizes nothing there. The decider must count
// in the cores the runtimes report: counting 4 cores for pods of 1 sized the pool 4 times too
// small (the node test's autoscaler said "runtimes of 4 cores" while every pod reported 1).
func TestTemplateSizedPoolCountsReportedCores(t *testing.T) {
	t.Parallel()
	e := newCtlEnv(t)
	for _, id := range []string{"rt-a", "rt-b"} {
		info, _ := json.Marshal(wire.RuntimeInfo{ID: id, Cores: 1, Started: time.Now(), Beat: time.Now()})
		if _, err := e.b.Runtimes.Put(context.Background(), id, info); err != nil {
			t.Fatal(err)
		}
	}
	pol := autoscaler.DefaultPolicy()
	if pol.CoresPerRuntime != 4 {
		t.Fatalf("the default policy's cores_per_runtime is %d: the test needs it to differ from the pods' 1", pol.CoresPerRuntime)
	}
	c := e.controller(&templatePool{}, autoscaler.WithPolicy(pol))
	testutil.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		d, err := c.Step(context.Background())
		if err != nil {
			return err
		}
		for _, r := range d.Reasons {
			if strings.Contains(r, "runtimes of ") {
				if !strings.Contains(r, "runtimes of 1 cores") {
					t.Fatalf("the decider counts %q for pods of 1 core", r)
				}
				return nil
			}
		}
		return fmt.Errorf("no sizing reason yet: %s", strings.Join(d.Reasons, "; "))
	})
}
