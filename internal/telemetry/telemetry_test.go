package telemetry_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/internal/telemetry/otlp"
	"github.com/fanin-ml/fanin/wire"
)

// Not parallel: testing.AllocsPerRun counts the whole process's allocations.
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
	t.Parallel()
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
	p := telemetry.Wrap(noop.NewTracerProvider(), telemetry.Sampling{Ratio: 0.1})
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

func TestSamplingFromEnv(t *testing.T) {
	for _, c := range []struct {
		name, arg string
		want      telemetry.Sampling
		ok        bool
	}{
		{"", "", telemetry.Sampling{Ratio: 0.1, ParentBased: true}, true},
		{"always_on", "", telemetry.Sampling{Ratio: 1}, true},
		{"parentbased_always_off", "", telemetry.Sampling{Ratio: 0, ParentBased: true}, true},
		{"traceidratio", "0.25", telemetry.Sampling{Ratio: 0.25}, true},
		{"parentbased_traceidratio", "", telemetry.Sampling{Ratio: 1, ParentBased: true}, true},
		{"traceidratio", "2", telemetry.Sampling{}, false},
		{"traceidratio", "NaN", telemetry.Sampling{}, false},
		{"traceidratio", "-0.5", telemetry.Sampling{}, false},
		{"jaeger_remote", "", telemetry.Sampling{}, false},
	} {
		t.Setenv("OTEL_TRACES_SAMPLER", c.name)
		t.Setenv("OTEL_TRACES_SAMPLER_ARG", c.arg)
		got, err := telemetry.SamplingFromEnv()
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("OTEL_TRACES_SAMPLER=%q ARG=%q: %+v, %v; want %+v (ok %v)", c.name, c.arg, got, err, c.want, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "OTEL_TRACES_SAMPLER") {
			t.Errorf("OTEL_TRACES_SAMPLER=%q ARG=%q: the error %q names no variable", c.name, c.arg, err)
		}
	}
}

// The HTTP middleware names a request's span after its route and continues the caller's trace.
func TestHTTPHandler(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	p, err := otlp.New(context.Background(), otlp.WithExporter(exp), otlp.WithSyncExport(),
		otlp.WithStepSampler(sdktrace.AlwaysSample()))
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
