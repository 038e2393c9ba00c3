// Package otlp sets up the tracer provider of fanin's processes: the OpenTelemetry SDK, exporting
// over OTLP (HTTP or gRPC) as the standard OTEL_* environment variables say. It is kept apart from
// package telemetry so that what the worker SDK links holds no exporter: cmd/fanin and tests import
// it, a training program that wants traces sets up its own provider (sdk.WithTracerProvider).
package otlp
