package telemetry

import (
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanin-ml/fanin/internal/httpstatus"
)

// HTTPHandler traces the requests h serves with p: a server span per request, named after the
// route (the ServeMux pattern), child of the caller's traceparent if it sent one. Reads of
// /metrics, /healthz and the dashboard's files and polls are not traced. With p nil it returns h.
func HTTPHandler(h http.Handler, p *Provider) http.Handler {
	if p == nil {
		return h
	}
	prop := propagation.TraceContext{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && (r.URL.Path == "/" || r.URL.Path == "/metrics" || r.URL.Path == "/healthz" ||
			strings.HasPrefix(r.URL.Path, "/dashboard/")) {
			h.ServeHTTP(w, r)
			return
		}
		ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := p.Tracer().Start(ctx, "HTTP "+r.Method, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
			attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
		defer span.End()
		rec := httpstatus.NewRecorder(w)
		r2 := r.WithContext(ctx)
		h.ServeHTTP(rec, r2)   // a ServeMux records the pattern in the request it is given
		r.Pattern = r2.Pattern // for a middleware around this one
		if r2.Pattern != "" {
			span.SetName(r2.Pattern)
			span.SetAttributes(attribute.String("http.route", r2.Pattern))
		}
		span.SetAttributes(attribute.Int("http.response.status_code", rec.Status))
		if rec.Status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(rec.Status))
		}
	})
}
