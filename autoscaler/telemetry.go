package autoscaler

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// SpanDecision is the span of one decision of the leader that changes something (moves, drains,
// or a new pool size); its events are the moves, with their reasons.
const SpanDecision = "fanin.autoscaler.decision"

// observeDecision records the decision in the metrics.
func (c *Controller) observeDecision(obs Observations, d Decision) {
	if c.met == nil {
		return
	}
	cores := 0
	for _, r := range obs.Runtimes {
		cores += r.Cores
	}
	c.met.Decision(len(obs.Runtimes), cores, len(obs.Shards), d.Desired, d.Demand, d.Mode, len(d.Moves), len(d.Drain))
}

// traceDecision starts the span of a decision that changes something; carrying it out (placement
// writes, pool driver calls) happens inside it.
func (c *Controller) traceDecision(ctx context.Context, obs Observations, d Decision) (context.Context, trace.Span) {
	if c.tracing == nil || (len(d.Moves) == 0 && len(d.Drain) == 0 && d.Desired == len(obs.Runtimes)) {
		return ctx, nil
	}
	ctx, span := c.tracing.Tracer().Start(ctx, SpanDecision, trace.WithAttributes(
		attribute.Int("fanin.pool.size", len(obs.Runtimes)), attribute.Int("fanin.pool.desired", d.Desired),
		attribute.Float64("fanin.pool.demand_cores", d.Demand), attribute.String("fanin.pool.mode", d.Mode),
		attribute.Int("fanin.moves", len(d.Moves)), attribute.StringSlice("fanin.drain", d.Drain),
		attribute.String("fanin.reasons", strings.Join(d.Reasons, "; "))))
	for i, m := range d.Moves {
		if i == 100 {
			break
		}
		span.AddEvent("move", trace.WithAttributes(attribute.String("fanin.shard_key", m.Shard),
			attribute.String("from", m.From), attribute.String("to", m.To), attribute.String("reason", m.Reason)))
	}
	return ctx, span
}
