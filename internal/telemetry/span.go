package telemetry

import (
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// EndSpan ends s, marked as failed with err when err is not nil. A nil s (not traced) is ignored.
func EndSpan(s trace.Span, err error) {
	if s == nil {
		return
	}
	if err != nil {
		s.RecordError(err)
		s.SetStatus(codes.Error, err.Error())
	}
	s.End()
}
