package otlp

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanin-ml/fanin/internal/telemetry"
)

type config struct {
	service  string
	exporter sdktrace.SpanExporter
	sync     bool
	sampler  sdktrace.Sampler // root sampler; nil: from the environment
	attrs    []attribute.KeyValue
}

// Option configures New.
type Option func(*config) error

// WithService sets service.name when OTEL_SERVICE_NAME (or service.name in
// OTEL_RESOURCE_ATTRIBUTES) does not.
func WithService(name string) Option {
	return func(c *config) error {
		if name == "" {
			return errors.New("telemetry: empty service name")
		}
		c.service = name
		return nil
	}
}

// WithAttributes adds resource attributes (service.version, service.instance.id, ...).
func WithAttributes(kv ...attribute.KeyValue) Option {
	return func(c *config) error { c.attrs = append(c.attrs, kv...); return nil }
}

// WithExporter exports to exp instead of the OTLP exporter the environment configures.
func WithExporter(exp sdktrace.SpanExporter) Option {
	return func(c *config) error { c.exporter = exp; return nil }
}

// WithSyncExport exports every span as it ends instead of in batches (tests).
func WithSyncExport() Option {
	return func(c *config) error { c.sync = true; return nil }
}

// WithStepSampler decides steps with root instead of OTEL_TRACES_SAMPLER (nil: as that says); the
// spans of a step follow their parent's decision (the standard parent-based rule).
func WithStepSampler(root sdktrace.Sampler) Option {
	return func(c *config) error { c.sampler = root; return nil }
}

// New makes a tracer provider that exports over OTLP as the OTEL_* environment variables say (or to
// WithExporter's exporter). Options: WithService, WithAttributes, WithExporter, WithSyncExport,
// WithStepSampler. The caller shuts it down.
//
// Variables read: OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL (grpc or http/protobuf, the default) and
// the exporters' own OTEL_EXPORTER_OTLP_[TRACES_]{ENDPOINT,HEADERS,INSECURE,TIMEOUT,COMPRESSION,
// CERTIFICATE}; OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG; OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES; OTEL_BSP_* for batching.
func New(ctx context.Context, opts ...Option) (*telemetry.Provider, error) {
	c := config{service: "fanin"}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	root := c.sampler
	var full sdktrace.Sampler
	if root == nil {
		s, err := telemetry.SamplingFromEnv()
		if err != nil {
			return nil, err
		}
		root, full = Samplers(s)
	} else {
		full = sdktrace.ParentBased(root)
	}
	exp := c.exporter
	if exp == nil {
		var err error
		if exp, err = otlpExporter(ctx); err != nil {
			return nil, err
		}
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(append([]attribute.KeyValue{attribute.String("service.name", c.service)}, c.attrs...)...),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && res == nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	export := sdktrace.WithBatcher(exp)
	if c.sync {
		export = sdktrace.WithSyncer(exp)
	}
	tp := sdktrace.NewTracerProvider(export, sdktrace.WithResource(res), sdktrace.WithSampler(full),
		sdktrace.WithIDGenerator(stepIDGenerator{}))
	return telemetry.NewProvider(telemetry.ProviderConfig{
		TracerProvider: tp,
		SampleStep: func(id trace.TraceID) bool {
			return root.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: id,
				Name: telemetry.SpanStep}).Decision == sdktrace.RecordAndSample
		},
		OwnsStepRoot: true,
		ForceFlush:   tp.ForceFlush,
		Shutdown:     tp.Shutdown,
	}), nil
}

// Samplers are the OpenTelemetry SDK's samplers of s: root decides a step (the root rule), full is
// the provider's (root under the parent-based rule when s.ParentBased). They decide as
// s.SampleStep does.
func Samplers(s telemetry.Sampling) (root, full sdktrace.Sampler) {
	switch {
	case s.Ratio >= 1:
		root = sdktrace.AlwaysSample()
	case !(s.Ratio > 0):
		root = sdktrace.NeverSample()
	default:
		root = sdktrace.TraceIDRatioBased(s.Ratio)
	}
	if s.ParentBased {
		return root, sdktrace.ParentBased(root)
	}
	return root, root
}

func otlpExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	proto := firstEnv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	switch strings.ToLower(proto) {
	case "grpc":
		return otlptracegrpc.New(ctx)
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	default:
		return nil, fmt.Errorf("telemetry: OTEL_EXPORTER_OTLP_PROTOCOL %q is not supported (grpc or http/protobuf)", proto)
	}
}

// EnvEnabled reports whether the environment asks for traces: OTEL_SDK_DISABLED is not true, and
// OTEL_TRACES_EXPORTER is otlp, or is unset and an OTLP endpoint is set. Without either, fanin
// exports nothing (rather than trying localhost:4318 and logging failures).
func EnvEnabled() bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	switch strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))) {
	case "none":
		return false
	case "":
		return firstEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	default:
		return true
	}
}

// FromEnv makes a provider as New does when EnvEnabled, and returns nil (tracing off) otherwise.
func FromEnv(ctx context.Context, opts ...Option) (*telemetry.Provider, error) {
	if !EnvEnabled() {
		return nil, nil
	}
	switch exp := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))); exp {
	case "", "otlp":
	default:
		return nil, fmt.Errorf("telemetry: OTEL_TRACES_EXPORTER %q is not supported (otlp or none)", exp)
	}
	return New(ctx, opts...)
}

// Setup installs the provider the environment asks for (see EnvEnabled and New) as the process's
// default (telemetry.SetDefault) and returns the function that flushes and stops it; with tracing
// off both are no-ops.
func Setup(ctx context.Context, opts ...Option) (shutdown func(context.Context) error, err error) {
	p, err := FromEnv(ctx, opts...)
	if err != nil || p == nil {
		return func(context.Context) error { return nil }, err
	}
	telemetry.SetDefault(p)
	return func(ctx context.Context) error {
		telemetry.ClearDefault(p)
		return p.Shutdown(ctx)
	}, nil
}

func firstEnv(keys ...string) string {
	for _, k := range keys {
		if v := strings.TrimSpace(os.Getenv(k)); v != "" {
			return v
		}
	}
	return ""
}

// stepIDGenerator generates random ids, except for a root span started in a context made by
// telemetry.WithStepRoot: it takes the step's ids.
type stepIDGenerator struct{}

func (stepIDGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if t, s, ok := telemetry.StepRootIDs(ctx); ok {
		return t, s
	}
	var t trace.TraceID
	for !t.IsValid() {
		putUint64(t[:8], rand.Uint64())
		putUint64(t[8:], rand.Uint64())
	}
	return t, randomSpanID()
}

func (stepIDGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return randomSpanID() }

func randomSpanID() trace.SpanID {
	var s trace.SpanID
	for !s.IsValid() {
		putUint64(s[:], rand.Uint64())
	}
	return s
}

func putUint64(b []byte, v uint64) {
	_ = b[7]
	for i := 7; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}
