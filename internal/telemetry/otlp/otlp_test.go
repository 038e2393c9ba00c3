package otlp_test

import (
	"context"
	"encoding/binary"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/internal/telemetry/otlp"
)

// A root span started with WithStepRoot takes the step's ids; others get random ones.
func TestStepRoot(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	p, err := otlp.New(context.Background(), otlp.WithExporter(exp), otlp.WithSyncExport(),
		otlp.WithStepSampler(sdktrace.AlwaysSample()))
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
	if n := len(exp.GetSpans()); n != 2 {
		t.Errorf("%d spans exported, want 2", n)
	}
}

// The SDK's samplers of a Sampling are the ones the standard names, and decide every trace id as
// Sampling.SampleStep does: a worker, which links no SDK, and a runtime, whose provider samples
// with these, trace the same steps.
func TestSamplers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		s          telemetry.Sampling
		root, full string // descriptions
	}{
		{telemetry.Sampling{Ratio: 0.1, ParentBased: true}, "TraceIDRatioBased{0.1}",
			"ParentBased{root:TraceIDRatioBased{0.1},remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}"},
		{telemetry.Sampling{Ratio: 1}, "AlwaysOnSampler", "AlwaysOnSampler"},
		{telemetry.Sampling{Ratio: 0}, "AlwaysOffSampler", "AlwaysOffSampler"},
		{telemetry.Sampling{Ratio: 0.25}, "TraceIDRatioBased{0.25}", "TraceIDRatioBased{0.25}"},
	} {
		root, full := otlp.Samplers(c.s)
		if root.Description() != c.root || full.Description() != c.full {
			t.Errorf("%+v: samplers %s and %s, want %s and %s", c.s, root.Description(), full.Description(), c.root, c.full)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, ratio := range []float64{0, 1e-9, 0.1, 0.25, 0.5, 0.999, 1, math.Nextafter(1, 0), 2, math.NaN()} {
		s := telemetry.Sampling{Ratio: ratio}
		root, _ := otlp.Samplers(s)
		sdkRoot := sdktrace.TraceIDRatioBased(ratio)
		ids := []trace.TraceID{{}, {15: 1}}
		var bound trace.TraceID // the ids either side of the ratio's bound
		binary.BigEndian.PutUint64(bound[8:], uint64(ratio*(1<<63))<<1)
		ids = append(ids, bound)
		binary.BigEndian.PutUint64(bound[8:], uint64(ratio*(1<<63))<<1-2)
		ids = append(ids, bound)
		for range 20000 {
			var id trace.TraceID
			binary.BigEndian.PutUint64(id[:8], rng.Uint64())
			binary.BigEndian.PutUint64(id[8:], rng.Uint64())
			ids = append(ids, id)
		}
		kept := 0
		for _, id := range ids {
			p := sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: id, Name: telemetry.SpanStep}
			want := s.SampleStep(id)
			if got := root.ShouldSample(p).Decision == sdktrace.RecordAndSample; got != want {
				t.Fatalf("ratio %v, trace id %s: Samplers' root says %v, SampleStep %v", ratio, id, got, want)
			}
			if math.IsNaN(ratio) {
				continue // the SDK's own sampler is undefined there; SamplingFromEnv refuses NaN
			}
			if got := sdkRoot.ShouldSample(p).Decision == sdktrace.RecordAndSample; got != want {
				t.Fatalf("ratio %v, trace id %s: TraceIDRatioBased says %v, SampleStep %v", ratio, id, got, want)
			}
			if want {
				kept++
			}
		}
		if r := min(max(ratio, 0), 1); !math.IsNaN(ratio) && math.Abs(float64(kept)/float64(len(ids))-r) > 0.01 {
			t.Errorf("ratio %v kept %d of %d trace ids", ratio, kept, len(ids))
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
		if got := otlp.EnvEnabled(); got != c.want {
			t.Errorf("EnvEnabled with %v = %v", c.env, got)
		}
	}
}

// Setup installs, as the process's default, a provider that exports over OTLP/HTTP to the
// endpoint the environment names, and its shutdown flushes the spans there and uninstalls it.
// Without an endpoint it installs nothing.
func TestSetup(t *testing.T) {
	var received atomic.Int64
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/traces" {
			n, _ := io.Copy(io.Discard, r.Body)
			received.Add(n)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer sink.Close()
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		t.Setenv(k, "")
	}
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	ctx := context.Background()

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	stop, err := otlp.Setup(ctx, otlp.WithService("fanin-test"))
	if err != nil || telemetry.Default() != nil {
		t.Fatalf("Setup without an endpoint: %v, default %v; want no error and no provider", err, telemetry.Default())
	}
	if err := stop(ctx); err != nil {
		t.Fatal(err)
	}

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.URL)
	stop, err = otlp.Setup(ctx, otlp.WithService("fanin-test"))
	if err != nil {
		t.Fatal(err)
	}
	p := telemetry.Default()
	if p == nil {
		t.Fatal("Setup with an endpoint installed no provider")
	}
	_, span := p.Tracer().Start(ctx, "setup-test")
	span.End()
	if err := stop(ctx); err != nil {
		t.Fatal(err)
	}
	if telemetry.Default() != nil {
		t.Error("the provider is still the default after its shutdown")
	}
	if received.Load() == 0 {
		t.Error("the sink received no spans")
	}

	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")
	if _, err := otlp.Setup(ctx); err == nil {
		t.Error("Setup accepted OTEL_EXPORTER_OTLP_PROTOCOL=thrift")
	}
}
