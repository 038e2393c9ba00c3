// Package embed runs an in-process NATS server with JetStream, configured for fanin: for `fanin dev`
// and for tests.
package embed

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// MaxPayload is the embedded server's max_payload: an 8 MiB shard, or a checkpoint of a shard with
// its optimizer state, plus headers. An external server needs at least this for such jobs
// (docs/PROTOCOL.md).
const MaxPayload = 32 << 20

// Config says where the server listens and stores.
type Config struct {
	Host     string // default 127.0.0.1
	Port     int    // -1 picks a free port
	StoreDir string // JetStream file storage
	Logs     bool   // the server's own logs to stderr
}

// Start starts the server and waits until it accepts connections.
func Start(cfg Config) (*server.Server, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("embedded NATS needs a store directory")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	opts := &server.Options{
		ServerName: "fanin-dev",
		Host:       cfg.Host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		MaxPayload: MaxPayload,
		// A runtime may be briefly busy with a large shard; give it room before the server calls it slow.
		MaxPending:    256 << 20,
		WriteDeadline: 10 * time.Second,
		NoSigs:        true,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	if cfg.Logs {
		ns.ConfigureLogger()
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded NATS did not become ready in 10s")
	}
	return ns, nil
}
