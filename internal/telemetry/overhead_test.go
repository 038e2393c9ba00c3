package telemetry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/internal/telemetry/otlp"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
)

// TestOverhead measures what tracing and metrics cost the data plane, side by side: the workloads
// of lab/bench's e2e-resnet50 (8 ranks, ResNet-50's 25.6M parameters, 4 MiB shards, 3 runtimes)
// and latency-small (4 ranks, 1 MiB), each run with telemetry off, on at the default sampling, and
// on with every step traced, alternately, on fresh in-process stacks; the best of the repetitions
// of each is kept, with the process's CPU time per step (everything runs in this process, which
// makes CPU time the steadier figure on a shared machine). Spans go over OTLP/HTTP to a sink in this process that reads and drops them, and
// /metrics is scraped every second. It takes minutes: it runs only with FANIN_OVERHEAD=1
// (FANIN_OVERHEAD_REPS, default 3), and prints the table docs/TELEMETRY.md reports.
func TestOverhead(t *testing.T) {
	if os.Getenv("FANIN_OVERHEAD") == "" {
		t.Skip("measures for minutes: set FANIN_OVERHEAD=1")
	}
	reps := 3
	if n, err := strconv.Atoi(os.Getenv("FANIN_OVERHEAD_REPS")); err == nil && n > 0 {
		reps = n
	}
	var spansIn atomic.Int64
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		spansIn.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer sink.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.URL)
	t.Setenv("OTEL_TRACES_SAMPLER", "")

	type workload struct {
		name                    string
		ranks, elements, shard  int
		warmup, steps, runtimes int
	}
	workloads := []workload{
		{"e2e-resnet50 N=8,Shard=4MiB", 8, 25_557_032, 4 << 20, 2, 10, 3},
		{"latency-small N=4,Size=1MiB", 4, 1 << 18, 1 << 20, 20, 300, 3},
	}
	if os.Getenv("FANIN_OVERHEAD_QUICK") != "" {
		workloads[0].elements, workloads[1].steps = 2_555_703, 100
	}
	if only := os.Getenv("FANIN_OVERHEAD_ONLY"); only != "" {
		workloads = slices.DeleteFunc(workloads, func(w workload) bool { return !strings.Contains(w.name, only) })
	}
	modes := []string{"off", "on (default sampling)", "on (every step traced)"}
	if only := os.Getenv("FANIN_OVERHEAD_MODE"); only != "" { // e.g. with -test.cpuprofile
		modes = slices.DeleteFunc(modes, func(m string) bool { return !strings.HasPrefix(m, only) })
	}
	best := map[string]float64{}
	all := map[string][]float64{}
	cpu := map[string]time.Duration{} // the least CPU per step among the runs
	for _, w := range workloads {
		grads := make([][]float32, w.ranks)
		for r := range grads {
			grads[r] = make([]float32, w.elements)
			for i := range grads[r] {
				grads[r][i] = float32((i*7+r*13)%101-50) * 1e-4
			}
		}
		for rep := range reps {
			for _, mode := range modes {
				sps, c := measure(t, mode, w.ranks, w.elements, w.shard, w.runtimes, w.warmup, w.steps, grads)
				key := w.name + "|" + mode
				all[key] = append(all[key], sps)
				best[key] = max(best[key], sps)
				if cpu[key] == 0 || c < cpu[key] {
					cpu[key] = c
				}
				t.Logf("%s, telemetry %s, rep %d: %.3f steps/s, %v CPU per step", w.name, mode, rep+1, sps, c)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| workload | telemetry | steps/s, best of %d | vs off | median | vs off | all runs | CPU per step, least | vs off |\n", reps)
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, w := range workloads {
		off, offCPU, offMed := best[w.name+"|off"], cpu[w.name+"|off"], median(all[w.name+"|off"])
		for _, mode := range modes {
			key := w.name + "|" + mode
			runs := slices.Clone(all[key])
			var txt []string
			for _, v := range runs {
				txt = append(txt, fmt.Sprintf("%.2f", v))
			}
			med := median(runs)
			fmt.Fprintf(&b, "| %s | %s | %.2f | %+.1f%% | %.2f | %+.1f%% | %s | %.2f ms | %+.1f%% |\n", w.name, mode,
				best[key], 100*(best[key]/off-1), med, 100*(med/offMed-1), strings.Join(txt, ", "),
				float64(cpu[key])/1e6, 100*(float64(cpu[key])/float64(offCPU)-1))
		}
	}
	t.Logf("OTLP bytes received by the sink: %d\n%s", spansIn.Load(), b.String())
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// measure runs warmup then steps BSP steps on a fresh stack with telemetry as mode says, and returns
// the steps per second of the measured steps and the process's CPU time per step.
func measure(t *testing.T, mode string, ranks, elements, shard, runtimes, warmup, steps int, grads [][]float32) (float64, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := devstack.Config{DataDir: t.TempDir(), NATSPort: -1, Runtimes: runtimes, Logger: testutil.Logger()}
	var clientOpts []sdk.Option
	switch mode {
	case "off":
		cfg.NoTelemetry = true
		clientOpts = append(clientOpts, sdk.WithTracing(nil))
	default:
		var opts []otlp.Option
		if mode == "on (every step traced)" {
			opts = append(opts, otlp.WithStepSampler(sdktrace.AlwaysSample()))
		}
		p, err := otlp.New(ctx, append(opts, otlp.WithService("fanin-overhead"))...)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Shutdown(ctx)
		m := metrics.New()
		cfg.Tracing, cfg.Metrics = p, m
		clientOpts = append(clientOpts, sdk.WithTracing(p))
		stop := scrapeEverySecond(m)
		defer stop()
	}
	st, err := devstack.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	spec := job.Spec{ID: "overhead", Tensors: []job.Tensor{{Name: "params", Shape: []int{elements}}}, Ranks: ranks,
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.01}}, ShardSize: job.ByteSize(shard), Storage: "memory"}
	rec, err := st.Gateway.CreateJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	workers := make([]*sdk.Worker, ranks)
	for r := range workers {
		c, err := sdk.Connect(ctx, st.URL, clientOpts...)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if workers[r], err = c.Worker(ctx, rec.Spec.ID, r); err != nil {
			t.Fatal(err)
		}
		defer workers[r].Close()
	}
	step := func() {
		var wg sync.WaitGroup
		errs := make([]error, ranks)
		for r, w := range workers {
			wg.Go(func() { _, errs[r] = w.Step(ctx, grads[r]) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for range warmup {
		step()
	}
	start, cpu0 := time.Now(), processCPU()
	for range steps {
		step()
	}
	return float64(steps) / time.Since(start).Seconds(), (processCPU() - cpu0) / time.Duration(steps)
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// scrapeEverySecond reads m's /metrics every second, as Prometheus would, until stop.
func scrapeEverySecond(m *metrics.Metrics) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				rec := httptest.NewRecorder()
				m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
