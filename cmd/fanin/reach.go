package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// dialState remembers why the last attempt to reach NATS failed: a connection that keeps retrying
// in the background has no other record of it (nats.go clears its last error before each attempt).
type dialState struct {
	mu     sync.Mutex
	last   error  // guarded by mu: the last failed attempt's error
	logged string // guarded by mu: the text of the last failure logged
}

// failed records err and reports whether its text differs from the last one logged.
func (d *dialState) failed(err error) (log bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.last = err
	if err.Error() == d.logged {
		return false
	}
	d.logged = err.Error()
	return true
}

func (d *dialState) lastErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// dialCause returns err, or, for nats.go's "no servers available" (its answer when every server
// refused the connection), the error of a connection attempt to the first server that names the
// cause.
func dialCause(urls string, err error) error {
	if !errors.Is(err, nats.ErrNoServers) {
		return err
	}
	for _, s := range strings.Split(urls, ",") {
		s = strings.TrimSpace(s)
		if !strings.Contains(s, "://") {
			s = "nats://" + s
		}
		u, perr := url.Parse(s)
		if perr != nil || u.Hostname() == "" {
			continue
		}
		port := u.Port()
		if port == "" {
			port = "4222"
		}
		c, derr := net.DialTimeout("tcp", net.JoinHostPort(u.Hostname(), port), 2*time.Second)
		if derr != nil {
			return derr
		}
		_ = c.Close()
	}
	return err
}

// explain says why err happened when it is NATS that is out of reach: the server refused the
// credentials (or none were given), or it could not be reached at all. Otherwise err is returned
// as it is.
func (f *natsFlags) explain(err error) error {
	if err == nil || f.nc == nil || f.nc.IsConnected() {
		return err
	}
	// An authorization violation is the connection's last error once it closed; otherwise the last
	// failed dial says more than nats.go's own last error ("no servers available").
	cause := f.nc.LastError()
	if d := f.dial.lastErr(); d != nil && !isAuthError(cause) {
		cause = d
	}
	at := redactURL(f.url)
	switch {
	case isAuthError(cause) && f.creds != "":
		return fmt.Errorf("NATS at %s refused the credentials in %s: %v (%w)", at, f.creds, cause, err)
	case isAuthError(cause) && at != f.url: // a user and password in the URL
		return fmt.Errorf("NATS at %s refused the user of the URL: %v (%w)", at, cause, err)
	case isAuthError(cause):
		return fmt.Errorf("NATS at %s refused the connection: %v: it needs credentials, give them with --creds (env NATS_CREDS) (%w)", at, cause, err)
	case cause != nil:
		return fmt.Errorf("cannot reach NATS at %s: %v (%w)", at, cause, err)
	}
	return fmt.Errorf("not connected to NATS at %s: %w", at, err)
}

// isAuthError reports whether the server refused the connection's credentials.
func isAuthError(err error) bool {
	if err == nil {
		return false
	}
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired) ||
		strings.Contains(strings.ToLower(err.Error()), "authorization violation")
}

// redactURL hides the password of a URL (or a comma-separated list of them, as NATS takes).
func redactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// explainAPI says that no gateway answers at the API address when the connection to it was
// refused or the address does not resolve; other errors (the gateway's own answers among them)
// are returned as they are.
func (f *apiFlags) explainAPI(err error) error {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ECONNREFUSED), errors.As(err, &dnsErr),
		errors.As(err, &opErr) && opErr.Op == "dial":
		return fmt.Errorf("no fanin gateway at %s (is it running? set the address with --api or FANIN_API): %w", redactURL(f.api), err)
	}
	return err
}
