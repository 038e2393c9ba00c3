package e2e

import (
	"net"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fanin-ml/fanin/internal/embed"
)

var httpURL = regexp.MustCompile(`HTTP API listening" url=(http://[0-9.:]+)`)

// cluster is fanin as separate processes (gateway, autoscaler, runtimes) on an embedded NATS server
// with file storage that the test can restart.
type cluster struct {
	ns       *server.Server
	store    string
	port     int
	url, api string
	runtimes map[string]*proc
}

// startCluster starts NATS, the gateway, an autoscaler that places shards on the runtimes there
// are (driver none), and the named runtimes.
func startCluster(t *testing.T, runtimes ...string) *cluster {
	t.Helper()
	c := &cluster{store: t.TempDir(), runtimes: map[string]*proc{}}
	ns, err := embed.Start(embed.Config{Port: -1, StoreDir: c.store})
	if err != nil {
		t.Fatal(err)
	}
	c.ns, c.url, c.port = ns, ns.ClientURL(), ns.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { c.ns.Shutdown() })
	gw := start(t, "gateway", "gateway", "--nats", c.url, "--http", "127.0.0.1:0")
	c.api = gw.waitFor(t, httpURL, 20*time.Second)
	start(t, "autoscaler", "autoscaler", "--nats", c.url, "--interval", "200ms")
	for _, id := range runtimes {
		c.addRuntime(t, id)
	}
	return c
}

func (c *cluster) addRuntime(t *testing.T, id string) {
	c.runtimes[id] = start(t, id, "runtime", "--nats", c.url, "--id", id)
}

func (c *cluster) kill(id string) { c.runtimes[id].stop(syscall.SIGKILL) }

func (c *cluster) restartNATS(t *testing.T) {
	t.Helper()
	c.ns.Shutdown()
	c.ns.WaitForShutdown()
	ns, err := embed.Start(embed.Config{Port: c.port, StoreDir: c.store})
	if err != nil {
		t.Fatalf("restart NATS on port %d: %v", c.port, err)
	}
	c.ns = ns
}
