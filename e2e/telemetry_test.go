package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/internal/telemetry/otlp"
	"github.com/fanin-ml/fanin/internal/telemetry/traceshape"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
)

// TestTraceInJaeger runs two runtimes and the autoscaler as fanin processes that export their
// spans over OTLP/gRPC to a real Jaeger v2, and two SDK workers in this process that export over
// OTLP/HTTP. After three steps it reads a step's trace back through Jaeger's query API and checks
// its shape: one trace holding rank 0's root, each rank's step and publish, each shard's invocation
// (child of a worker's publish, with queue wait, gather, function and publish), and each worker's
// receipt of each shard (child of the runtime's publish), with their attributes.
func TestTraceInJaeger(t *testing.T) {
	skipShort(t)
	jaeger := jaegerBinary(t)
	grpcPort, httpPort, queryPort := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	startJaeger(t, jaeger, grpcPort, httpPort, queryPort)
	query := fmt.Sprintf("http://127.0.0.1:%d", queryPort)

	natsURL := testutil.NATS(t)
	otel := []string{
		"OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		fmt.Sprintf("OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:%d", grpcPort),
		"OTEL_TRACES_SAMPLER=parentbased_always_on",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}
	for _, id := range []string{"rt-a", "rt-b"} {
		startFaninProc(t, id, otel, "runtime", "--nats", natsURL, "--id", id).
			waitOutput(t, regexp.MustCompile(`runtime started`), 20*time.Second)
	}
	startFaninProc(t, "autoscaler", otel, "autoscaler", "--nats", natsURL, "--interval", "200ms")

	// The workers: this process, over OTLP/HTTP, every step sampled.
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", fmt.Sprintf("http://127.0.0.1:%d", httpPort))
	ctx := context.Background()
	tp, err := otlp.New(ctx, otlp.WithService("fanin-e2e-worker"), otlp.WithStepSampler(sdktrace.AlwaysSample()))
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Shutdown(ctx)

	const ranks, steps = 2, 3
	rec := createJob(t, natsURL, job.Spec{ID: "traced", Ranks: ranks,
		Tensors:   []job.Tensor{{Name: "w", Shape: []int{1024}}, {Name: "b", Shape: []int{1024}}},
		Function:  job.Function{Name: "momentum", Hyper: map[string]float64{"lr": 0.1, "momentum": 0.9}},
		ShardSize: 4 << 10})
	train(t, natsURL, rec, steps, sdk.WithTracing(tp))
	if err := tp.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}

	const step = 2
	tid, root := telemetry.StepIDs(rec.Spec.ID, rec.Created.UnixNano(), step)
	want := traceshape.Step{Job: rec.Spec.ID, Step: step, Ranks: ranks, Shards: rec.Layout.NumShards(), Function: "momentum",
		TraceID: tid.String(), RootID: root.String()}
	var spans []traceshape.Span
	testutil.CheckFor(t, 30*time.Second, 250*time.Millisecond, func() error {
		// Find the step's trace the way a user would: by service, then read it whole.
		var found jaegerResponse
		q := url.Values{"service": {"fanin-runtime"}, "operation": {telemetry.SpanInvoke}, "limit": {"100"},
			"lookback": {"1h"}, "tags": {fmt.Sprintf(`{"fanin.job":%q,"fanin.step":"%d"}`, rec.Spec.ID, step)}}
		if err := getJSON(ctx, query+"/api/traces?"+q.Encode(), &found); err != nil {
			return err
		}
		ids := map[string]bool{}
		for _, tr := range found.Data {
			ids[trimHex(tr.TraceID)] = true
		}
		if !ids[trimHex(tid.String())] {
			return fmt.Errorf("Jaeger's search for service fanin-runtime finds %d traces, not the step's %s", len(ids), tid)
		}
		var got jaegerResponse
		if err := getJSON(ctx, query+"/api/traces/"+tid.String(), &got); err != nil {
			return err
		}
		if len(got.Data) != 1 {
			return fmt.Errorf("GET /api/traces/%s: %d traces", tid, len(got.Data))
		}
		spans = got.Data[0].spans()
		if err := traceshape.Check(spans, want); err != nil {
			return fmt.Errorf("%w\n%s", err, traceshape.Summary(spans))
		}
		return checkServices(spans)
	})
	t.Logf("step %d in Jaeger: trace %s, %d spans:\n%s", step, tid, len(spans), traceshape.Summary(spans))
}

