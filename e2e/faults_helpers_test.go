package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/testutil"
)

var serverReady = regexp.MustCompile(`Server is ready`)

// natsNodes are nats-server processes (the binary of the version fanin embeds) with JetStream on
// file storage: one server, or a cluster routed on loopback. A node can be killed with SIGKILL and
// started again on its ports and store, as after a crash.
type natsNodes struct {
	t     *testing.T
	confs []string
	ports []int
	procs []*natsProc
}

type natsProc struct {
	p *proc
}

// startNATS starts n nats-server processes; n > 1 routes them into one cluster.
func startNATS(t *testing.T, n int) *natsNodes {
	t.Helper()
	nn := &natsNodes{t: t, procs: make([]*natsProc, n)}
	dir := t.TempDir()
	routes := make([]int, n)
	for i := range n {
		nn.ports = append(nn.ports, testutil.FreePort(t))
		routes[i] = testutil.FreePort(t)
	}
	for i := range n {
		conf := fmt.Sprintf("server_name: n%d\nlisten: 127.0.0.1:%d\nmax_payload: 8MB\nmax_pending: 256MB\n"+
			"jetstream { store_dir: %q }\n", i, nn.ports[i], filepath.Join(dir, fmt.Sprintf("n%d", i)))
		if n > 1 {
			var rs []string
			for _, r := range routes {
				rs = append(rs, fmt.Sprintf("nats://127.0.0.1:%d", r))
			}
			conf += fmt.Sprintf("cluster { name: fanin-e2e, listen: 127.0.0.1:%d, routes: [%s] }\n", routes[i], strings.Join(rs, ", "))
		}
		path := filepath.Join(dir, fmt.Sprintf("n%d.conf", i))
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		nn.confs = append(nn.confs, path)
	}
	for i := range n {
		nn.start(i)
	}
	nn.waitJetStream()
	return nn
}

// url lists every node, for --nats and nats.Connect.
func (nn *natsNodes) url() string {
	var us []string
	for _, p := range nn.ports {
		us = append(us, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	return strings.Join(us, ",")
}

func (nn *natsNodes) start(i int) {
	nn.t.Helper()
	p := startBin(nn.t, natsServerBin, fmt.Sprintf("nats-n%d", i), "-c", nn.confs[i])
	p.waitFor(nn.t, serverReady, 30*time.Second)
	nn.procs[i] = &natsProc{p: p}
}

// kill SIGKILLs node i.
func (nn *natsNodes) kill(i int) {
	nn.procs[i].p.stop(syscall.SIGKILL)
}

// restart starts node i again and waits until JetStream answers.
func (nn *natsNodes) restart(i int) {
	nn.t.Helper()
	nn.start(i)
	nn.waitJetStream()
}

// index is the node named name (n0, n1, ...).
func (nn *natsNodes) index(name string) int {
	var i int
	if _, err := fmt.Sscanf(name, "n%d", &i); err != nil {
		nn.t.Fatalf("node name %q", name)
	}
	return i
}

func (nn *natsNodes) waitJetStream() {
	nn.t.Helper()
	testutil.CheckFor(nn.t, 60*time.Second, 100*time.Millisecond, func() error {
		nc, err := nats.Connect(nn.url(), nats.Timeout(time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err
	})
}

// leaderOf is the name of the node leading stream (a job's, or a bucket's KV_<bucket>).
func (nn *natsNodes) leaderOf(stream string) string {
	nn.t.Helper()
	var leader string
	testutil.CheckFor(nn.t, 30*time.Second, 100*time.Millisecond, func() error {
		nc, err := nats.Connect(nn.url())
		if err != nil {
			return err
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		if cl := st.CachedInfo().Cluster; cl != nil && cl.Leader != "" {
			leader = cl.Leader
			return nil
		}
		return fmt.Errorf("stream %s has no leader", stream)
	})
	return leader
}
