// Package sdk is the Go client of fanin: workers publish gradients and receive parameters over NATS;
// operators create and delete jobs through the gateway's HTTP API.
//
// # Tracing and metrics
//
// The SDK links the OpenTelemetry API and no exporter, and no metrics library, so that a worker is
// about nats.go's size (docs/BENCHMARKS.md, "Binary sizes"). A program traces its workers with a
// tracer provider it sets up itself and passes to Connect (WithTracerProvider: the OpenTelemetry
// SDK with an OTLP exporter, say, or otel.GetTracerProvider() after otel.SetTracerProvider), and
// exports their metrics with package sdk/prom (prom.WithMetrics) or a Meter of its own
// (WithMeter).
//
// # Parameters and their dtype
//
// A worker's parameters are always a []float32 (Step, StepRanks, Params, WithParamsBuffer). On the
// wire a parameters message says its element type in Fanin-Dtype (docs/PROTOCOL.md), and the
// worker decodes each by its own header (wire.DecodeParams): f32, or a header absent, as is; bf16
// and f16 exactly (both are subsets of float32: wire.BF16ToF32, wire.F16ToF32).
//
// A job created with param_dtype bf16 keeps float32 master parameters in its runtimes but sends
// the workers, after step 0, those parameters rounded to bf16 (to nearest, ties to even): half the
// bytes. Its workers then hold, after step t >= 1, exactly wire.Round(p, wire.BF16) of the job's
// parameters p, the single-process reference's for BSP (functions.Reference, rounded); at step 0
// (Params before the first step, including an uploaded init) they hold the initial parameters in
// float32, unrounded. Gradients computed from the rounded parameters are what the runtime sums, so
// a run stays reproducible bit for bit: the reference replays it with the same gradients.
// Optimizer state (Adam's moments, momentum) is never rounded; the rounding is only in the copy
// the workers receive, and it does not accumulate from step to step.
//
// A parameters message a worker cannot read (a Fanin-Dtype it does not know, a payload that is not
// the shard's elements in its dtype) is never taken as parameters: pushed, it is ignored as if
// lost, and the worker fetches the shard from the stream when its fallback's wait is over
// (WithFetchAfter); fetched (Params, that fallback, an ssp or asp worker's catch-up), it fails the
// call with an error naming the job, shard, step and what is wrong, and the parameters the worker
// held are kept for that shard.
package sdk