// checkServices checks that each span comes from the process that does that part of the work.
func checkServices(spans []traceshape.Span) error {
	var errs []error
	for _, s := range spans {
		want := "fanin-e2e-worker"
		if strings.HasPrefix(s.Name, "fanin.shard.") {
			want = "fanin-runtime"
		}
		if s.Service != want {
			errs = append(errs, fmt.Errorf("%s %s comes from service %q, want %q", s.Name, s.SpanID, s.Service, want))
		}
	}
	return errors.Join(errs...)
}

// TestMetricsInPrometheus runs a runtime and the autoscaler as fanin processes with --metrics, has a
// real Prometheus scrape them every second, trains a job, and queries series through Prometheus's
// HTTP API: invocations per job, gradient bytes, the pool size, and the NATS connection state.
func TestMetricsInPrometheus(t *testing.T) {
	skipShort(t)
	prom := needTool(t, "Debian package prometheus", "prometheus")
	natsURL := testutil.NATS(t)
	rtPort, asPort := testutil.FreePort(t), testutil.FreePort(t)
	listening := regexp.MustCompile(`metrics listening" url=(http://[0-9.:]+/metrics)`)
	startFaninProc(t, "rt-0", nil, "runtime", "--nats", natsURL, "--id", "rt-0", "--metrics", fmt.Sprintf("127.0.0.1:%d", rtPort)).
		waitOutput(t, listening, 20*time.Second)
	startFaninProc(t, "autoscaler", nil, "autoscaler", "--nats", natsURL, "--interval", "200ms", "--metrics", fmt.Sprintf("127.0.0.1:%d", asPort)).
		waitOutput(t, listening, 20*time.Second)

	promPort := startPrometheus(t, prom, fmt.Sprintf(`
  - job_name: fanin-runtime
    static_configs: [{targets: ["127.0.0.1:%d"]}]
  - job_name: fanin-autoscaler
    static_configs: [{targets: ["127.0.0.1:%d"]}]
`, rtPort, asPort))

	rec := createJob(t, natsURL, job.Spec{ID: "scraped", Ranks: 2, Tensors: []job.Tensor{{Name: "w", Shape: []int{3000}}},
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, ShardSize: 4 << 10})
	train(t, natsURL, rec, 20)
	shards := rec.Layout.NumShards()

	expectProm(t, promPort, []promCheck{
		{`up{job="fanin-runtime"}`, eq(1), "the runtime's target up"},
		{`up{job="fanin-autoscaler"}`, eq(1), "the autoscaler's target up"},
		{`sum(fanin_runtime_invocations_total{fanin_job="scraped",runtime="rt-0"})`, eq(float64(20 * shards)), "20 steps of every shard"},
		{`sum(fanin_runtime_gradient_bytes_total{fanin_job="scraped"})`, eq(float64(20 * 2 * 4 * 3000)), "every rank's gradient bytes"},
		{`sum(fanin_runtime_invocation_duration_seconds_count{fanin_job="scraped"})`, eq(float64(20 * shards)), "a latency per invocation"},
		{`fanin_runtime_step{fanin_job="scraped"}`, eq(20), "the job's step"},
		{`fanin_runtime_shards{fanin_job="scraped"}`, eq(float64(shards)), "the shards served"},
		{`fanin_autoscaler_pool_size{job="fanin-autoscaler"}`, eq(1), "a pool of one runtime"},
		{`fanin_autoscaler_leader{job="fanin-autoscaler"}`, eq(1), "a leader"},
		{`min(fanin_nats_connected)`, eq(1), "connected to NATS"},
		{`count(fanin_nats_connected)`, eq(2), "the runtime's and the autoscaler's connections"},
		{`count(fanin_autoscaler_pool_size)`, eq(1), "the autoscaler's gauges from the autoscaler only"},
	})
}

