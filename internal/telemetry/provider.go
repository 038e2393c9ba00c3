package telemetry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of fanin's spans.
const ScopeName = "github.com/fanin-ml/fanin"

// DefaultSampler is the sampler used when OTEL_TRACES_SAMPLER is unset, with DefaultSamplerArg.
// It is the standard's parentbased_traceidratio: a step is traced whole or not at all, because
// every process decides on the step's trace id, which all of them derive alike (see StepIDs).
const (
	DefaultSampler    = "parentbased_traceidratio"
	DefaultSamplerArg = "0.1"
)

// Provider is a tracer provider with the step decision fanin needs: SampleStep tells, from a step's
// trace id alone, whether the step is traced, so that every rank and every shard of a step decide
// alike without talking to each other. A nil *Provider means tracing is off.
type Provider struct {
	tp     trace.TracerProvider
	sdk    *sdktrace.TracerProvider // nil when tp came from elsewhere (Wrap)
	root   sdktrace.Sampler         // decides a step: the root sampler, without the parent rule
	tracer trace.Tracer
	ownIDs bool // tp generates the ids of WithStepRoot
}

// Tracer is fanin's tracer.
func (p *Provider) Tracer() trace.Tracer { return p.tracer }

// TracerProvider is the underlying provider.
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tp }

// SampleStep reports whether the step whose trace id is id is traced.
func (p *Provider) SampleStep(id trace.TraceID) bool {
	return p.root.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: id, Name: SpanStep}).Decision == sdktrace.RecordAndSample
}

// OwnsStepRoot reports whether a root span started with WithStepRoot gets the step's ids: true for
// providers made by New, whose id generator honours it.
func (p *Provider) OwnsStepRoot() bool { return p.ownIDs }

// ForceFlush exports the spans that have ended and are still buffered.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.ForceFlush(ctx)
}

// Shutdown flushes and stops the provider made by New; a wrapped one is left to its owner.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// Wrap makes a Provider of a tracer provider made elsewhere. Its steps are decided by root (nil:
// every step is traced); the step's root span cannot take the step's ids (tp has its own id
// generator), so each rank's spans hang under the step's remote parent instead, which no process
// emits (see StepIDs).
func Wrap(tp trace.TracerProvider, root sdktrace.Sampler) *Provider {
	if root == nil {
		root = sdktrace.AlwaysSample()
	}
	return &Provider{tp: tp, root: root, tracer: tp.Tracer(ScopeName)}
}

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

// WithStepSampler decides steps with root instead of OTEL_TRACES_SAMPLER; the spans of a step
// follow their parent's decision (the standard parent-based rule).
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
func New(ctx context.Context, opts ...Option) (*Provider, error) {
	c := config{service: "fanin"}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	root := c.sampler
	full := sdktrace.ParentBased(root)
	if root == nil {
		var err error
		if root, full, err = SamplerFromEnv(); err != nil {
			return nil, err
		}
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
	return &Provider{tp: tp, sdk: tp, root: root, tracer: tp.Tracer(ScopeName), ownIDs: true}, nil
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
func FromEnv(ctx context.Context, opts ...Option) (*Provider, error) {
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

// SamplerFromEnv reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default: DefaultSampler
// with DefaultSamplerArg). It returns the sampler that decides a step (root) and the one the
// provider uses (full: root under the parent-based rule for the parentbased_* samplers).
func SamplerFromEnv() (root, full sdktrace.Sampler, err error) {
	name := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
	if name == "" {
		name, arg = DefaultSampler, DefaultSamplerArg
	}
	ratio := func() (sdktrace.Sampler, error) {
		if arg == "" {
			return sdktrace.AlwaysSample(), nil
		}
		f, err := strconv.ParseFloat(arg, 64)
		if err != nil || f < 0 || f > 1 {
			return nil, fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER_ARG %q is not a ratio in [0, 1]", arg)
		}
		return sdktrace.TraceIDRatioBased(f), nil
	}
	parent := strings.HasPrefix(name, "parentbased_")
	switch strings.TrimPrefix(name, "parentbased_") {
	case "always_on":
		root = sdktrace.AlwaysSample()
	case "always_off":
		root = sdktrace.NeverSample()
	case "traceidratio":
		if root, err = ratio(); err != nil {
			return nil, nil, err
		}
	default:
		return nil, nil, fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER %q is not supported (always_on, always_off, traceidratio, parentbased_*)", name)
	}
	if parent {
		return root, sdktrace.ParentBased(root), nil
	}
	return root, root, nil
}

func firstEnv(keys ...string) string {
	for _, k := range keys {
		if v := strings.TrimSpace(os.Getenv(k)); v != "" {
			return v
		}
	}
	return ""
}

// defaultProvider is the process's provider, set by Setup; nil when tracing is off.
var defaultProvider atomic.Pointer[Provider]

// Default is the provider Setup installed, or nil: components use it unless given another.
func Default() *Provider { return defaultProvider.Load() }

// SetDefault installs p (nil: tracing off) as the process's provider and, when not nil, as the
// OpenTelemetry global, with the W3C trace context propagator.
func SetDefault(p *Provider) {
	defaultProvider.Store(p)
	if p != nil {
		otel.SetTracerProvider(p.tp)
		otel.SetTextMapPropagator(propagation.TraceContext{})
	}
}

// Setup installs the provider the environment asks for (see EnvEnabled and New) as the process's
// default and returns the function that flushes and stops it; with tracing off both are no-ops.
func Setup(ctx context.Context, opts ...Option) (shutdown func(context.Context) error, err error) {
	p, err := FromEnv(ctx, opts...)
	if err != nil || p == nil {
		return func(context.Context) error { return nil }, err
	}
	SetDefault(p)
	return func(ctx context.Context) error {
		defaultProvider.CompareAndSwap(p, nil)
		return p.Shutdown(ctx)
	}, nil
}

// stepIDGenerator generates random ids, except for a root span started in a context made by
// WithStepRoot: it takes the step's ids.
type stepIDGenerator struct{}

type stepRootKey struct{}

type stepRoot struct {
	trace trace.TraceID
	span  trace.SpanID
}

func (stepIDGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if r, ok := ctx.Value(stepRootKey{}).(stepRoot); ok {
		return r.trace, r.span
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
