package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/lab/testutil"
)

// fanin nats is nats-server: its flags, its configuration file, JetStream; it stops with the
// command's context.
func TestNATSCommand(t *testing.T) {
	t.Parallel()
	out, err := execute(context.Background(), natsCmd(), "--version")
	if err != nil || out != "nats-server: v"+server.VERSION+"\n" {
		t.Fatalf("fanin nats --version: %q %v", out, err)
	}
	if _, err := execute(context.Background(), natsCmd(), "--no-such-flag"); err == nil || !strings.Contains(err.Error(), "no-such-flag") {
		t.Fatalf("fanin nats --no-such-flag: %v, want an error naming the flag", err)
	}
	missing := filepath.Join(t.TempDir(), "missing.conf")
	if _, err := execute(context.Background(), natsCmd(), "--config", missing); err == nil || !strings.Contains(err.Error(), "missing.conf") {
		t.Fatalf("fanin nats --config %s: %v, want an error naming the file", missing, err)
	}

	dir := t.TempDir()
	port := testutil.FreePort(t)
	conf := filepath.Join(dir, "nats.conf")
	body := fmt.Sprintf("server_name: fanin-nats-test\nport: %d\nmax_payload: 32MB\njetstream { store_dir: %q }\n", port, filepath.Join(dir, "js"))
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := execute(ctx, natsCmd(), "--config", conf)
		done <- err
	}()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	var nc *nats.Conn
	for deadline := time.Now().Add(30 * time.Second); ; {
		if nc, err = nats.Connect(url); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("fanin nats --config ended before serving: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect %s: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer nc.Close()
	if got := nc.ConnectedServerName(); got != "fanin-nats-test" {
		t.Errorf("server name %q, want the configuration's fanin-nats-test", got)
	}
	if got := nc.MaxPayload(); got != 32<<20 {
		t.Errorf("max_payload %d, want the configuration's 32 MiB", got)
	}
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(); err != nil {
		t.Errorf("JetStream: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("fanin nats after its context ended: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("fanin nats still serves 30 s after its context ended")
	}
}

// fanin gateway --auth-dir starts while NATS does not answer yet (a pod before its servers): its
// system account connection keeps trying rather than failing the command.
func TestGatewayAuthBeforeNATS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := execute(context.Background(), authCmd(), "init", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	g := gatewayFlags{authDir: dir}
	url := fmt.Sprintf("nats://127.0.0.1:%d", testutil.FreePort(t)) // nothing listens there
	opts, closeAll, err := g.options(url)
	if err != nil {
		t.Fatalf("gateway options with NATS not there yet: %v", err)
	}
	defer closeAll()
	if len(opts) == 0 {
		t.Fatal("no gateway options")
	}
}
