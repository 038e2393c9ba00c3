package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/lab/testutil"
)

// A runtime that runs its node's NATS server (fanin runtime --nats-config) as a member of the
// cluster, without JetStream of its own: the workers connect to that server, fanin's buckets and
// the job's streams live on the three JetStream servers, and the job trains bit-exact, every
// stored update counted.
func TestRuntimeRunsAClusterMember(t *testing.T) {
	skipShort(t)
	nn := startNATS(t, 3)
	port := testutil.FreePort(t)
	var routes []string
	for _, r := range nn.routes {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", r))
	}
	conf := filepath.Join(t.TempDir(), "rt-node.conf")
	body := fmt.Sprintf("server_name: rt-node\nlisten: 127.0.0.1:%d\nmax_payload: 8MB\nmax_pending: 256MB\n"+
		"cluster { name: fanin-e2e, listen: 127.0.0.1:%d, routes: [%s] }\n", port, testutil.FreePort(t), strings.Join(routes, ", "))
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	gw := start(t, "gateway", "gateway", "--nats", nn.url(), "--http", "127.0.0.1:0")
	f := &faninProcs{t: t, nn: nn, api: gw.waitFor(t, httpURL, 30*time.Second), gw: gw}
	start(t, "autoscaler", "autoscaler", "--nats", nn.url(), "--interval", "200ms")
	rt := start(t, "rt-node", "runtime", "--nats-config", conf, "--id", "rt-node", "--nic-bandwidth", "0")
	rt.waitFor(t, serverReady, 30*time.Second)

	tt := f.trainAt(clusterSpec("embedded", "momentum"), fmt.Sprintf("nats://127.0.0.1:%d", port))
	tt.run(12)
	tt.checkUpdates(nn.url())
	if out := rt.output(); !strings.Contains(out, "runtime started") {
		t.Errorf("the runtime process did not log its start:\n%s", out)
	}
	t.Logf("%d steps bit-exact, the workers on the runtime's own server, a member of the cluster", tt.step)
}
