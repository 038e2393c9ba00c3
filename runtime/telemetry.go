package runtime

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanin-ml/fanin/internal/metrics"
	"github.com/fanin-ml/fanin/internal/telemetry"
	"github.com/fanin-ml/fanin/wire"
)

// WithTracing sets the tracer provider (default telemetry.Default(), the one the process set up
// from OTEL_* variables); nil turns tracing off.
func WithTracing(p *telemetry.Provider) Option {
	return func(r *Runtime) error { r.tracing = p; return nil }
}

// WithMetrics sets the registry the runtime's metrics go to (default metrics.Default()); nil turns
// them off.
func WithMetrics(m *metrics.Metrics) Option {
	return func(r *Runtime) error { r.metrics = m; return nil }
}

// stepTimes are the open step's timestamps, for its metrics and spans. Guarded by the shard's mu.
// Taking them allocates nothing: the per-message path must not.
type stepTimes struct {
	stored     int64     // JetStream's time (UnixNano) of the message being handled; 0: unknown
	first      time.Time // the step's first gradient stored in JetStream (or arrived, if unknown)
	lastStored time.Time // the latest gradient stored: once complete, the one that completed the step
	folding    time.Time // the latest gradient got a core
	lastRank   int       // the latest gradient's rank
	fnStart    time.Time
	fnEnd      time.Time
}

// stepTrace is the open step's tracing state. Guarded by the shard's mu.
type stepTrace struct {
	sampled bool
	parent  trace.SpanContext   // the first gradient's span, or the step's root span
	links   []trace.SpanContext // per rank, the gradients' spans; made at the first sampled step
}

// storedAt is when JetStream stored the message being handled, or now if unknown or later (clocks
// of different machines).
func (x *shardExec) storedAt(now time.Time) time.Time {
	if x.times.stored > 0 && x.times.stored < now.UnixNano() {
		return time.Unix(0, x.times.stored)
	}
	return now
}

// observeGradient notes an admitted gradient of rank for the step's telemetry; first says it opens
// the step. x.mu is held. It allocates nothing (except, once per sampled step, the spans' links).
func (x *shardExec) observeGradient(m jetstream.Msg, step int64, rank int, first bool, now time.Time) {
	at := x.storedAt(now)
	x.times.lastStored = at
	if first {
		x.times.first = at
	}
	if x.r.tracing == nil {
		return
	}
	sc, ok := telemetry.Traceparent(m.Headers())
	if first {
		switch {
		case ok:
			x.trace.parent, x.trace.sampled = sc, sc.IsSampled()
		default: // a worker that sent no trace context: the step's trace decides
			t, _ := telemetry.StepIDs(x.ji.rec.Spec.ID, x.created, step)
			x.trace.sampled = x.r.tracing.SampleStep(t)
			x.trace.parent = telemetry.StepParent(x.ji.rec.Spec.ID, x.created, step, x.trace.sampled)
		}
		if x.trace.sampled && x.trace.links == nil {
			x.trace.links = make([]trace.SpanContext, x.ranks)
		}
		if x.trace.links != nil {
			clear(x.trace.links)
		}
	}
	if x.trace.sampled && ok {
		x.trace.links[rank] = sc
	}
}

// stepDone carries a completed step's telemetry to the acknowledgement of its parameters.
type stepDone struct {
	met      *metrics.JobMetrics
	first    time.Time
	function time.Duration
	wait     time.Duration
	spans    *stepSpans // nil unless the step is traced
}

type stepSpans struct {
	invoke, publish trace.Span
}

