package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// elasticWorkerEnv runs the test binary as an elastic worker process: url|job|id|last step, with
// the job's credentials (JSON) in elasticCredsEnv.
const (
	elasticWorkerEnv = "FANIN_E2E_ELASTIC"
	elasticCredsEnv  = "FANIN_E2E_ELASTIC_CREDS"
)

// elasticGradPause is each rank's compute time in the worker processes: steps take long enough
// for membership to change between them.
const elasticGradPause = 15 * time.Millisecond

// TestElasticWorkerProcesses trains a BSP job of 4 logical ranks on elastic worker processes that
// use the job's credentials on a secured cluster (nats-server, gateway, autoscaler and two runtimes
// as processes): 4 workers, then 2 (two leave on SIGTERM), then 1 (one SIGKILLed), then 3 (two
// join). The job ends byte-identical to the reference on 4 fixed ranks, with exactly one update
// per step, and the test reports how long the job took to absorb the SIGKILLed worker.
func TestElasticWorkerProcesses(t *testing.T) {
	if os.Getenv(elasticWorkerEnv) != "" {
		os.Exit(elasticWorkerMain())
	}
	skipShort(t)
	sc := startSecured(t, "rt-0", "rt-1")
	a, url, apiURL := sc.auth, sc.url, sc.api

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	spec := job.Spec{ID: "elastic", Ranks: 4, Tensors: []job.Tensor{{Name: "w", Shape: []int{6000}}},
		Function: job.Function{Name: "adam", Hyper: map[string]float64{"lr": 0.01}}, ShardSize: 8 << 10,
		Init: job.Init{Kind: "uniform", Seed: 3, Scale: 1}}
	created, err := sdk.NewAdmin(apiURL, sdk.WithToken(a.AdminToken())).SubmitJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	creds, _ := json.Marshal(created.Credentials)
	const last = 90
	var (
		mu      sync.Mutex
		workers = map[string]*extProc{}
	)
	run := func(id string) {
		p := startProc(t, "worker "+id, []string{
			elasticWorkerEnv + "=" + strings.Join([]string{url, spec.ID, id, strconv.Itoa(last)}, "|"),
			elasticCredsEnv + "=" + string(creds),
		}, os.Args[0], "-test.short", "-test.run=^TestElasticWorkerProcesses$") // -test.short: TestMain builds nothing
		mu.Lock()
		workers[id] = p
		mu.Unlock()
	}
	// steps parses every worker's "step T at UNIXNANO" lines: when each step was first completed.
	steps := func() map[int64]time.Time {
		mu.Lock()
		defer mu.Unlock()
		done := map[int64]time.Time{}
		for _, p := range workers {
			for _, m := range stepLine.FindAllStringSubmatch(p.output(), -1) {
				s, _ := strconv.ParseInt(m[1], 10, 64)
				ns, _ := strconv.ParseInt(m[2], 10, 64)
				if at := time.Unix(0, ns); done[s].IsZero() || at.Before(done[s]) {
					done[s] = at
				}
			}
		}
		return done
	}
	newest := func() int64 {
		var n int64
		for s := range steps() {
			n = max(n, s)
		}
		return n
	}
	waitStep := func(s int64) {
		t.Helper()
		testutil.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
			if n := newest(); n < s {
				return fmt.Errorf("the job is at step %d, waiting for %d", n, s)
			}
			return nil
		})
	}
	for _, id := range []string{"w0", "w1", "w2", "w3"} {
		run(id)
	}
	waitStep(15)
	for _, id := range []string{"w2", "w3"} { // graceful: SIGTERM, the worker leaves after its step
		workers[id].stop()
		if workers[id].err != nil {
			t.Fatalf("worker %s did not leave cleanly: %v\n%s", id, workers[id].err, workers[id].output())
		}
	}
	waitStep(newest() + 10)
	before := newest()
	killed := time.Now()
	_ = workers["w1"].cmd.Process.Signal(syscall.SIGKILL)
	<-workers["w1"].done
	waitStep(before + 2)
	waitStep(newest() + 10)
	run("w4")
	run("w5")
	for _, id := range []string{"w0", "w4", "w5"} {
		select {
		case <-workers[id].done:
		case <-ctx.Done():
			t.Fatalf("worker %s did not reach step %d", id, last)
		}
		if workers[id].err != nil {
			t.Fatalf("worker %s: %v\n%s", id, workers[id].err, tail(workers[id].output(), 30))
		}
	}
	for _, id := range []string{"w4", "w5"} {
		if !strings.Contains(workers[id].output(), "ranks [") {
			t.Errorf("worker %s never held a rank:\n%s", id, tail(workers[id].output(), 20))
		}
	}
	if !strings.Contains(workers["w0"].output(), "ranks [0 1 2 3]") {
		t.Errorf("w0 never held every rank while alone:\n%s", tail(workers["w0"].output(), 20))
	}

	// The gap: from the last step completed before the kill to the next one completed.
	done := steps()
	var lastBefore, firstAfter time.Time
	for _, at := range done {
		if at.Before(killed) && at.After(lastBefore) {
			lastBefore = at
		}
		if at.After(killed) && (firstAfter.IsZero() || at.Before(firstAfter)) {
			firstAfter = at
		}
	}
	t.Logf("a SIGKILLed worker's ranks moved: gap %v (kill to next step %v; the lapse is %v)",
		firstAfter.Sub(lastBefore).Round(time.Millisecond), firstAfter.Sub(killed).Round(time.Millisecond), wire.WorkerLapse)

	// The reference: 4 fixed ranks, the same gradients.
	rec := created.Record
	ref := testutil.Reference(t, &rec)
	g := make([][]float32, 4)
	for r := range g {
		g[r] = make([]float32, rec.Layout.Elements)
	}
	for s := int64(1); s <= last; s++ {
		for r := range g {
			testutil.Gradient(g[r], ref.Params(), s, r)
		}
		ref.Step(g, nil)
	}
	c, err := sdk.Connect(ctx, url, sdk.WithJobCredentials(created.Credentials))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := testutil.ParamsAt(t, testutil.DirectGetter(c.Conn(), wire.ParamsStream(spec.ID)), &rec, last)
	if !bytes.Equal(f32bytes(got), f32bytes(ref.Params())) {
		t.Fatalf("the parameters at step %d differ from the reference on 4 fixed ranks", last)
	}
	// Exactly one update per step: every shard's newest parameters are those of step last (the
	// workers stopped there, ParamsAt waits for that step), equal to the reference's after exactly
	// last steps: a gradient applied twice, or a step with a rank missing, would change the bits.
	t.Logf("%d steps on 4, 2, 1, then 3 worker processes: byte-identical to 4 fixed ranks", last)
}

