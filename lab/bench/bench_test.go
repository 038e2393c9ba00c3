package bench

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sim"
)

// raceEnabled is set under the race detector (race_test.go).
var raceEnabled bool

// skipUnderRace skips a test that runs whole benchmark scenarios: under the race detector they
// take minutes (about 6 of CI's race lane for the three), and their concurrency is fanin's runtime,
// SDK and NATS client, whose own packages' tests run under it. They run without -race.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("runs whole benchmark scenarios, minutes under the race detector; their concurrency is tested by the runtime's and the SDK's packages: runs without -race")
	}
}

// TestRunQuick runs the two short scenarios as `fanin bench --quick` does and checks that the
// results are well-formed. It asserts nothing about speed: wall-clock figures are not testable.
func TestRunQuick(t *testing.T) {
	skipUnderRace(t)
	t.Parallel()
	var progress bytes.Buffer
	res, err := Run(context.Background(), Config{Quick: true, Only: []string{"kernel", "latency-small", "elastic"}, Log: testutil.Logger()}, &progress)
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	want := map[string]int{"kernel": 5, "latency-small": 6, "elastic": 11}
	got := map[string]int{}
	for _, r := range res {
		got[r.Scenario]++
		if r.Skipped != "" || r.Err != "" {
			t.Errorf("%s: skipped %q, error %q", r, r.Skipped, r.Err)
		}
		if r.Case == "" || r.Metric == "" || r.Baseline == "" {
			t.Errorf("%+v: case, metric and baseline must be set", r)
		}
		if !(r.Fanin > 0) || !(r.Base > 0) || !(r.Ratio > 0) {
			t.Errorf("%s: figures must be > 0", r)
		}
		if d := r.Ratio - r.Fanin/r.Base; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s: ratio %v is not fanin/baseline %v", r, r.Ratio, r.Fanin/r.Base)
		}
		if r.Met != (r.Goal == 0 || (!r.LowerIsBetter && r.Ratio >= r.Goal) || (r.LowerIsBetter && r.Ratio <= r.Goal)) {
			t.Errorf("%s: met = %v with ratio %v and goal %v", r, r.Met, r.Ratio, r.Goal)
		}
	}
	for s, n := range want {
		if got[s] != n {
			t.Errorf("scenario %s gave %d results, want %d", s, got[s], n)
		}
	}
	if !strings.Contains(progress.String(), "== kernel") {
		t.Errorf("progress does not announce the kernel scenario:\n%s", progress.String())
	}
	md := Markdown(res, "go run ./cmd/fanin bench --quick", Environment(Config{}))
	for _, s := range []string{"# Benchmarks", "go run ./cmd/fanin bench --quick", "## Summary", "## kernel", "## latency-small", "| kernel | Func=sgd,N=8,Shard=1MiB |", "lower is better"} {
		if !strings.Contains(md, s) {
			t.Errorf("Markdown lacks %q:\n%s", s, md)
		}
	}
}

