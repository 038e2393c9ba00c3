package telemetry_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/wire"
)

func TestTraceparentRoundTrip(t *testing.T) {
	for _, s := range []string{
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
	} {
		sc, ok := telemetry.ParseTraceparent(s)
		if !ok || !sc.IsRemote() || sc.IsSampled() != (s[54] == '1') {
			t.Fatalf("ParseTraceparent(%s) = %v, %v", s, sc, ok)
		}
		if got := telemetry.FormatTraceparent(sc); got != s {
			t.Errorf("FormatTraceparent = %s, want %s", got, s)
		}
		h := nats.Header{}
		telemetry.SetTraceparent(h, sc)
		if got, ok := telemetry.Traceparent(h); !ok || !got.Equal(sc) {
			t.Errorf("Traceparent after SetTraceparent = %v, %v", got, ok)
		}
		telemetry.SetTraceparent(h, trace.SpanContext{})
		if _, ok := h[wire.HdrTraceparent]; ok {
			t.Error("SetTraceparent of an invalid context left the header")
		}
	}
	// A later version may append fields; version ff, upper case, zero ids and bad lengths are refused.
	if _, ok := telemetry.ParseTraceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra"); !ok {
		t.Error("a future version with an extra field is refused")
	}
	for _, bad := range []string{
		"", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
		"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
		"00-00000000000000000000000000000000-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
		"00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	} {
		if sc, ok := telemetry.ParseTraceparent(bad); ok {
			t.Errorf("ParseTraceparent(%q) = %v, want refused", bad, sc)
		}
	}
	h := nats.Header{wire.HdrTraceparent: {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	if n := testing.AllocsPerRun(100, func() { telemetry.Traceparent(h) }); n != 0 {
		t.Errorf("Traceparent allocates %.0f times", n)
	}
}

// Step ids are the same for every process, differ between steps and between jobs (and re-created
// jobs), and a ratio sampler keeps about its ratio of steps.
func TestStepIDs(t *testing.T) {
	t1, s1 := telemetry.StepIDs("job", 42, 7)
	t2, s2 := telemetry.StepIDs("job", 42, 7)
	if t1 != t2 || s1 != s2 || !t1.IsValid() || !s1.IsValid() {
		t.Fatal("StepIDs is not deterministic")
	}
	seen := map[trace.TraceID]bool{}
	for _, args := range []struct {
		job          string
		created, stp int64
	}{{"job", 42, 7}, {"job", 42, 8}, {"job", 43, 7}, {"jo", 42, 7}, {"jobb", 42, 7}} {
		id, _ := telemetry.StepIDs(args.job, args.created, args.stp)
		if seen[id] {
			t.Errorf("StepIDs%v collides", args)
		}
		seen[id] = true
	}
	p := telemetry.Wrap(sdktrace.NewTracerProvider(), sdktrace.TraceIDRatioBased(0.1))
	kept := 0
	const n = 20000
	for step := int64(1); step <= n; step++ {
		id, _ := telemetry.StepIDs("ratio", 1, step)
		if p.SampleStep(id) {
			kept++
		}
	}
	if kept < n/10-300 || kept > n/10+300 {
		t.Errorf("ratio 0.1 kept %d of %d steps", kept, n)
	}
}

// A root span started with WithStepRoot takes the step's ids; others get random ones.
func TestStepRoot(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	p, err := telemetry.New(context.Background(), telemetry.WithExporter(exp), telemetry.WithSyncExport(),
		telemetry.WithStepSampler(sdktrace.AlwaysSample()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	ctx := telemetry.WithStepRoot(context.Background(), "j", 5, 3)
	_, root := p.Tracer().Start(ctx, "root", trace.WithNewRoot())
	root.End()
	_, other := p.Tracer().Start(context.Background(), "other")
	other.End()
	tid, sid := telemetry.StepIDs("j", 5, 3)
	if sc := root.SpanContext(); sc.TraceID() != tid || sc.SpanID() != sid {
		t.Errorf("step root has ids %s/%s, want %s/%s", sc.TraceID(), sc.SpanID(), tid, sid)
	}
	if other.SpanContext().TraceID() == tid {
		t.Error("a plain root took the step's trace id")
	}
	if !p.OwnsStepRoot() {
		t.Error("a provider made by New does not own step roots")
	}
}

func TestSamplerFromEnv(t *testing.T) {
	for _, c := range []struct {
		name, arg string
		root      string // the root sampler's description
		ok        bool
	}{
		{"", "", "TraceIDRatioBased{0.1}", true},
		{"always_on", "", "AlwaysOnSampler", true},
		{"parentbased_always_off", "", "AlwaysOffSampler", true},
		{"traceidratio", "0.25", "TraceIDRatioBased{0.25}", true},
		{"parentbased_traceidratio", "", "AlwaysOnSampler", true},
		{"traceidratio", "2", "", false},
		{"jaeger_remote", "", "", false},
	} {
		t.Setenv("OTEL_TRACES_SAMPLER", c.name)
		t.Setenv("OTEL_TRACES_SAMPLER_ARG", c.arg)
		root, _, err := telemetry.SamplerFromEnv()
		if (err == nil) != c.ok || (c.ok && root.Description() != c.root) {
			t.Errorf("OTEL_TRACES_SAMPLER=%q ARG=%q: %v, %v; want %s (ok %v)", c.name, c.arg, root, err, c.root, c.ok)
		}
	}
}

func TestEnvEnabled(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, false},
	} {
		for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED"} {
			t.Setenv(k, c.env[k])
		}
		if got := telemetry.EnvEnabled(); got != c.want {
			t.Errorf("EnvEnabled with %v = %v", c.env, got)
		}
	}
}

// The HTTP middleware names a request's span after its route and continues the caller's trace.
func TestHTTPHandler(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	p, err := telemetry.New(context.Background(), telemetry.WithExporter(exp), telemetry.WithSyncExport(),
		telemetry.WithStepSampler(sdktrace.AlwaysSample()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/jobs", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
	mux.HandleFunc("GET /metrics", func(http.ResponseWriter, *http.Request) {})
	h := telemetry.HTTPHandler(mux, p)
	req := httptest.NewRequest("POST", "/v1/jobs", nil)
	req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	h.ServeHTTP(httptest.NewRecorder(), req)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/metrics", nil))
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1 (GET /metrics is not traced)", len(spans))
	}
	s := spans[0]
	if s.Name != "POST /v1/jobs" || s.SpanContext.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("span %q in trace %s", s.Name, s.SpanContext.TraceID())
	}
	if telemetry.HTTPHandler(mux, nil) == nil {
		t.Error("HTTPHandler with tracing off returned nil")
	}
}
