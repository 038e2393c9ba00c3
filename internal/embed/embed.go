// Package embed runs an in-process NATS server with JetStream, configured for fanin: for `fanin dev`
// and for tests.
package embed

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// MaxPayload is the embedded server's max_payload: an 8 MiB shard, or a checkpoint of a shard with
// its optimizer state, plus headers. An external server needs at least this for such jobs
// (docs/PROTOCOL.md).
const MaxPayload = 32 << 20

// ErrListen is wrapped by Start's error when the server cannot listen on its port, with the
// reason (a port in use: syscall.EADDRINUSE).
var ErrListen = errors.New("embedded NATS cannot listen")

// Config says where the server listens and stores.
type Config struct {
	Host     string // default 127.0.0.1
	Port     int    // -1 picks a free port
	StoreDir string // JetStream file storage
	// MaxStore caps JetStream's file storage (0: the server's default, 75% of the store's free
	// disk space when it starts).
	MaxStore int64
	Logs     bool // the server's own logs to stderr

	// Configure, if set, adjusts the server's options before it starts (e.g. operator mode:
	// auth.Authority.ConfigureServer).
	Configure func(*server.Options) error
	// OnViolation, if set, is called for every permissions violation the server reports: a
	// client publishing or subscribing where its credentials do not allow. The server tells the
	// client and logs it, but publishes no event, so this hook reads its log.
	OnViolation func(Violation)
}

// Violation is a permissions violation by a client.
type Violation struct {
	User    string // the user's public key (JWT users), or "" when not known
	Kind    string // "Publish" or "Subscription"
	Subject string
}

// Start starts the server and waits until it accepts connections.
func Start(cfg Config) (*server.Server, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("embedded NATS needs a store directory")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Port > 0 {
		// The server only logs that it cannot listen, and then never becomes ready: try first, so
		// that a port in use is named as such (errors.Is(err, syscall.EADDRINUSE)).
		ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrListen, err)
		}
		_ = ln.Close()
	}
	opts := &server.Options{
		ServerName: "fanin-dev",
		Host:       cfg.Host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		MaxPayload: MaxPayload,
		// JetStreamMaxStore: 0 lets the server size it from the disk.
		JetStreamMaxStore: cfg.MaxStore,
		// A runtime's shards pull up to 16 MiB each over one connection, and a runtime may be briefly
		// busy with a large shard: room before the server calls it a slow consumer and cuts it.
		MaxPending: 1 << 30,
		// Eight ranks publishing a ResNet-50's gradients at once put ~800 MiB into one stream's
		// ingest queue; its default of 128 MiB refuses the excess with 429s.
		StreamMaxBufferedSize: 1 << 30,
		WriteDeadline:         10 * time.Second,
		NoSigs:                true,
	}
	if cfg.Configure != nil {
		if err := cfg.Configure(opts); err != nil {
			return nil, fmt.Errorf("embedded NATS: %w", err)
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	if cfg.Logs {
		ns.ConfigureLogger()
	}
	if cfg.OnViolation != nil {
		var inner server.Logger
		if cfg.Logs {
			inner = ns.Logger()
		}
		ns.SetLoggerV2(&violationLogger{inner: inner, on: cfg.OnViolation}, false, false, false)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded NATS did not become ready in 10s")
	}
	return ns, nil
}

// violationLogger passes the server's log through to inner (if any) and picks out permissions
// violations, which the server logs as
//
//	<addr> - cid:<n> - "<client>" - "<account>/jwt:<user>" - Publish Violation - Subject "<subject>"
//
// (or "<account>/nkey:<user>": the server names some clients, nats.js among them, by their nkey).
type violationLogger struct {
	inner server.Logger
	on    func(Violation)
}

var violationRE = regexp.MustCompile(`(?:/(?:jwt|nkey):(U[A-Z0-9]{55})"[^"]*)?- (Publish|Subscription) Violation - (?:Subject|Reply) "([^"]*)"`)

func (l *violationLogger) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if m := violationRE.FindStringSubmatch(msg); m != nil {
		l.on(Violation{User: m[1], Kind: m[2], Subject: m[3]})
	}
	if l.inner != nil {
		l.inner.Errorf("%s", msg)
	}
}

func (l *violationLogger) Noticef(format string, v ...any) {
	if l.inner != nil {
		l.inner.Noticef(format, v...)
	}
}

func (l *violationLogger) Warnf(format string, v ...any) {
	if l.inner != nil {
		l.inner.Warnf(format, v...)
	}
}

func (l *violationLogger) Fatalf(format string, v ...any) {
	if l.inner != nil {
		l.inner.Fatalf(format, v...)
	}
}

func (l *violationLogger) Debugf(format string, v ...any) {
	if l.inner != nil {
		l.inner.Debugf(format, v...)
	}
}

func (l *violationLogger) Tracef(format string, v ...any) {
	if l.inner != nil {
		l.inner.Tracef(format, v...)
	}
}

// FromFile starts a NATS server in this process from a configuration file in nats-server's own
// format (what `fanin nats --config FILE` runs as a process of its own) and waits until it
// accepts connections. Its logs go to standard error as nats-server's would. A component of the
// same process then connects in-process (nats.InProcessServer): a pipe instead of loopback TCP,
// which spares each byte between them two kernel copies and the syscalls.
func FromFile(path string) (*server.Server, error) {
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		return nil, fmt.Errorf("NATS configuration %s: %w", path, err)
	}
	opts.NoSigs = true // the process's signals are its own: it shuts the server down itself
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("NATS server from %s: %w", path, err)
	}
	ns.ConfigureLogger()
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("the NATS server of %s did not accept connections in 30s (its log says why)", path)
	}
	return ns, nil
}