// completeStep is called when the step's parameters are about to be published in msg: it starts the
// step's spans if it is traced (and sets msg's traceparent to the publish span, or removes it) and
// returns what acked finishes. x.mu is held.
func (x *shardExec) completeStep(msg *nats.Msg) stepDone {
	d := stepDone{
		met: x.met, first: x.times.first,
		function: x.times.fnEnd.Sub(x.times.fnStart),
		wait:     max(0, x.times.folding.Sub(x.times.lastStored)),
	}
	if x.r.tracing == nil || !x.trace.sampled {
		delete(msg.Header, wire.HdrTraceparent)
		return d
	}
	tr := x.r.tracing.Tracer()
	job := x.ji.rec.Spec.ID
	var links []trace.Link
	for r, sc := range x.trace.links {
		if sc.IsValid() && !sc.Equal(x.trace.parent) && len(links) < maxLinks {
			links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{telemetry.AttrRank.Int(r)}})
		}
	}
	bytes := int64(x.ranks) * int64(x.shard.Bytes())
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), x.trace.parent)
	ctx, inv := tr.Start(ctx, telemetry.SpanInvoke, trace.WithTimestamp(x.times.first), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...), trace.WithAttributes(
			telemetry.AttrJob.String(job), telemetry.AttrShard.Int(x.shard.ID), telemetry.AttrStep.Int64(x.step),
			telemetry.AttrRanks.Int(x.ranks), telemetry.AttrBytes.Int64(bytes), telemetry.AttrFunction.String(x.fn.Name()),
			telemetry.AttrRuntime.String(x.r.id), telemetry.AttrEpoch.Int64(int64(x.epoch)),
			telemetry.AttrLastRank.Int(x.times.lastRank),
			telemetry.AttrSystem.String("nats"), telemetry.AttrSubject.String(x.gradSj)))
	child := func(name string, from, to time.Time, kv ...attribute.KeyValue) {
		_, s := tr.Start(ctx, name, trace.WithTimestamp(from), trace.WithAttributes(kv...))
		s.End(trace.WithTimestamp(to))
	}
	child(telemetry.SpanQueueWait, x.times.lastStored, x.times.lastStored.Add(d.wait), telemetry.AttrRank.Int(x.times.lastRank))
	child(telemetry.SpanGather, x.times.first, x.times.fnStart, telemetry.AttrRanks.Int(x.ranks), telemetry.AttrBytes.Int64(bytes))
	child(telemetry.SpanFunction, x.times.fnStart, x.times.fnEnd, telemetry.AttrFunction.String(x.fn.Name()),
		telemetry.AttrBytes.Int64(int64(x.shard.Bytes())))
	_, pub := tr.Start(ctx, telemetry.SpanPublish, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		telemetry.AttrBytes.Int64(int64(len(msg.Data))), telemetry.AttrSystem.String("nats"), telemetry.AttrSubject.String(msg.Subject)))
	telemetry.SetTraceparent(msg.Header, pub.SpanContext())
	d.spans = &stepSpans{invoke: inv, publish: pub}
	return d
}

// maxLinks bounds the links of an invocation span to the ranks' gradient spans.
const maxLinks = 128

// acked finishes a step's telemetry when JetStream has stored its parameters (ok) or given up.
func (d stepDone) acked(ok bool) {
	now := time.Now()
	if ok {
		d.met.Invocation(now.Sub(d.first), d.function, d.wait)
	}
	if d.spans != nil {
		if !ok {
			d.spans.publish.SetStatus(codes.Error, "parameters not acknowledged; the shard replays from its last snapshot")
		}
		d.spans.publish.End(trace.WithTimestamp(now))
		d.spans.invoke.End(trace.WithTimestamp(now))
	}
}

// shardGauges reports every shard's pending messages and step, when metrics are scraped.
func (r *Runtime) shardGauges(yield func(metrics.ShardGauge)) {
	for _, x := range r.shardExecs() {
		x.mu.Lock()
		g := metrics.ShardGauge{Job: x.ji.rec.Spec.ID, Pending: x.stats.pending, Step: x.step}
		x.mu.Unlock()
		yield(g)
	}
}

// ackStamp is the timestamp (UnixNano) in a JetStream message's ack reply subject, or 0. Both
// forms are accepted (see wire.AckInfo); it allocates nothing.
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>
//	$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>[.<token>]
func ackStamp(reply string) int64 {
	tokens := 1
	for i := 0; i < len(reply); i++ {
		if reply[i] == '.' {
			tokens++
		}
	}
	var pos int
	switch {
	case tokens == 9:
		pos = 7
	case tokens >= 11:
		pos = 9
	default:
		return 0
	}
	tok, start := 0, 0
	for i := 0; i <= len(reply); i++ {
		if i == len(reply) || reply[i] == '.' {
			if tok == pos {
				var n int64
				for _, c := range []byte(reply[start:i]) {
					if c < '0' || c > '9' {
						return 0
					}
					n = n*10 + int64(c-'0')
				}
				return n
			}
			tok++
			start = i + 1
		}
	}
	return 0
}