// TestServiceCostQuick runs the service-cost scenario as `fanin bench --quick --only service-cost
// --cost-out f` does: the broker, the runtimes and the workers run in processes of their own, and
// the file it writes is what the simulator reads, consistent with the rows reported. It asserts
// nothing about speed.
func TestServiceCostQuick(t *testing.T) {
	skipUnderRace(t)
	t.Parallel()
	out := filepath.Join(t.TempDir(), "service-cost.json")
	outEmbedded := filepath.Join(t.TempDir(), "service-cost-embedded.json")
	res, err := Run(context.Background(), Config{Quick: true, Only: []string{"service-cost"}, CostOut: out, CostOutEmbedded: outEmbedded, Log: testutil.Logger()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Per mode (gradients stored, direct, and direct with the NATS server in the runtime's
	// process), the parts; and direct against stored, embedded against not.
	by := map[string]map[string]Result{"stored": {}, "direct": {}, "embedded": {}}
	var versus []Result
	for _, r := range res {
		if strings.HasPrefix(r.Case, "whole service, direct vs stored") || strings.HasPrefix(r.Case, "whole service, embedded vs not") {
			versus = append(versus, r)
			continue
		}
		mode := "stored"
		switch {
		case strings.HasSuffix(r.Case, ",embedded"):
			mode = "embedded"
		case strings.Contains(r.Case, "Gradients=direct"):
			mode = "direct"
		}
		by[mode][strings.Split(r.Case, ",")[0]] = r
		if !(r.Fanin > 0) || r.Base != bytepsGBPerCoreSecond || r.Metric != "GB of gradient per core-second" {
			t.Errorf("%s: want a positive figure against BytePS's", r)
		}
	}
	if len(res) != 13 || len(versus) != 2 || !(versus[0].Fanin > 0 && versus[0].Base > 0) || !(versus[1].Fanin > 0 && versus[1].Base > 0) {
		t.Fatalf("results %v, want for stored and direct gradients the whole service, the NATS server, the runtimes and their work, for the embedded server the whole service, the runtime and its work, direct against stored and embedded against not", res)
	}
	if e := by["embedded"]; e["whole service"].Fanin == 0 || e["runtime with the NATS server"].Fanin == 0 || e["runtimes' work"].Fanin == 0 ||
		!(e["whole service"].Fanin <= e["runtime with the NATS server"].Fanin) || !near(versus[1].Fanin, e["whole service"].Fanin) || !near(versus[1].Base, by["direct"]["whole service"].Fanin) {
		t.Errorf("embedded: %v and %s, want the whole service (no more than the runtime with the server), the runtime, its work, and against direct", e, versus[1])
	}
	if c, err := sim.ReadServiceCost(outEmbedded); err != nil {
		t.Error(err)
	} else if m := c.Measured; m == nil || !strings.Contains(c.Source, "--nats-config") || !(m.RuntimeCPU > 3*m.BrokerCPU) || m.BrokerBytesIn < m.GradientBytes {
		t.Errorf("embedded cost file %+v: want the runtime's process to hold the server's CPU and bytes", c)
	}
	delete(by, "embedded")
	for mode, parts := range by {
		whole, broker, rts, work := parts["whole service"], parts["NATS server"], parts["runtimes"], parts["runtimes' work"]
		if whole.Fanin == 0 || broker.Fanin == 0 || rts.Fanin == 0 || work.Fanin == 0 {
			t.Fatalf("%s: results %v, want the whole service, the NATS server, the runtimes and their work", mode, parts)
		}
		// Costs per byte add up: 1/whole = 1/broker + 1/runtimes; the work is a part of the runtimes'.
		if got := 1 / (1/broker.Fanin + 1/rts.Fanin); math.Abs(got-whole.Fanin) > 1e-9*whole.Fanin {
			t.Errorf("%s: whole service %v GB/core-s, from its parts %v", mode, whole.Fanin, got)
		}
		if !(work.Fanin >= rts.Fanin) {
			t.Errorf("%s: the runtimes' work %v GB/core-s is less than their whole CPU's %v: it is a part of it", mode, work.Fanin, rts.Fanin)
		}
	}
	if !near(versus[0].Fanin, by["direct"]["whole service"].Fanin) || !near(versus[0].Base, by["stored"]["whole service"].Fanin) {
		t.Errorf("direct vs stored %s: want the two modes' whole-service figures", versus[0])
	}
	rts, work, whole := by["stored"]["runtimes"], by["stored"]["runtimes' work"], by["stored"]["whole service"]
	c, err := sim.ReadServiceCost(out)
	if err != nil {
		t.Fatal(err)
	}
	m := c.Measured
	if m == nil || c.Date == "" || c.Machine == "" || c.Source == "" {
		t.Fatalf("cost file %+v: want its date, machine, source and measurement", c)
	}
	// 12 steps (2 warm-up) of 8 ranks of the quick model went in and out of the broker, and the
	// parameters in once and out to every rank: at least those bytes each way.
	grad := 12.0 * 8 * 4 * quickElements
	if m.GradientBytes != grad || m.RuntimeBytesIn < grad || m.BrokerBytesIn < grad*9/8 || m.BrokerOut < 2*grad {
		t.Errorf("measured %+v: want %.0f gradient bytes summed, at least as many accepted, >= 9/8 of them in and twice out", m, grad)
	}
	// The broker's CPU over the simulator's traffic: per gradient byte 9/8 in, 2 out.
	if !near(c.BrokerCPUPerByteIn, m.BrokerCPU/(grad*9/8+2*grad)) || c.BrokerCPUPerByteOut != c.BrokerCPUPerByteIn ||
		!near(c.RuntimeCPUPerByte, m.RuntimeCPU/grad) || !near(c.KernelCPUPerByte, m.KernelTime/grad) {
		t.Errorf("cost %+v does not follow from its measurement", c)
	}
	if !near(1e-9/c.RuntimeCPUPerByte, rts.Fanin) || !near(1e-9/c.KernelCPUPerByte, work.Fanin) || !near(c.GBPerCoreSecond(8), whole.Fanin) {
		t.Errorf("cost %+v against the rows: runtimes %v, work %v GB/core-s", c, rts.Fanin, work.Fanin)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Abs(b) }

func TestRunUnknownScenario(t *testing.T) {
	t.Parallel()
	_, err := Run(context.Background(), Config{Only: []string{"kernel", "nope"}}, nil)
	if err == nil || !strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), "e2e-resnet50") {
		t.Fatalf("err = %v, want one naming the unknown scenario and the known ones", err)
	}
}

// Without redis-server, or in a binary built without -tags redis, e2e-redis is skipped, and the
// report says why and how to run it.
func TestRedisMissingIsSkipped(t *testing.T) {
	t.Parallel()
	res, err := Run(context.Background(), Config{Quick: true, Only: []string{"e2e-redis"}, Redis: "/nonexistent/redis-server"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "/nonexistent/redis-server" // the binary
	if !RedisBuiltIn {
		want = "go run -tags redis ./cmd/fanin bench --only e2e-redis"
	}
	if len(res) != 1 || res[0].Skipped == "" || !strings.Contains(res[0].Skipped, want) {
		t.Fatalf("results %+v, want one skipped e2e-redis saying %q", res, want)
	}
	md := Markdown(res, "cmd", "env")
	if !strings.Contains(md, "skipped") || !strings.Contains(md, want) {
		t.Errorf("Markdown does not say the scenario was skipped, and why (%q):\n%s", want, md)
	}
	if env := Environment(Config{}); RedisBuiltIn == strings.Contains(env, "-tags redis") {
		t.Errorf("with the Redis baseline built in %v, the environment says:\n%s", RedisBuiltIn, env)
	}
}

// TestBaselinesComputeWhatFaninDoes runs a tiny workload on fanin and on each baseline: all must
// end with the same parameters bit for bit, or the comparison would be between different work.
// Not parallel: Redis, where installed, listens on a port freePort found free, which a test beside
// it could take first.
func TestBaselinesComputeWhatFaninDoes(t *testing.T) {
	rs := newRunState(Config{Quick: true, Log: testutil.Logger()}, nil)
	w := workload{Ranks: 3, Elements: 50_000, ShardSize: 64 << 10, Runtimes: 2}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := map[string]starter{"bare NATS": startBareNATS, "bare JetStream": startBareJetStream}
	if _, err := findRedis(rs.cfg); err == nil {
		base["redis"] = startRedis
	} else {
		t.Logf("no Redis baseline: %v", err)
	}
	for name, start := range base {
		f, b, err := rs.compare(ctx, w, start, name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if f.sum == 0 || f.sum != b.sum {
			t.Fatalf("%s: checksums fanin %08x baseline %08x", name, f.sum, b.sum)
		}
	}
}

// TestKeepHandWritten: a regenerated report keeps the old file's hand-written section, once.
func TestKeepHandWritten(t *testing.T) {
	t.Parallel()
	md := Markdown(nil, "cmd", "env")
	old := "# Benchmarks\n\nold figures\n\n" + HandWritten + " (not by `fanin bench`)\n\nby hand\n"
	got := KeepHandWritten(md, old)
	if !strings.HasPrefix(got, md[:len(md)-1]) || !strings.HasSuffix(got, "\n"+HandWritten+" (not by `fanin bench`)\n\nby hand\n") || strings.Contains(got, "old figures") {
		t.Errorf("KeepHandWritten:\n%s", got)
	}
	if again := KeepHandWritten(md, got); again != got {
		t.Errorf("a second regeneration differs:\n%s", again)
	}
	if got := KeepHandWritten(md, "# Benchmarks\nnothing by hand\n"); got != md {
		t.Errorf("without a hand-written section: %q", got)
	}
}

// TestKeepScenarios: a report of some scenarios keeps the others' rows and sections from the
// earlier report, in scenario order and marked with the earlier run's date.
func TestKeepScenarios(t *testing.T) {
	t.Parallel()
	r := func(sc, c string) Result {
		return throughput(Result{Scenario: sc, Case: c, Metric: "steps/s", Baseline: "b", Fanin: 1, Base: 2})
	}
	old := KeepHandWritten(Markdown([]Result{r("kernel", "k-old"), r("e2e-redis", "redis-old"), r("python", "py-old")}, "cmd", "- date: 2026-11-22 03:06 UTC"),
		"x\n"+HandWritten+"\n\nHANDMADE\n")
	md := Markdown([]Result{r("kernel", "k-new"), r("gloo", "gloo-new")}, "cmd --only kernel,gloo", "- date: 2026-11-25 11:00 UTC")
	got := KeepScenarios(md, old, []string{"kernel", "gloo"})
	for _, want := range []string{
		"| e2e-redis | redis-old (earlier run: see its section) |",
		"| python | py-old (earlier run: see its section) |",
		"*Not run by this report's command: carried over from the previous version of this file (dated 2026-11-22 03:06 UTC; a section that names its own run comes from that run).*",
		"| k-new |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("lacks %q", want)
		}
	}
	// Carried over a second time (another --only run), a section keeps its first mark and a row
	// its one "earlier run", instead of gaining one more of each.
	md2 := Markdown([]Result{r("kernel", "k-newer")}, "cmd --only kernel", "- date: 2026-11-25 13:41 UTC")
	again := KeepScenarios(md2, got, []string{"kernel"})
	if n := strings.Count(again, "*Not run by this report's command"); n != 3 { // e2e-redis, gloo, python
		t.Errorf("%d carried-over marks after a second carry-over, want 3 (one per section):\n%s", n, again)
	}
	if strings.Contains(again, "(earlier run: see its section) (earlier run") || !strings.Contains(again, "dated 2026-11-22 03:06 UTC") {
		t.Errorf("a second carry-over stacked the marks or lost the first one:\n%s", again)
	}
	if strings.Contains(got, "k-old") || strings.Contains(got, "HANDMADE") {
		t.Errorf("kept the re-run scenario's old figures or the hand-written section:\n%s", got)
	}
	order := []string{"## Summary", "| gloo | gloo-new", "| e2e-redis | redis-old", "| python | py-old", "## kernel", "## e2e-redis", "## gloo", "## python", "## What limits"}
	last := -1
	for _, o := range order {
		i := strings.Index(got, o)
		if i <= last {
			t.Fatalf("%q at %d, not after the previous (%d):\n%s", o, i, last, got)
		}
		last = i
	}
	if again := KeepScenarios(got, old, []string{"kernel", "gloo"}); again != got {
		t.Errorf("carrying over twice changed the report")
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	d := make([]time.Duration, 200)
	for i := range d {
		d[len(d)-1-i] = time.Duration(i+1) * time.Millisecond
	}
	if got := percentile(d, 0.5); got != 100*time.Millisecond {
		t.Errorf("p50 = %v, want 100ms", got)
	}
	if got := percentile(d, 0.99); got != 198*time.Millisecond {
		t.Errorf("p99 = %v, want 198ms", got)
	}
}

// benchElements is the model of the end-to-end benchmarks: ResNet-50 size, a tenth with -short.
func benchElements() int {
	if testing.Short() {
		return quickElements
	}
	return resnet50Elements
}

func BenchmarkKernel(b *testing.B) {
	for _, c := range []struct {
		fn        string
		unaligned bool
	}{{"sgd", false}, {"adam", false}, {"sgd", true}} {
		name := "Func=" + c.fn + ",N=8,Shard=1MiB"
		if c.unaligned {
			name += ",Unaligned"
		}
		b.Run(name, func(b *testing.B) {
			k, err := newKernelBench(c.fn, map[string]float64{"lr": 0.001}, c.unaligned)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(k.bytes())
			b.ReportAllocs()
			for b.Loop() {
				k.aggregate()
			}
		})
	}
}

func BenchmarkMemcpy(b *testing.B) {
	b.Run("N=8,Shard=1MiB", func(b *testing.B) {
		k, err := newKernelBench("sum", nil, false)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(k.bytes())
		b.ReportAllocs()
		for b.Loop() {
			k.copyAll()
		}
	})
}

// benchSystem times BSP steps of a system: one iteration is one step of every rank.
func benchSystem(b *testing.B, start starter, w workload) {
	b.Helper()
	rs := newRunState(Config{Log: testutil.Logger()}, nil)
	dir := b.TempDir()
	// go test -timeout does not cover benchmarks: a lost message must fail, not hang.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sys, err := start(ctx, rs, w, dir)
	if err != nil {
		if strings.Contains(err.Error(), "redis-server is not in PATH") || errors.Is(err, ErrRedisNotBuilt) {
			b.Skip(err)
		}
		b.Fatal(err)
	}
	defer sys.close()
	c := newCluster(sys, rs.gradients(w))
	if err := c.step(ctx); err != nil { // warm: placement, connections, buffers
		b.Fatal(err)
	}
	b.SetBytes(int64(4 * w.Ranks * w.Elements))
	b.ReportAllocs()
	for b.Loop() {
		if err := c.step(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
	if _, err := c.agree(); err != nil {
		b.Fatal(err)
	}
	if sys.check != nil {
		if err := sys.check(); err != nil {
			b.Fatal(err)
		}
	}
	if sys.observe != nil {
		if o := sys.observe(); o != "" {
			b.Log(o)
		}
	}
}

func e2eWorkloads() []workload {
	var ws []workload
	for _, s := range e2eShardSizes {
		ws = append(ws, workload{Ranks: 8, Elements: benchElements(), ShardSize: s, Runtimes: e2eRuntimes})
	}
	return ws
}

// BenchmarkE2E is fanin end to end: 8 SDK workers, BSP, sgd, JetStream memory storage.
func BenchmarkE2E(b *testing.B) {
	for _, w := range e2eWorkloads() {
		b.Run(w.name(), func(b *testing.B) { benchSystem(b, startFanin, w) })
	}
	// The pool-size sweep of docs/lab/benchmarks.md (2026-11-22), at e2e-redis's shard size (the
	// scenarios use e2eRuntimes).
	for _, r := range []int{1, 2, 5, 8} {
		w := workload{Ranks: 8, Elements: benchElements(), ShardSize: redisShardSize, Runtimes: r}
		b.Run(w.name(), func(b *testing.B) { benchSystem(b, startFanin, w) })
	}
}

// BenchmarkBareNATS is the e2e-resnet50 baseline: the same steps through a bare core-NATS aggregator.
func BenchmarkBareNATS(b *testing.B) {
	for _, w := range e2eWorkloads() {
		b.Run(w.name(), func(b *testing.B) { benchSystem(b, startBareNATS, w) })
	}
}

// BenchmarkRedis is the e2e-redis baseline: the same steps through Redis keys.
func BenchmarkRedis(b *testing.B) {
	w := workload{Ranks: 8, Elements: benchElements(), ShardSize: redisShardSize, Runtimes: e2eRuntimes}
	b.Run(w.name(), func(b *testing.B) { benchSystem(b, startRedis, w) })
}

// BenchmarkStepLatency is one BSP step of the latency-small job; ns/op is the mean step latency.
func BenchmarkStepLatency(b *testing.B) {
	b.Run(latencyWorkload.name(), func(b *testing.B) { benchSystem(b, startFanin, latencyWorkload) })
}

// BenchmarkRequestReply is the latency-small baseline: a 1 MiB request echoed over core NATS.
func BenchmarkRequestReply(b *testing.B) {
	b.Run("Size=1MiB", func(b *testing.B) {
		dir, err := os.MkdirTemp("", "fanin-bench-")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(dir)
		e, err := startEcho(dir)
		if err != nil {
			b.Fatal(err)
		}
		defer e.close()
		payload := make([]byte, 1<<20)
		ctx := context.Background()
		b.SetBytes(2 << 20)
		b.ReportAllocs()
		for b.Loop() {
			if err := e.roundTrip(ctx, payload); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestElasticWorkerArgs: the bench's command line for a worker process reads back the same.
func TestElasticWorkerArgs(t *testing.T) {
	t.Parallel()
	want := ElasticWorkerConfig{URL: "nats://127.0.0.1:4222", Job: "absorb", ID: "w3", Ranks: 4, Compute: 10 * time.Millisecond}
	got, err := ParseElasticWorker(want.Args())
	if err != nil || got != want {
		t.Fatalf("ParseElasticWorker(%q) = %+v, %v; want %+v", want.Args(), got, err, want)
	}
	for _, bad := range [][]string{nil, {"--job", "a", "--id", "w"}, append(want.Args(), "extra"), {"--nats", "x", "--job", "a", "--id", "w", "--ranks", "0"}} {
		if _, err := ParseElasticWorker(bad); err == nil {
			t.Errorf("ParseElasticWorker(%q) accepted", bad)
		}
	}
}

// TestAbsorbSplit: the absorb case's rows are the gap, the detection and the rest, and the
// medians of the last two add up to the gap's when the kills agree.
func TestAbsorbSplit(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	kill := func(detect, rest time.Duration) absorbKill {
		return absorbKill{lastStep: t0, lastBeat: t0.Add(-400 * time.Millisecond), killed: t0.Add(time.Millisecond),
			reassigned: t0.Add(detect), firstStep: t0.Add(detect + rest), step: 20 * time.Millisecond}
	}
	res := absorbResults([]absorbKill{kill(2600*time.Millisecond, 40*time.Millisecond), kill(2500*time.Millisecond, 30*time.Millisecond), kill(2700*time.Millisecond, 50*time.Millisecond)})
	if len(res) != 3 {
		t.Fatalf("%d results, want 3", len(res))
	}
	gap, detect, rest := res[0], res[1], res[2]
	if gap.Fanin != 2.64 || detect.Fanin != 2.6 || rest.Fanin != 0.04 {
		t.Errorf("medians: gap %v, detection %v, rest %v; want 2.64, 2.6, 0.04", gap.Fanin, detect.Fanin, rest.Fanin)
	}
	if gap.Base != 3 || detect.Base != 3 || rest.Base != 0.02 || !rest.LowerIsBetter || rest.Ratio != 2 {
		t.Errorf("baselines: %+v %+v %+v", gap, detect, rest)
	}
	if !strings.Contains(detect.Notes, "3s after the dead worker's last beat") {
		t.Errorf("detection notes %q lack the time since the last beat", detect.Notes)
	}
}

// TestBrokerCopiesModes runs a tiny workload in each mode of the broker-copies scenario against a
// NATS server process: every mode ends with the same parameters bit for bit, the server's CPU is
// counted, and every gradient byte went into the server.
func TestBrokerCopiesModes(t *testing.T) {
	t.Parallel()
	rs := newRunState(Config{Quick: true, Log: testutil.Logger()}, nil)
	w := workload{Ranks: 3, Elements: 50_000, ShardSize: 64 << 10, Runtimes: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var sum uint32
	for i, mode := range []bareMode{bareStoredPull, bareStoredSub, bareDirect} {
		r, err := copiesMeasure(ctx, rs, w, mode, 1, 3)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if i > 0 && r.sum != sum {
			t.Fatalf("%s: parameters %08x, the first mode's %08x", mode, r.sum, sum)
		}
		sum = r.sum
		if !(r.serverCPU > 0) || !(r.in >= r.gradBytes) {
			t.Errorf("%s: server CPU %v, bytes in %.0f for %.0f gradient bytes", mode, r.serverCPU, r.in, r.gradBytes)
		}
	}
}
