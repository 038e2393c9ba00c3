package telemetry

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
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
//
// This package depends on the OpenTelemetry API only; package otlp makes the Provider of fanin's
// processes (an OpenTelemetry SDK exporting over OTLP), Wrap one of any other tracer provider.
type Provider struct {
	tp              trace.TracerProvider
	tracer          trace.Tracer
	sample          func(trace.TraceID) bool // decides a step: the root rule, without the parent one
	ownIDs          bool                     // tp generates the ids of WithStepRoot
	flush, shutdown func(context.Context) error
}

// ProviderConfig describes the Provider NewProvider makes.
type ProviderConfig struct {
	TracerProvider trace.TracerProvider
	// SampleStep decides whether the step of a trace id is traced (nil: every step). It must agree
	// with TracerProvider's own sampler on a root span of that trace id.
	SampleStep func(trace.TraceID) bool
	// OwnsStepRoot says that TracerProvider's id generator gives a root span started from a
	// context made by WithStepRoot the step's ids (StepRootIDs).
	OwnsStepRoot bool
	// ForceFlush and Shutdown flush and stop TracerProvider (nil: its owner does).
	ForceFlush, Shutdown func(context.Context) error
}

// NewProvider makes a Provider of c.
func NewProvider(c ProviderConfig) *Provider {
	sample := c.SampleStep
	if sample == nil {
		sample = func(trace.TraceID) bool { return true }
	}
	return &Provider{tp: c.TracerProvider, tracer: c.TracerProvider.Tracer(ScopeName), sample: sample,
		ownIDs: c.OwnsStepRoot, flush: c.ForceFlush, shutdown: c.Shutdown}
}

// Tracer is fanin's tracer.
func (p *Provider) Tracer() trace.Tracer { return p.tracer }

// TracerProvider is the underlying provider.
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tp }

// SampleStep reports whether the step whose trace id is id is traced.
func (p *Provider) SampleStep(id trace.TraceID) bool { return p.sample(id) }

// OwnsStepRoot reports whether a root span started with WithStepRoot gets the step's ids: true for
// the providers package otlp makes, whose id generator honours it.
func (p *Provider) OwnsStepRoot() bool { return p.ownIDs }

// ForceFlush exports the spans that have ended and are still buffered.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p == nil || p.flush == nil {
		return nil
	}
	return p.flush(ctx)
}

// Shutdown flushes and stops a provider that package otlp made; a wrapped one is left to its owner.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.shutdown == nil {
		return nil
	}
	return p.shutdown(ctx)
}

// Wrap makes a Provider of a tracer provider made elsewhere, whose steps s decides. The step's root
// span cannot take the step's ids (tp has its own id generator), so each rank's spans hang under
// the step's remote parent instead, which no process emits (see StepIDs).
func Wrap(tp trace.TracerProvider, s Sampling) *Provider {
	return NewProvider(ProviderConfig{TracerProvider: tp, SampleStep: s.SampleStep})
}

// Sampling is which steps are traced, as OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG say
// (SamplingFromEnv).
type Sampling struct {
	// Ratio is the fraction of steps traced, in [0, 1]. A step is traced when its trace id falls
	// in the ratio by the rule of OpenTelemetry's TraceIDRatioBased sampler (the trace id's low 8
	// bytes, shifted right once, below Ratio * 2^63): every process decides a step alike, and alike
	// with a provider whose sampler is that one.
	Ratio float64
	// ParentBased makes a span that has a parent follow the parent's decision (the
	// parentbased_* samplers); without it, every span is decided on its trace id.
	ParentBased bool
}

// SampleStep reports whether the step whose trace id is id is traced.
func (s Sampling) SampleStep(id trace.TraceID) bool {
	switch {
	case s.Ratio >= 1:
		return true
	case !(s.Ratio > 0): // NaN too
		return false
	}
	return binary.BigEndian.Uint64(id[8:16])>>1 < uint64(s.Ratio*(1<<63))
}

// SamplingFromEnv reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default: DefaultSampler
// with DefaultSamplerArg). Supported: always_on, always_off, traceidratio (ARG a ratio in [0, 1],
// default 1) and their parentbased_ forms.
func SamplingFromEnv() (Sampling, error) {
	name := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
	if name == "" {
		name, arg = DefaultSampler, DefaultSamplerArg
	}
	s := Sampling{ParentBased: strings.HasPrefix(name, "parentbased_")}
	switch strings.TrimPrefix(name, "parentbased_") {
	case "always_on":
		s.Ratio = 1
	case "always_off":
		s.Ratio = 0
	case "traceidratio":
		s.Ratio = 1
		if arg != "" {
			f, err := strconv.ParseFloat(arg, 64)
			if err != nil || !(f >= 0 && f <= 1) {
				return Sampling{}, fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER_ARG %q is not a ratio in [0, 1]", arg)
			}
			s.Ratio = f
		}
	default:
		return Sampling{}, fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER %q is not supported (always_on, always_off, traceidratio, parentbased_*)", name)
	}
	return s, nil
}

// defaultProvider is the process's provider, set by SetDefault; nil when tracing is off.
var defaultProvider atomic.Pointer[Provider]

// Default is the provider SetDefault installed, or nil: components use it unless given another.
func Default() *Provider { return defaultProvider.Load() }

// SetDefault installs p (nil: tracing off) as the process's provider and, when not nil, as the
// OpenTelemetry global, with the W3C trace context propagator. fanin's processes call it through
// otlp.Setup.
func SetDefault(p *Provider) {
	defaultProvider.Store(p)
	if p != nil {
		otel.SetTracerProvider(p.tp)
		otel.SetTextMapPropagator(propagation.TraceContext{})
	}
}

// ClearDefault uninstalls p as the process's provider, if it is the one installed.
func ClearDefault(p *Provider) { defaultProvider.CompareAndSwap(p, nil) }
