package testutil

import (
	"cmp"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fanin-ml/fanin/wire"
)

// Cluster is n embedded NATS servers with JetStream routed into one cluster on loopback, each with
// its own store directory. A node can be stopped and started again on the same ports and store,
// as after a crash.
type Cluster struct {
	t     testing.TB
	opts  []*server.Options
	nodes []*server.Server
}

// StartCluster starts a cluster of n nodes (ClusterOptions) and waits until its JetStream has a
// meta leader. The nodes are shut down when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterOf(t, ClusterOptions(t, n))
}

// StartTaggedCluster starts a cluster of one node per name in nodes, node i (n<i>) tagged
// wire.NodeTag(nodes[i]) as a node's NATS server is in the manifests, so that a stream placed by
// a node's tag goes to that server.
func StartTaggedCluster(t testing.TB, nodes ...string) *Cluster {
	t.Helper()
	opts := ClusterOptions(t, len(nodes))
	for i, node := range nodes {
		opts[i].Tags = []string{wire.NodeTag(node)}
	}
	return StartClusterOf(t, opts)
}

// ClusterOptions are the options of n embedded NATS servers with JetStream routed into one cluster
// on free loopback ports, each with its own store directory, for StartClusterOf: a test may
// change them first (put the servers in operator mode, say).
func ClusterOptions(t testing.TB, n int) []*server.Options {
	t.Helper()
	ports := FreePorts(t, 2*n)
	clientPorts, routePorts := ports[:n], ports[n:]
	var routes []*url.URL
	for _, p := range routePorts {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	dir := t.TempDir()
	var opts []*server.Options
	for i := range n {
		opts = append(opts, &server.Options{
			ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: clientPorts[i],
			JetStream: true, StoreDir: filepath.Join(dir, fmt.Sprintf("n%d", i)),
			MaxPayload: 8 << 20, MaxPending: 256 << 20, NoLog: true, NoSigs: true,
			Cluster: server.ClusterOpts{Name: "fanin-test", Host: "127.0.0.1", Port: routePorts[i]},
			Routes:  routes,
		})
	}
	return opts
}

// StartClusterOf starts one embedded server per options, which must route them into one cluster
// on loopback ports (a configuration file's, parsed with server.ProcessConfigFile and moved to
// loopback, say), and waits until its JetStream has a meta leader. The nodes are shut down when
// the test ends.
func StartClusterOf(t testing.TB, opts []*server.Options) *Cluster {
	t.Helper()
	c := &Cluster{t: t, opts: opts, nodes: make([]*server.Server, len(opts))}
	t.Cleanup(func() { // registered first: a node that failed to start stops those before it
		for _, s := range c.nodes {
			if s != nil {
				s.Shutdown()
			}
		}
	})
	for i := range opts {
		c.Start(i)
	}
	c.WaitReady()
	return c
}

// WaitReady waits until the running nodes' JetStream has a meta leader and every one is current.
func (c *Cluster) WaitReady() {
	c.t.Helper()
	CheckFor(c.t, 30*time.Second, 50*time.Millisecond, func() error {
		leader := false
		for _, s := range c.nodes {
			if s == nil {
				continue
			}
			if !s.JetStreamIsCurrent() {
				return fmt.Errorf("%s: JetStream not current", s.Name())
			}
			leader = leader || s.JetStreamIsLeader()
		}
		if !leader {
			return fmt.Errorf("no JetStream meta leader")
		}
		return nil
	})
}

// URLs is a client URL list of every node, for nats.Connect.
func (c *Cluster) URLs() string {
	var us []string
	for _, o := range c.opts {
		us = append(us, fmt.Sprintf("nats://127.0.0.1:%d", o.Port))
	}
	return strings.Join(us, ",")
}

// Node is node i, or nil while it is stopped.
func (c *Cluster) Node(i int) *server.Server { return c.nodes[i] }

// Stop shuts node i down.
func (c *Cluster) Stop(i int) {
	c.nodes[i].Shutdown()
	c.nodes[i].WaitForShutdown()
	c.nodes[i] = nil
}

// Start starts node i (again) on its ports and store directory.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	o := *c.opts[i]
	s, err := server.NewServer(&o)
	if err != nil {
		c.t.Fatal(err)
	}
	// The servers log nothing (NoLog), and one that cannot listen on a port (taken by another
	// process since it was picked) says so only to its logger, then is never ready: errs keeps
	// what it reports as errors, and a fatal one fails the start at once, with its message.
	errs := &startLog{}
	s.SetLogger(errs, false, false)
	go s.Start()
	// A minute: a clustered server's start (JetStream's store, its routes) took over 10 s under the
	// race detector on a machine busy with builds (CI on a fresh machine); a start that hangs still
	// fails the test.
	deadline := time.Now().Add(time.Minute)
	for !s.ReadyForConnections(250 * time.Millisecond) {
		if fatal := errs.fatal(); fatal != "" || time.Now().After(deadline) {
			s.Shutdown()
			c.t.Fatalf("node %d (%s) not ready: %s; its errors: %v", i, o.ServerName, cmp.Or(fatal, "not within a minute"), errs.errors())
		}
	}
	c.nodes[i] = s
}

// startLog is a server's logger while it starts: it keeps the errors and the first fatal error
// and drops the rest. nats-server's own logger would exit the test binary on a fatal error.
type startLog struct {
	mu    sync.Mutex
	errs  []string
	first string
}

func (l *startLog) Noticef(string, ...any) {}
func (l *startLog) Warnf(string, ...any)   {}
func (l *startLog) Debugf(string, ...any)  {}
func (l *startLog) Tracef(string, ...any)  {}

func (l *startLog) Errorf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) < 20 {
		l.errs = append(l.errs, fmt.Sprintf(format, v...))
	}
}

func (l *startLog) Fatalf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.first == "" {
		l.first = fmt.Sprintf(format, v...)
	}
}

func (l *startLog) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first
}

func (l *startLog) errors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errs)
}

// Index is the index of the node named name, or -1.
func (c *Cluster) Index(name string) int {
	for i, o := range c.opts {
		if o.ServerName == name {
			return i
		}
	}
	return -1
}
