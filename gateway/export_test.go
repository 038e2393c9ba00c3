package gateway

import "github.com/fanin-ml/fanin/functions/wasmfn"

// WithFunctionLimits sets the limits the gateway checks uploaded function modules with (zero:
// wasmfn's defaults).
func WithFunctionLimits(l wasmfn.Limits) Option {
	return func(s *Server) error { s.fns.limits = l; return nil }
}
