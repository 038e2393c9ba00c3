//go:build linux

package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A netLab is a cluster of nodes emulated on this machine: one network namespace per node, each
// with one link (eth0, a veth) to a bridge in a namespace of its own (the switch), the link capped
// with tc in both directions (a token bucket on the node's side for what it sends, one on the
// switch's port for what it receives). Nothing is created in the host's namespace: no interface,
// no address, no route, so no traffic can leave the lab and the host's routes are never touched.
// Processes run on a node with command; the bench's own connections reach a node with its Dial.
//
// Namespaces are named netLabPrefix, this process's id, a sequence number and the node's name, so
// that concurrent benches do not meet and a later run can remove what a killed one left
// (sweepNetLabs).
type netLab struct {
	name  string // netLabPrefix + pid + "-" + seq
	sw    string // the switch's namespace
	nodes []*netNode
}

// netNode is one node of a netLab.
type netNode struct {
	Name string // as the bench calls it: w0, svc
	NS   string // its network namespace
	Addr string // its address on the lab's network
	Mbit int    // its link's rate, each way
	port string // its port on the switch (in the switch's namespace)
}

// nodeSpec asks for a node: its name and its link's rate each way, in Mbit/s.
type nodeSpec struct {
	name string
	mbit int
}

// clusterTCPCC is the nodes' TCP congestion control unless the bench is told another: Linux's
// default. Where a machine's default is BBR, new namespaces take it too, and with it a spread
// fanin's links, each shared by flows to and from three nodes whose shares shift within a step,
// were 79-80% used against 94% with CUBIC (gloo's ring, one flow per link: 94% and 98%).
const clusterTCPCC = "cubic"

const (
	netLabPrefix = "fanin-bench-"
	netLabNet    = "10.99.0." // the lab's /24: only the lab's namespaces have it
	netLabIf     = "eth0"     // a node's interface
)

var netLabSeq atomic.Int64

// netLabAvailable says why a netLab cannot be made here, or nil: it needs Linux, root (or
// CAP_NET_ADMIN and CAP_SYS_ADMIN: the namespaces and setns), ip and tc (iproute2).
func netLabAvailable() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: it creates network namespaces, a bridge and tc qdiscs (run as root, e.g. sudo)")
	}
	for _, bin := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("needs %s from iproute2 (Debian: apt-get install iproute2): %w", bin, err)
		}
	}
	return nil
}

