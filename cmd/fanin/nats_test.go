package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
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
	nc := connectWhileRunning(t, fmt.Sprintf("nats://127.0.0.1:%d", port), done, "fanin nats --config")
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

// fanin runtime --nats-config runs the configuration's NATS server in the runtime's process and
// connects the runtime to it in-process: the server serves other clients on its port, and the
// runtime reports that server as its own. --nats beside it is refused.
func TestRuntimeWithItsNATSServer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ports := testutil.FreePorts(t, 2)
	port, monitor := ports[0], ports[1]
	conf := filepath.Join(dir, "nats.conf")
	body := fmt.Sprintf("server_name: fanin-rt-node\nport: %d\nhttp_port: %d\nmax_payload: 32MB\njetstream { store_dir: %q }\n",
		port, monitor, filepath.Join(dir, "js"))
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := execute(t.Context(), runtimeCmd(), "--nats-config", conf, "--nats", "nats://127.0.0.1:1"); err == nil ||
		!strings.Contains(err.Error(), "--nats-config runs this runtime's NATS server in its process, and --nats names another") {
		t.Fatalf("--nats-config with --nats: %v", err)
	}
	if _, err := execute(t.Context(), runtimeCmd(), "--nats-config", filepath.Join(dir, "missing.conf"), "--nic-bandwidth", "0"); err == nil ||
		!strings.Contains(err.Error(), "missing.conf") {
		t.Fatalf("--nats-config of a missing file: %v, want an error naming it", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := execute(ctx, runtimeCmd(), "--nats-config", conf, "--id", "rt-embedded", "--cores", "1", "--nic-bandwidth", "0")
		done <- err
	}()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	nc := connectWhileRunning(t, url, done, "fanin runtime --nats-config")
	defer nc.Close()
	rep := nextLoadReport(t, nc, "rt-embedded")
	if rep.Server != "fanin-rt-node" || rep.Node != "fanin-rt-node" {
		t.Errorf("the runtime reports server %q, node %q: want its own server, fanin-rt-node", rep.Server, rep.Node)
	}
	// The server's connections: the runtime's has no address (a pipe), this test's is TCP.
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/connz", monitor))
	if err != nil {
		t.Fatal(err)
	}
	var connz server.Connz
	err = json.NewDecoder(resp.Body).Decode(&connz)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range connz.Conns {
		names = append(names, fmt.Sprintf("%s at %q", c.Name, c.IP))
		if c.Name == "fanin-runtime" && c.IP != "" {
			t.Errorf("the runtime connects to its server from %s:%d, want in-process", c.IP, c.Port)
		}
	}
	if !slices.ContainsFunc(connz.Conns, func(c *server.ConnInfo) bool { return c.Name == "fanin-runtime" }) {
		t.Errorf("the runtime's server has no connection of the runtime's: %v", names)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("fanin runtime after its context ended: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("fanin runtime --nats-config still runs 30 s after its context ended")
	}
	if _, err := nats.Connect(url, nats.Timeout(time.Second)); err == nil {
		t.Error("the runtime's NATS server still serves after the runtime ended")
	}
}

// connectWhileRunning connects to url, retrying for up to 30 s while the command (what) that
// serves it has not ended (done).
func connectWhileRunning(t *testing.T, url string, done <-chan error, what string) *nats.Conn {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		nc, err := nats.Connect(url)
		if err == nil {
			return nc
		}
		select {
		case err := <-done:
			t.Fatalf("%s ended before serving: %v", what, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect %s: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The runtime connects to the server --nats-local names before those of --nats, whatever their
// order would be shuffled to, and says so in its load reports; --nats-local beside --nats-config
// is refused.
func TestRuntimeNATSLocalFirst(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	if _, err := execute(t.Context(), runtimeCmd(), "--nats-config", "x.conf", "--nats-local", "nats://127.0.0.1:1"); err == nil ||
		!strings.Contains(err.Error(), "--nats-local names another") {
		t.Fatalf("--nats-config with --nats-local: %v", err)
	}
	cl := testutil.StartCluster(t, 3)
	urls := strings.Split(cl.URLs(), ",")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := execute(ctx, runtimeCmd(), "--nats", urls[0]+","+urls[1], "--nats-local", urls[2],
			"--id", "rt-local", "--cores", "1", "--nic-bandwidth", "0")
		done <- err
	}()
	nc := connectWhileRunning(t, urls[0], done, "fanin runtime --nats-local")
	defer nc.Close()
	if want, rep := cl.Node(2).Name(), nextLoadReport(t, nc, "rt-local"); rep.Server != want {
		t.Errorf("the runtime is connected to %q, want %s, its --nats-local", rep.Server, want)
	}
}

// nextLoadReport waits up to 30 s for the next load report of runtime id through nc.
func nextLoadReport(t *testing.T, nc *nats.Conn, id string) wire.LoadReport {
	t.Helper()
	reports, err := nc.SubscribeSync(wire.LoadSubject(id))
	if err != nil {
		t.Fatal(err)
	}
	defer reports.Unsubscribe()
	m, err := reports.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatalf("no load report from runtime %s: %v", id, err)
	}
	var rep wire.LoadReport
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}
