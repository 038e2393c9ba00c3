package telemetry

import (
	"context"
	"encoding/binary"

	"go.opentelemetry.io/otel/trace"
)

// StepIDs are the ids of a step's trace and of its root span, derived from the job's id, its
// creation time (UnixNano; a job re-created under the same id gets new traces) and the step. Every
// process computes them alike, so the N ranks' workers and the runtimes of all shards join one trace
// per step without talking to each other, and a sampler that decides on the trace id (traceidratio)
// keeps or drops a step whole. The trace id's low 8 bytes, which traceidratio reads, are uniform.
func StepIDs(job string, created, step int64) (trace.TraceID, trace.SpanID) {
	h := uint64(14695981039346656037) // FNV-1a of the job id
	for i := 0; i < len(job); i++ {
		h ^= uint64(job[i])
		h *= 1099511628211
	}
	a := mix64(h ^ mix64(uint64(created)^0x5851f42d4c957f2d) ^ mix64(uint64(step)+0x9e3779b97f4a7c15))
	b := mix64(a ^ 0xd1b54a32d192ed03)
	c := mix64(b ^ 0x8cb92ba72f3d8dd7)
	var t trace.TraceID
	var s trace.SpanID
	binary.BigEndian.PutUint64(t[:8], a)
	binary.BigEndian.PutUint64(t[8:], b)
	binary.BigEndian.PutUint64(s[:], c)
	if !t.IsValid() {
		t[15] = 1
	}
	if !s.IsValid() {
		s[7] = 1
	}
	return t, s
}

// mix64 is splitmix64's finalizer: every input bit flips each output bit with probability 1/2.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// StepParent is the span context of a step's root span, as a remote parent: the parent of every
// rank's step span, and of a shard invocation whose gradients carried no traceparent.
func StepParent(job string, created, step int64, sampled bool) trace.SpanContext {
	t, s := StepIDs(job, created, step)
	var flags trace.TraceFlags
	if sampled {
		flags = trace.FlagsSampled
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: t, SpanID: s, TraceFlags: flags, Remote: true})
}

// WithStepRoot makes the next root span started from ctx (trace.WithNewRoot) take the step's trace
// and span ids, with a provider whose id generator reads StepRootIDs (Provider.OwnsStepRoot).
func WithStepRoot(ctx context.Context, job string, created, step int64) context.Context {
	t, s := StepIDs(job, created, step)
	return context.WithValue(ctx, stepRootKey{}, stepRoot{trace: t, span: s})
}

// StepRootIDs are the ids WithStepRoot put in ctx, for a tracer provider's id generator; ok is false
// when ctx holds none.
func StepRootIDs(ctx context.Context) (t trace.TraceID, s trace.SpanID, ok bool) {
	r, ok := ctx.Value(stepRootKey{}).(stepRoot)
	return r.trace, r.span, ok
}

type stepRootKey struct{}

type stepRoot struct {
	trace trace.TraceID
	span  trace.SpanID
}
