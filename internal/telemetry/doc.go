// Package telemetry sets up OpenTelemetry tracing for fanin from the standard OTEL_* environment
// variables, and holds what traced code shares: the one deterministic trace of a training step, the
// W3C traceparent carried in NATS headers, and the span and attribute names.
package telemetry
