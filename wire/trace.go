package wire

// HdrTraceparent carries the W3C trace context (https://www.w3.org/TR/trace-context/) of a
// gradient or parameters message: "00-<trace id>-<span id>-<flags>". Lower case, as the W3C spells
// it; NATS headers are case-sensitive.
const HdrTraceparent = "traceparent"