// newNetLab makes the namespaces, the bridge, the links, their addresses and their caps. On
// failure it removes whatever it made.
func newNetLab(ctx context.Context, specs []nodeSpec, cc string) (_ *netLab, err error) {
	if err := netLabAvailable(); err != nil {
		return nil, err
	}
	if len(specs) == 0 || len(specs) > 250 {
		return nil, fmt.Errorf("netlab: %d nodes, want 1 to 250", len(specs))
	}
	l := &netLab{name: fmt.Sprintf("%s%d-%d", netLabPrefix, os.Getpid(), netLabSeq.Add(1))}
	l.sw = l.name + "-sw"
	defer func() {
		if err != nil {
			err = errors.Join(err, l.close())
		}
	}()
	if err := ipRun(ctx, "netns", "add", l.sw); err != nil {
		return l, err
	}
	if err := ipRunAll(ctx, [][]string{
		{"-n", l.sw, "link", "add", "br0", "type", "bridge"},
		{"-n", l.sw, "link", "set", "br0", "addrgenmode", "none"},
		{"-n", l.sw, "link", "set", "br0", "up"},
	}); err != nil {
		return l, err
	}
	if err := noBridgeFilter(ctx, l.sw); err != nil {
		return l, err
	}
	for i, s := range specs {
		if s.mbit <= 0 {
			return l, fmt.Errorf("netlab: node %q: link rate %d Mbit/s, want > 0", s.name, s.mbit)
		}
		n := &netNode{Name: s.name, NS: l.name + "-" + s.name, Addr: netLabNet + strconv.Itoa(i+1), Mbit: s.mbit, port: "p" + strconv.Itoa(i)}
		if err := ipRun(ctx, "netns", "add", n.NS); err != nil {
			return l, err
		}
		l.nodes = append(l.nodes, n)
		// The veth is created with its ends in the two namespaces: it never exists in the host's.
		// addrgenmode none: no IPv6 link-local address, so no neighbour discovery in the counters.
		if err := ipRunAll(ctx, [][]string{
			{"link", "add", netLabIf, "netns", n.NS, "type", "veth", "peer", "name", n.port, "netns", l.sw},
			{"-n", l.sw, "link", "set", n.port, "addrgenmode", "none"},
			{"-n", l.sw, "link", "set", n.port, "master", "br0"},
			{"-n", l.sw, "link", "set", n.port, "up"},
			{"-n", n.NS, "link", "set", netLabIf, "addrgenmode", "none"},
			{"-n", n.NS, "addr", "add", n.Addr + "/24", "dev", netLabIf},
			{"-n", n.NS, "link", "set", netLabIf, "up"},
			// The congestion control, set on the node's one route: a namespace's default may
			// only be one the host allows unprivileged users, and the route's needs no change
			// outside the lab.
			{"-n", n.NS, "route", "replace", netLabNet + "0/24", "dev", netLabIf, "proto", "kernel", "scope", "link", "src", n.Addr, "congctl", cc},
			{"-n", n.NS, "link", "set", "lo", "up"},
		}); err != nil {
			return l, err
		}
		// What the node sends: its own eth0's qdisc; what it receives: the switch port's.
		for _, at := range [][2]string{{n.NS, netLabIf}, {l.sw, n.port}} {
			if err := run(ctx, "tc", tbf(at[0], at[1], s.mbit)...); err != nil {
				return l, err
			}
		}
	}
	return l, nil
}

// bridgeFilters are the switches that make a bridge hand every frame it forwards to iptables,
// ip6tables and arptables. They exist once the br_netfilter module is loaded (a Kubernetes node or
// a container runtime loads it), and a new namespace starts with them on.
var bridgeFilters = []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables", "bridge-nf-call-arptables"}

// noBridgeFilter turns the bridge's netfilter calls off in the switch's namespace ns: a switch does
// not filter, and the lab should cost the same CPU whether or not the machine has the module
// loaded (at 100 Mbit/s per node no difference showed in the cluster bench's CPU per step).
func noBridgeFilter(ctx context.Context, ns string) error {
	var script strings.Builder
	for _, f := range bridgeFilters {
		fmt.Fprintf(&script, "f=/proc/sys/net/bridge/%s; if [ -e $f ]; then echo 0 >$f || exit 1; fi; ", f)
	}
	return ipRun(ctx, "netns", "exec", ns, "sh", "-c", script.String())
}

// maxGSO is a token bucket large enough for the largest packet TCP hands a veth with segmentation
// offload (64 KiB of IP packet, and its Ethernet header). tbf cuts a larger one into frames of the
// link's MTU, and each frame then crosses the switch and the receiver's TCP stack on its own, as
// on a NIC without segmentation or receive offloads: with 32 KiB, a node received 100 Mbit/s of
// TCP in 2.4 KB packets at 14 ns of CPU per byte; with this, in 27-43 KB packets at 3.5-4.3 ns.
// Real NICs offload both, and the 4 nodes share this machine's cores.
const maxGSO = 64<<10 + 1<<10

// tbf is tc's arguments capping dev in ns at mbit: a token bucket of about 2 ms at the rate
// (maxGSO at least, so that a segmentation-offloaded packet passes whole), queueing at most
// 50 ms of traffic as a switch's buffer would.
func tbf(ns, dev string, mbit int) []string {
	burst := max(maxGSO, mbit*1_000_000/8/500)
	return []string{"-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
		"rate", strconv.Itoa(mbit) + "mbit", "burst", strconv.Itoa(burst), "latency", "50ms"}
}

