package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/internal/telemetry/otlp"
	"github.com/fanin-ml/fanin/internal/telemetry/traceshape"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/devstack"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
)

// A job of 3 ranks and 2 shards runs 16 steps on 2 runtimes with half the steps sampled: every
// sampled step is one whole trace of the promised shape, and an unsampled step leaves no span.
func TestOneTracePerStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	p, err := otlp.New(ctx, otlp.WithService("fanin-test"), otlp.WithExporter(exp), otlp.WithSyncExport(),
		otlp.WithStepSampler(sdktrace.TraceIDRatioBased(0.5)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(ctx)
	st, err := devstack.Start(ctx, devstack.Config{DataDir: t.TempDir(), NATSPort: -1, Runtimes: 2,
		Logger: testutil.Logger(), Tracing: p, Metrics: metrics.New()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	const ranks, steps = 3, 16
	spec := job.Spec{ID: "traced", Tensors: []job.Tensor{{Name: "w", Shape: []int{1024}}, {Name: "b", Shape: []int{1024}}},
		Ranks: ranks, Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, ShardSize: 4 << 10}
	rec, err := st.Gateway.CreateJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if n := rec.Layout.NumShards(); n != 2 {
		t.Fatalf("layout has %d shards, want 2", n)
	}
	testutil.Train(t, st.URL, rec, steps, sdk.WithTracing(p))

	created := rec.Created.UnixNano()
	sampled := 0
	testutil.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		byTrace := map[string][]traceshape.Span{}
		for _, s := range exp.GetSpans() {
			byTrace[s.SpanContext.TraceID().String()] = append(byTrace[s.SpanContext.TraceID().String()], FromStub(s))
		}
		sampled = 0
		var errs []error
		for step := int64(1); step <= steps; step++ {
			tid, root := telemetry.StepIDs(rec.Spec.ID, created, step)
			spans := byTrace[tid.String()]
			if !p.SampleStep(tid) {
				if len(spans) > 0 {
					errs = append(errs, fmt.Errorf("step %d is not sampled, yet has %d spans:\n%s", step, len(spans), traceshape.Summary(spans)))
				}
				continue
			}
			sampled++
			errs = append(errs, traceshape.Check(spans, traceshape.Step{Job: rec.Spec.ID, Step: step, Ranks: ranks, Shards: 2,
				Function: "sgd", TraceID: tid.String(), RootID: root.String()}))
		}
		return errors.Join(errs...)
	})
	if sampled == 0 || sampled == steps {
		t.Fatalf("%d of %d steps sampled at ratio 0.5", sampled, steps)
	}
	t.Logf("%d of %d steps traced, each one whole trace", sampled, steps)
}

// FromStub converts an exported span.
func FromStub(s tracetest.SpanStub) traceshape.Span {
	out := traceshape.Span{TraceID: s.SpanContext.TraceID().String(), SpanID: s.SpanContext.SpanID().String(),
		Name: s.Name, Attrs: map[string]string{}}
	if s.Parent.IsValid() {
		out.ParentID = s.Parent.SpanID().String()
	}
	for _, kv := range s.Attributes {
		out.Attrs[string(kv.Key)] = kv.Value.Emit()
	}
	for _, l := range s.Links {
		out.Links = append(out.Links, l.SpanContext.SpanID().String())
	}
	if s.Resource != nil {
		if v, ok := s.Resource.Set().Value("service.name"); ok {
			out.Service = v.Emit()
		}
	}
	return out
}

// A worker given any OpenTelemetry provider (sdk.WithTracerProvider) puts each step's spans in the
// step's trace, under the step's remote root, with steps decided by OTEL_TRACES_SAMPLER.
func TestForeignTracerProvider(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(ctx)
	st, err := devstack.Start(ctx, devstack.Config{DataDir: t.TempDir(), NATSPort: -1, Runtimes: 1,
		Logger: testutil.Logger(), NoTelemetry: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, err := st.Gateway.CreateJob(ctx, job.Spec{ID: "foreign", Tensors: []job.Tensor{{Name: "w", Shape: []int{64}}},
		Ranks: 2, Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.1}}, ShardSize: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Train(t, st.URL, rec, 3, sdk.WithTracerProvider(tp))
	for step := int64(1); step <= 3; step++ {
		tid, root := telemetry.StepIDs(rec.Spec.ID, rec.Created.UnixNano(), step)
		steps := 0
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID() == tid && s.Name == telemetry.SpanWorkerStep {
				steps++
				if s.Parent.SpanID() != root {
					t.Errorf("step %d: %s has parent %s, want the step's root %s", step, s.Name, s.Parent.SpanID(), root)
				}
			}
		}
		if steps != 2 {
			t.Errorf("step %d: %d %s spans in its trace, want one per rank (2)", step, steps, telemetry.SpanWorkerStep)
		}
	}
}
