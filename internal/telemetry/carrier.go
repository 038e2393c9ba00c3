package telemetry

import (
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanin-ml/fanin/wire"
)

// HeaderCarrier adapts NATS message headers to propagation.TextMapCarrier, for code that uses
// OpenTelemetry's propagators. Keys are used as given: NATS headers are case-sensitive.
type HeaderCarrier nats.Header

// Get returns the first value of key.
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces the values of key.
func (c HeaderCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Traceparent reads the W3C traceparent header of a message, without allocating. ok is false when
// the header is absent or malformed. tracestate is not read: fanin neither uses nor forwards it.
func Traceparent(h nats.Header) (sc trace.SpanContext, ok bool) {
	v := h[wire.HdrTraceparent]
	if len(v) == 0 {
		return sc, false
	}
	return ParseTraceparent(v[0])
}

// ParseTraceparent parses "00-<32 hex trace id>-<16 hex span id>-<2 hex flags>" (a later version
// may append fields after a dash) without allocating.
func ParseTraceparent(s string) (trace.SpanContext, bool) {
	const n = 55
	if len(s) < n || s[2] != '-' || s[35] != '-' || s[52] != '-' || (len(s) > n && s[n] != '-') {
		return trace.SpanContext{}, false
	}
	ver, ok := hexByte(s[0], s[1])
	if !ok || ver == 0xff || (ver == 0 && len(s) != n) {
		return trace.SpanContext{}, false
	}
	var cfg trace.SpanContextConfig
	for i := range cfg.TraceID {
		if cfg.TraceID[i], ok = hexByte(s[3+2*i], s[4+2*i]); !ok {
			return trace.SpanContext{}, false
		}
	}
	for i := range cfg.SpanID {
		if cfg.SpanID[i], ok = hexByte(s[36+2*i], s[37+2*i]); !ok {
			return trace.SpanContext{}, false
		}
	}
	flags, ok := hexByte(s[53], s[54])
	if !ok {
		return trace.SpanContext{}, false
	}
	cfg.TraceFlags = trace.TraceFlags(flags) & trace.FlagsSampled
	cfg.Remote = true
	sc := trace.NewSpanContext(cfg)
	return sc, sc.IsValid()
}

// FormatTraceparent is the traceparent header value of sc.
func FormatTraceparent(sc trace.SpanContext) string {
	const hexdigits = "0123456789abcdef"
	var b [55]byte
	b[0], b[1], b[2] = '0', '0', '-'
	t, s := sc.TraceID(), sc.SpanID()
	for i, c := range t {
		b[3+2*i], b[4+2*i] = hexdigits[c>>4], hexdigits[c&15]
	}
	b[35] = '-'
	for i, c := range s {
		b[36+2*i], b[37+2*i] = hexdigits[c>>4], hexdigits[c&15]
	}
	b[52] = '-'
	f := byte(sc.TraceFlags() & trace.FlagsSampled)
	b[53], b[54] = hexdigits[f>>4], hexdigits[f&15]
	return string(b[:])
}

// SetTraceparent sets the traceparent header of h to sc, or removes it when sc is not valid.
func SetTraceparent(h nats.Header, sc trace.SpanContext) {
	if !sc.IsValid() {
		delete(h, wire.HdrTraceparent)
		return
	}
	h[wire.HdrTraceparent] = []string{FormatTraceparent(sc)}
}

func hexByte(hi, lo byte) (byte, bool) {
	h, ok1 := hexVal(hi)
	l, ok2 := hexVal(lo)
	return h<<4 | l, ok1 && ok2
}

// hexVal accepts lower-case hex only, as the W3C requires.
func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