// namespaces are the lab's network namespaces, the switch's last.
func (l *netLab) namespaces() []string {
	var ns []string
	for _, n := range l.nodes {
		ns = append(ns, n.NS)
	}
	return append(ns, l.sw)
}

// close removes the lab's namespaces, and with them their links, addresses and qdiscs. The
// processes started in them must have ended: a namespace that still has a process lives on,
// unnamed, until it ends.
func (l *netLab) close() error {
	var errs []error
	for _, ns := range l.namespaces() {
		if _, err := os.Stat(filepath.Join(netnsDir, ns)); errors.Is(err, os.ErrNotExist) {
			continue
		}
		// Not the caller's context: a cancelled run must still clean up.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errs = append(errs, ipRun(ctx, "netns", "delete", ns))
		cancel()
	}
	return errors.Join(errs...)
}

// node returns the node named name.
func (l *netLab) node(name string) *netNode {
	for _, n := range l.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// netnsDir is where ip keeps the names of network namespaces.
const netnsDir = "/run/netns"

// netLabNames lists the namespaces of netLabs that exist (a test checks that none is left).
func netLabNames() ([]string, error) {
	ents, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), netLabPrefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

var netLabOwner = regexp.MustCompile("^" + regexp.QuoteMeta(netLabPrefix) + `(\d+)-`)

// sweepNetLabs removes the namespaces left by benches that are no longer running (killed with
// SIGKILL, say: their processes died with them, as they are started with a parent-death signal).
// It returns the names it removed.
func sweepNetLabs(ctx context.Context) ([]string, error) {
	names, err := netLabNames()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, ns := range names {
		m := netLabOwner.FindStringSubmatch(ns)
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue // ours, or its owner runs
		}
		if err := ipRun(ctx, "netns", "delete", ns); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, ns)
	}
	return removed, errors.Join(errs...)
}

// command is name with args run on node n (ip netns exec, which execs it: the process's id is
// the command's own, so /proc and its CPU time are its own). It is killed if this process dies.
func (n *netNode) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.NS, name}, args...)...)
	cmd.SysProcAttr = dieWithBench()
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// linkBytes are the bytes a node's link carried, from its interface's counters.
type linkBytes struct{ rx, tx uint64 }

func (b linkBytes) sub(a linkBytes) linkBytes { return linkBytes{b.rx - a.rx, b.tx - a.tx} }

// tcpCounts are a node's TCP counters (its namespace's /proc/net/snmp and /proc/net/netstat):
// segments sent, segments sent again, and retransmission timeouts.
type tcpCounts struct{ segs, retrans, timeouts uint64 }

func (c tcpCounts) add(d tcpCounts) tcpCounts {
	return tcpCounts{c.segs + d.segs, c.retrans + d.retrans, c.timeouts + d.timeouts}
}

func (c tcpCounts) sub(a tcpCounts) tcpCounts {
	return tcpCounts{c.segs - a.segs, c.retrans - a.retrans, c.timeouts - a.timeouts}
}

func (c tcpCounts) String() string {
	return fmt.Sprintf("%d of %d segments sent again (%.2f%%), %d retransmission timeouts", c.retrans, c.segs, 100*float64(c.retrans)/float64(max(c.segs, 1)), c.timeouts)
}

// tcpCounters reads the node's TCP counters.
func (n *netNode) tcpCounters(ctx context.Context) (tcpCounts, error) {
	out, err := n.command(ctx, "cat", "/proc/net/snmp", "/proc/net/netstat").Output()
	if err != nil {
		return tcpCounts{}, fmt.Errorf("node %s: read its TCP counters: %w", n.Name, exitDetail(err))
	}
	c, err := parseTCPCounts(string(out))
	if err != nil {
		return tcpCounts{}, fmt.Errorf("node %s: %w", n.Name, err)
	}
	return c, nil
}