// TestRuntimeMetricsDiscovered: the runtimes that the process driver starts serve metrics on free
// ports and register their URLs; a real Prometheus finds them through the gateway's HTTP service
// discovery endpoint (GET /v1/metrics/targets) and scrapes them, so the pool's runtimes are
// watched however many there are.
func TestRuntimeMetricsDiscovered(t *testing.T) {
	skipShort(t)
	prom := needTool(t, "Debian package prometheus", "prometheus")
	natsURL := testutil.NATS(t)
	gw := start(t, "gateway", "gateway", "--nats", natsURL, "--http", "127.0.0.1:0")
	api := gw.waitFor(t, httpURL, 20*time.Second)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("min_runtimes: 2\nmax_runtimes: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	start(t, "autoscaler", "autoscaler", "--nats", natsURL, "--driver", "process", "--policy", policy,
		"--runtime-binary", faninBin, "--interval", "200ms") // runtimes get --metrics 127.0.0.1:0

	u, _ := url.Parse(api)
	promPort := startPrometheus(t, prom, fmt.Sprintf(`
  - job_name: fanin-runtimes
    http_sd_configs: [{url: "http://%s/v1/metrics/targets", refresh_interval: 1s}]
`, u.Host))

	rec := createJob(t, natsURL, job.Spec{ID: "discovered", Ranks: 2, Tensors: []job.Tensor{{Name: "w", Shape: []int{3000}}},
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, ShardSize: 4 << 10})
	train(t, natsURL, rec, 20)
	shards := rec.Layout.NumShards()

	expectProm(t, promPort, []promCheck{
		{`count(up{job="fanin-runtimes"} == 1)`, eq(2), "both runtimes discovered and up"},
		{`count(count by (fanin_runtime_id) (up{job="fanin-runtimes"}))`, eq(2), "one target per runtime id"},
		{`sum(fanin_runtime_invocations_total{job="fanin-runtimes",fanin_job="discovered"})`, eq(float64(20 * shards)), "20 steps of every shard, over the pool"},
	})
}

// startPrometheus runs Prometheus with a 1 s scrape interval and the given scrape_configs entries
// (YAML, indented two spaces), and returns its HTTP port.
func startPrometheus(t *testing.T, bin, scrapeConfigs string) int {
	t.Helper()
	dir := t.TempDir()
	cfg := "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:" + scrapeConfigs
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	port := testutil.FreePort(t)
	startProc(t, "prometheus", nil, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port))
	return port
}

// promCheck is a PromQL query whose first result must satisfy want.
type promCheck struct {
	query string
	want  func(float64) bool
	what  string
}

// expectProm polls the Prometheus at 127.0.0.1:port until every check holds (30 s each).
func expectProm(t *testing.T, port int, checks []promCheck) {
	t.Helper()
	ctx := context.Background()
	api := fmt.Sprintf("http://127.0.0.1:%d/api/v1/query?query=", port)
	for _, c := range checks {
		testutil.CheckFor(t, 30*time.Second, 250*time.Millisecond, func() error {
			var res promResponse
			if err := getJSON(ctx, api+url.QueryEscape(c.query), &res); err != nil {
				return err
			}
			if res.Status != "success" || len(res.Data.Result) == 0 {
				return fmt.Errorf("%s: %s, %d series (want %s)", c.query, res.Status, len(res.Data.Result), c.what)
			}
			v, err := strconv.ParseFloat(fmt.Sprint(res.Data.Result[0].Value[1]), 64)
			if err != nil || !c.want(v) {
				return fmt.Errorf("%s = %v (want %s)", c.query, res.Data.Result[0].Value[1], c.what)
			}
			return nil
		})
		t.Logf("prometheus: %s: ok", c.query)
	}
}

func eq(want float64) func(float64) bool { return func(v float64) bool { return v == want } }

type promResponse struct {
	Status string `json:"status"`
	Data   struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	} `json:"data"`
}

