package auth_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fanin-ml/fanin/internal/auth"
)

// A client that takes longer than nats-server's default 2 s to sign the server's nonce (Node.js's
// client took that long under CPU load, several connections at once) is waited for, not cut off
// in the handshake.
func TestSlowHandshakeIsWaitedFor(t *testing.T) {
	t.Parallel()
	a, err := auth.New()
	if err != nil {
		t.Fatal(err)
	}
	ns := startServer(t, a, nil)
	c, err := a.ComponentCredentials("slow-signer")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.FromSeed([]byte(c.Seed))
	if err != nil {
		t.Fatal(err)
	}
	slowSign := func(nonce []byte) ([]byte, error) {
		time.Sleep(3 * time.Second) // the fault: a signature that takes 3 s, not a synchronisation
		return kp.Sign(nonce)
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.UserJWT(func() (string, error) { return c.JWT, nil }, slowSign),
		nats.Timeout(auth.HandshakeTimeout), nats.NoReconnect())
	if err != nil {
		t.Fatalf("a client that signs in 3 s: %v", err)
	}
	nc.Close()
}

// The configuration `fanin auth init` writes for external servers gives clients HandshakeTimeout
// too, and nats-server takes it in operator mode.
func TestServerConfigHandshakeTimeout(t *testing.T) {
	t.Parallel()
	a, err := auth.New()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf, err := a.ServerConfig(filepath.Join(dir, "accounts"))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if o.AuthTimeout != auth.HandshakeTimeout.Seconds() {
		t.Fatalf("auth timeout %v s, want %v", o.AuthTimeout, auth.HandshakeTimeout.Seconds())
	}
	o.Port, o.NoLog, o.NoSigs = -1, true, true
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("nats-server refuses the configuration: %v", err)
	}
	s.Shutdown()
}
