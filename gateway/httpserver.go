package gateway

import (
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// HTTPLimits bounds what the HTTP server gives one client: how long it may take to send a request
// (headers, then body), to read an answer, and to keep an idle connection, and how many
// connections are open at once. A slow or idle socket is closed, so that sockets cannot pile up
// against the process's file-descriptor limit, which the embedded NATS server shares. Zero
// fields take DefaultHTTPLimits' values.
type HTTPLimits struct {
	ReadHeaderTimeout time.Duration // the request line and headers
	ReadTimeout       time.Duration // the whole request, body included (bodies are at most MaxSpecBytes)
	WriteTimeout      time.Duration // from the end of the headers to the end of the answer: longer than a drain
	IdleTimeout       time.Duration // a keep-alive connection between requests
	MaxConns          int           // connections open at once; more wait to be accepted
	MaxHeaderBytes    int
}

// DefaultHTTPLimits are the gateway's HTTP limits unless configured (fanin gateway --http-*).
var DefaultHTTPLimits = HTTPLimits{
	ReadHeaderTimeout: 10 * time.Second,
	ReadTimeout:       30 * time.Second,
	WriteTimeout:      2 * time.Minute, // pause and delete wait for the runtimes (WithDrainTimeout, 15 s by default)
	IdleTimeout:       60 * time.Second,
	MaxConns:          1024,
	MaxHeaderBytes:    64 << 10,
}

// withDefaults fills zero fields from DefaultHTTPLimits.
func (l HTTPLimits) withDefaults() HTTPLimits {
	d := DefaultHTTPLimits
	if l.ReadHeaderTimeout > 0 {
		d.ReadHeaderTimeout = l.ReadHeaderTimeout
	}
	if l.ReadTimeout > 0 {
		d.ReadTimeout = l.ReadTimeout
	}
	if l.WriteTimeout > 0 {
		d.WriteTimeout = l.WriteTimeout
	}
	if l.IdleTimeout > 0 {
		d.IdleTimeout = l.IdleTimeout
	}
	if l.MaxConns > 0 {
		d.MaxConns = l.MaxConns
	}
	if l.MaxHeaderBytes > 0 {
		d.MaxHeaderBytes = l.MaxHeaderBytes
	}
	return d
}

// HTTPServer returns a server of h with the limits' timeouts, and a listener over ln that holds
// at most the limits' connections open at once (the next waits in the kernel's backlog until one
// closes): serve it with srv.Serve(ln).
func HTTPServer(h http.Handler, ln net.Listener, lim HTTPLimits) (*http.Server, net.Listener) {
	lim = lim.withDefaults()
	srv := &http.Server{Handler: h,
		ReadHeaderTimeout: lim.ReadHeaderTimeout, ReadTimeout: lim.ReadTimeout,
		WriteTimeout: lim.WriteTimeout, IdleTimeout: lim.IdleTimeout, MaxHeaderBytes: lim.MaxHeaderBytes}
	return srv, netutil.LimitListener(ln, lim.MaxConns)
}