// jaegerBinary is the Jaeger v2 binary built from tools/jaeger by scripts/jaeger.sh. Outside CI a
// missing binary skips the test (building takes a few minutes and the module proxy); in CI the
// script builds it.
func jaegerBinary(t *testing.T) string {
	t.Helper()
	script := filepath.Join(repoRoot(t), "scripts", "jaeger.sh")
	if p := os.Getenv("FANIN_JAEGER"); p != "" {
		return p
	}
	home, _ := os.UserHomeDir()
	cache := os.Getenv("FANIN_CACHE")
	if cache == "" {
		cache = filepath.Join(home, ".cache", "fanin")
	}
	if p := filepath.Join(cache, "jaeger-v1.76.0-slim"); fileExists(p) {
		return p
	}
	if !inCI() {
		t.Skipf("no Jaeger binary: run %s once to build and cache it (about 2 min), or set FANIN_JAEGER", script)
	}
	t.Logf("building Jaeger with %s", script)
	out, err := exec.Command("bash", script).Output()
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return strings.TrimSpace(string(out))
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// startJaeger runs Jaeger v2 with in-memory storage, OTLP receivers and the query API on the given
// ports, and waits until the query API answers.
func startJaeger(t *testing.T, bin string, grpcPort, httpPort, queryPort int) {
	t.Helper()
	cfg := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics: {level: none}
    logs: {level: warn}
extensions:
  jaeger_query:
    storage: {traces: mem}
    http: {endpoint: "127.0.0.1:%d"}
    grpc: {endpoint: "127.0.0.1:%d"}
  jaeger_storage:
    backends:
      mem: {memory: {max_traces: 10000}}
receivers:
  otlp:
    protocols:
      grpc: {endpoint: "127.0.0.1:%d"}
      http: {endpoint: "127.0.0.1:%d"}
processors:
  batch: {timeout: 100ms}
exporters:
  jaeger_storage_exporter: {trace_storage: mem}
`, queryPort, testutil.FreePort(t), grpcPort, httpPort)
	path := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, "jaeger", []string{"OTEL_SDK_DISABLED=true"}, bin, "--config", path)
	testutil.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		p.alive(t)
		var v any
		return getJSON(context.Background(), fmt.Sprintf("http://127.0.0.1:%d/api/services", queryPort), &v)
	})
}

// jaegerResponse is what Jaeger's query API (api/traces) returns.
type jaegerResponse struct {
	Data []jaegerTrace `json:"data"`
}

type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		TraceID       string `json:"traceID"`
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		ProcessID     string `json:"processID"`
		References    []struct {
			RefType string `json:"refType"`
			TraceID string `json:"traceID"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
		Tags []struct {
			Key   string          `json:"key"`
			Value json.RawMessage `json:"value"`
		} `json:"tags"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// spans converts the trace: the first CHILD_OF reference is the parent, the other references links.
func (tr jaegerTrace) spans() []traceshape.Span {
	var out []traceshape.Span
	for _, s := range tr.Spans {
		sp := traceshape.Span{TraceID: padHex(s.TraceID, 32), SpanID: padHex(s.SpanID, 16), Name: s.OperationName,
			Service: tr.Processes[s.ProcessID].ServiceName, Attrs: map[string]string{}}
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" && sp.ParentID == "" {
				sp.ParentID = padHex(r.SpanID, 16)
			} else {
				sp.Links = append(sp.Links, padHex(r.SpanID, 16))
			}
		}
		for _, tag := range s.Tags {
			var v any
			d := json.NewDecoder(strings.NewReader(string(tag.Value)))
			d.UseNumber()
			if d.Decode(&v) == nil {
				sp.Attrs[tag.Key] = fmt.Sprint(v)
			}
		}
		out = append(out, sp)
	}
	return out
}

// Jaeger prints ids without leading zeros.
func padHex(s string, n int) string {
	for len(s) < n {
		s = "0" + s
	}
	return s
}

func trimHex(s string) string { return strings.TrimLeft(s, "0") }

// createJob creates a job with the gateway's library (no HTTP: the test is about the data plane).
func createJob(t *testing.T, natsURL string, spec job.Spec) *job.Record {
	t.Helper()
	ctx := context.Background()
	nc, err := nats.Connect(natsURL, nats.Name("e2e-admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	gw, err := gateway.New(ctx, nc, gateway.WithLogger(testutil.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := gw.CreateJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// train runs steps BSP steps of rec with one untraced SDK worker per rank, in this process.
func train(t *testing.T, natsURL string, rec *job.Record, steps int, opts ...sdk.Option) {
	t.Helper()
	testutil.Train(t, natsURL, rec, steps, append([]sdk.Option{sdk.WithTracing(nil)}, opts...)...)
}
