// Package telemetry holds what fanin's traced code shares: the one deterministic trace of a training
// step and the decision to trace it, the W3C traceparent carried in NATS headers, the span and
// attribute names, and the process's tracer provider. It depends on the OpenTelemetry API only, so
// that a worker linking the SDK links no exporter; package otlp sets up the exporting provider.
package telemetry
