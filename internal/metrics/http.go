package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/fanin-ml/fanin/internal/httpstatus"
)

// HTTP counts the requests h serves and their latency by route (the ServeMux pattern that matched,
// "unmatched" when none did). With m nil it returns h.
func (m *Metrics) HTTP(h http.Handler) http.Handler {
	if m == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := httpstatus.NewRecorder(w)
		r2 := r.WithContext(r.Context()) // the mux records the pattern in the request it is given
		h.ServeHTTP(rec, r2)
		r.Pattern = r2.Pattern // for a middleware around this one
		route := r2.Pattern
		if route == "" {
			route = "unmatched"
		}
		m.httpRequests.WithLabelValues(route, strconv.Itoa(rec.Status)).Inc()
		m.httpDuration.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}
