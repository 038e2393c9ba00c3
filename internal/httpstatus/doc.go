// Package httpstatus records the status code a handler answers with, for the middleware that
// counts requests (internal/metrics) and the one that traces them (internal/telemetry).
package httpstatus