// parseTCPCounts reads OutSegs and RetransSegs from the "Tcp:" lines and TCPTimeouts from the
// "TcpExt:" lines of /proc/net/snmp and /proc/net/netstat (each a line of names, then one of
// values).
func parseTCPCounts(text string) (tcpCounts, error) {
	want := map[string]*uint64{}
	var c tcpCounts
	want["Tcp:OutSegs"], want["Tcp:RetransSegs"], want["TcpExt:TCPTimeouts"] = &c.segs, &c.retrans, &c.timeouts
	lines := strings.Split(text, "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || len(names) != len(values) || names[0] != values[0] {
			continue
		}
		for k := 1; k < len(names); k++ {
			p, ok := want[names[0]+names[k]]
			if !ok {
				continue
			}
			v, err := strconv.ParseUint(values[k], 10, 64)
			if err != nil {
				return tcpCounts{}, fmt.Errorf("TCP counter %s%s: %w", names[0], names[k], err)
			}
			*p = v
			delete(want, names[0]+names[k])
		}
		i++
	}
	if len(want) > 0 {
		return tcpCounts{}, fmt.Errorf("TCP counters: %d of OutSegs, RetransSegs, TCPTimeouts not found", len(want))
	}
	return c, nil
}

// counters reads the node's interface counters (/sys/class/net/eth0/statistics, as the node sees
// its sysfs).
func (n *netNode) counters(ctx context.Context) (linkBytes, error) {
	dir := "/sys/class/net/" + netLabIf + "/statistics/"
	out, err := n.command(ctx, "cat", dir+"rx_bytes", dir+"tx_bytes").Output()
	if err != nil {
		return linkBytes{}, fmt.Errorf("node %s: read %s: %w", n.Name, dir, exitDetail(err))
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		return linkBytes{}, fmt.Errorf("node %s: %s printed %q", n.Name, dir, out)
	}
	rx, err1 := strconv.ParseUint(f[0], 10, 64)
	tx, err2 := strconv.ParseUint(f[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return linkBytes{}, fmt.Errorf("node %s: %w", n.Name, err)
	}
	return linkBytes{rx, tx}, nil
}

// Dial connects from inside the node's namespace (nats.CustomDialer): the socket belongs to the
// namespace for its whole life.
func (n *netNode) Dial(network, address string) (c net.Conn, err error) {
	err = n.do(func() error {
		c, err = net.DialTimeout(network, address, 5*time.Second)
		return err
	})
	return c, err
}

// do runs f on a thread that entered the node's namespace: the sockets f makes belong to it.
func (n *netNode) do(f func() error) error {
	target, err := os.Open(filepath.Join(netnsDir, n.NS))
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	defer target.Close()
	done := make(chan error, 1)
	go func() { // owned by do, which waits for it
		goruntime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			goruntime.UnlockOSThread()
			done <- err
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			goruntime.UnlockOSThread()
			done <- fmt.Errorf("node %s: setns: %w", n.Name, err)
			return
		}
		err = f()
		// Back to this thread's namespace before another goroutine may run on it; if that fails,
		// the thread stays locked and ends with this goroutine.
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// URL is the NATS URL of a server listening on port on node n.
func (n *netNode) URL(port int) string { return fmt.Sprintf("nats://%s:%d", n.Addr, port) }

func ipRun(ctx context.Context, args ...string) error { return run(ctx, "ip", args...) }

func ipRunAll(ctx context.Context, cmds [][]string) error {
	for _, args := range cmds {
		if err := ipRun(ctx, args...); err != nil {
			return err
		}
	}
	return nil
}

// run runs a command and returns an error with its output if it fails.
func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(tail(out.Bytes(), 500)))
	}
	return nil
}

// exitDetail adds a failed command's standard error to its error.
func exitDetail(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(tail(ee.Stderr, 300)))
	}
	return err
}
