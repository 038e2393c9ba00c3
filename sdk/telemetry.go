package sdk

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/wire"
)

// WithTracerProvider traces the client's workers with tp: one trace per step, shared by every rank
// and the runtimes (docs/TELEMETRY.md). Which steps are traced is decided as fanin's processes
// decide, from OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default: one step in ten), so that
// a step is traced whole; tp's own sampler should follow the parent (the default ParentBased).
//
// The SDK links the OpenTelemetry API only: the program sets up tp, with the exporter it wants
// (go.opentelemetry.io/otel/sdk/trace and an OTLP exporter, say), or passes the global one,
// otel.GetTracerProvider(), once it has called otel.SetTracerProvider. Without this option a
// worker traces nothing, except in fanin's own processes (WithTracing).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *Client) error {
		if tp == nil {
			return errors.New("WithTracerProvider: nil tracer provider (use WithTracing(nil) to turn tracing off)")
		}
		s, err := telemetry.SamplingFromEnv()
		if err != nil {
			return err
		}
		c.tracing = telemetry.Wrap(tp, s)
		return nil
	}
}

// WithTracing sets fanin's tracer provider (default telemetry.Default(), which the fanin binary
// sets up from the OTEL_* variables with package otlp); nil turns tracing off.
func WithTracing(p *telemetry.Provider) Option {
	return func(c *Client) error { c.tracing = p; return nil }
}

// stepTrace is the tracing of one Step call; nil when the step is not traced.
type stepTrace struct {
	tr                  trace.Tracer
	ctx                 context.Context // holds the worker's step span
	root, step, publish trace.Span      // root: rank 0's fanin.step span, or nil
}

// traceStep decides whether step t is traced and, if it is, starts its spans and sets the
// traceparent header of the gradients to the publish span. An untraced step's gradients carry no
// traceparent: a runtime decides on the step's trace id as the workers did, so nothing is sent or
// parsed for the steps that are not traced. With tracing off it does nothing.
func (w *Worker) traceStep(ctx context.Context, t int64) *stepTrace {
	p := w.c.tracing
	if p == nil {
		return nil
	}
	id, created := w.rec.Spec.ID, w.rec.Created.UnixNano()
	tid, _ := telemetry.StepIDs(id, created, t)
	if !p.SampleStep(tid) {
		for _, m := range w.msgs {
			if m != nil {
				delete(m.Header, wire.HdrTraceparent)
			}
		}
		return nil
	}
	tr := p.Tracer()
	st := &stepTrace{tr: tr}
	attrs := trace.WithAttributes(telemetry.AttrJob.String(id), telemetry.AttrStep.Int64(t),
		telemetry.AttrRanks.Int(w.rec.Spec.Ranks), telemetry.AttrShards.Int(w.rec.Layout.NumShards()))
	if slices.Contains(w.ranks, 0) && p.OwnsStepRoot() {
		ctx, st.root = tr.Start(telemetry.WithStepRoot(ctx, id, created, t), telemetry.SpanStep, trace.WithNewRoot(), attrs)
	} else {
		ctx = trace.ContextWithRemoteSpanContext(ctx, telemetry.StepParent(id, created, t, true))
	}
	st.ctx, st.step = tr.Start(ctx, telemetry.SpanWorkerStep, attrs, trace.WithAttributes(telemetry.AttrRank.Int(w.rank)))
	_, st.publish = tr.Start(st.ctx, telemetry.SpanWorkerPublish, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		telemetry.AttrJob.String(id), telemetry.AttrStep.Int64(t), telemetry.AttrRank.Int(w.rank),
		telemetry.AttrShards.Int(w.rec.Layout.NumShards()), telemetry.AttrBytes.Int64(4*int64(w.rec.Layout.Elements)),
		telemetry.AttrSystem.String("nats")))
	w.setTraceparent(st.publish.SpanContext())
	return st
}

// setTraceparent sets the traceparent of every shard's gradient message (one value, shared).
func (w *Worker) setTraceparent(sc trace.SpanContext) {
	v := []string{telemetry.FormatTraceparent(sc)}
	for _, m := range w.msgs {
		if m != nil {
			m.Header[wire.HdrTraceparent] = v
		}
	}
}

// published ends the publish span.
func (st *stepTrace) published(err error) {
	if st == nil {
		return
	}
	telemetry.EndSpan(st.publish, err)
}

// done ends the step's spans.
func (st *stepTrace) done(err error) {
	if st == nil {
		return
	}
	telemetry.EndSpan(st.step, err)
	if st.root != nil {
		telemetry.EndSpan(st.root, err)
	}
}

// fetch traces a fetch of shard's parameters after a missed push.
func (st *stepTrace) fetch(shard int) trace.Span {
	if st == nil {
		return nil
	}
	_, s := st.tr.Start(st.ctx, telemetry.SpanWorkerFetch, trace.WithAttributes(telemetry.AttrShard.Int(shard)))
	return s
}

// traceReceive records the receipt of a shard's parameters pushed by a runtime whose publish span is
// in the message's traceparent. w.mu is held; received is when the message arrived.
func (w *Worker) traceReceive(m *nats.Msg, shard int, step int64, received time.Time) {
	p := w.c.tracing
	if p == nil {
		return
	}
	sc, ok := telemetry.Traceparent(m.Header)
	if !ok || !sc.IsSampled() {
		return
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), sc)
	_, s := p.Tracer().Start(ctx, telemetry.SpanWorkerReceive, trace.WithTimestamp(received), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(telemetry.AttrJob.String(w.rec.Spec.ID), telemetry.AttrShard.Int(shard), telemetry.AttrStep.Int64(step),
			telemetry.AttrRank.Int(w.rank), telemetry.AttrBytes.Int(len(m.Data)), telemetry.AttrSystem.String("nats"),
			telemetry.AttrSubject.String(m.Subject)))
	s.End()
}