var stepLine = regexp.MustCompile(`step (\d+) at (\d+)`)

// elasticWorkerMain is an elastic worker process: it trains until step last, printing every step's
// completion time and every change of its ranks; SIGTERM makes it leave after its current step.
func elasticWorkerMain() int {
	parts := strings.Split(os.Getenv(elasticWorkerEnv), "|")
	url, id, name := parts[0], parts[1], parts[2]
	last, _ := strconv.ParseInt(parts[3], 10, 64)
	var creds api.Credentials
	if err := json.Unmarshal([]byte(os.Getenv(elasticCredsEnv)), &creds); err != nil {
		fmt.Println("credentials:", err)
		return 1
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := sdk.Connect(ctx, url, sdk.WithJobCredentials(&creds))
	if err != nil {
		fmt.Println("connect:", err)
		return 1
	}
	defer c.Close()
	e, err := c.Elastic(ctx, id, sdk.WithWorkerID(name), sdk.WithOnAssign(func(ranks []int) {
		fmt.Printf("ranks %v\n", ranks)
	}))
	if err != nil {
		fmt.Println("join:", err)
		return 1
	}
	grad := func(_ context.Context, rank int, step int64, params, g []float32) error {
		testutil.Gradient(g, params, step, rank)
		time.Sleep(elasticGradPause)
		return nil
	}
	for e.StepCount() < last {
		if _, err := e.Step(ctx, grad); err != nil {
			fmt.Println("step:", err)
			return 1
		}
		fmt.Printf("step %d at %d\n", e.StepCount(), time.Now().UnixNano())
		select {
		case <-term:
			if err := e.Leave(ctx); err != nil {
				fmt.Println("leave:", err)
				return 1
			}
			fmt.Println("left")
			return 0
		default:
		}
	}
	if err := e.Leave(ctx); err != nil {
		fmt.Println("leave:", err)
		return 1
	}
	return 0
}
