//go:build linux

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestNetLab makes a two-node lab, checks what the cluster scenario relies on (the nodes reach
// each other over their capped links, and nothing else), and checks that closing it leaves no
// namespace behind and the host's routes as they were.
func TestNetLab(t *testing.T) {
	t.Parallel()
	if err := netLabAvailable(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	routes0 := hostRoutes(t)
	l, err := newNetLab(ctx, []nodeSpec{{"a", 100}, {"b", 400}}, "reno")
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = l.close()
		}
	})
	a, b := l.node("a"), l.node("b")
	if a == nil || b == nil || a.Addr == b.Addr {
		t.Fatalf("nodes a %+v and b %+v", a, b)
	}
	names, err := netLabNames()
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range l.namespaces() {
		if !slices.Contains(names, ns) {
			t.Errorf("namespace %s missing from %v", ns, names)
		}
	}

	// The switch does not hand its frames to netfilter (where br_netfilter is loaded at all).
	for _, f := range bridgeFilters {
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", l.sw, "cat", "/proc/sys/net/bridge/"+f).CombinedOutput()
		if err != nil {
			if _, serr := os.Stat("/proc/sys/net/bridge/" + f); errors.Is(serr, os.ErrNotExist) {
				continue // the module is not loaded: nothing filters
			}
			t.Fatalf("reading %s in the switch's namespace: %v: %s", f, err, out)
		}
		if v := strings.TrimSpace(string(out)); v != "0" {
			t.Errorf("%s in the switch's namespace is %s, want 0", f, v)
		}
	}

	// Each link is capped both ways: the node's side and the switch's port.
	for _, c := range []struct{ ns, dev, rate string }{
		{a.NS, netLabIf, "100Mbit"}, {l.sw, a.port, "100Mbit"}, {b.NS, netLabIf, "400Mbit"}, {l.sw, b.port, "400Mbit"},
	} {
		out, err := exec.CommandContext(ctx, "tc", "-n", c.ns, "qdisc", "show", "dev", c.dev).CombinedOutput()
		if err != nil {
			t.Fatalf("tc qdisc show %s in %s: %v: %s", c.dev, c.ns, err, out)
		}
		if s := string(out); !strings.Contains(s, "qdisc tbf") || !strings.Contains(s, "rate "+c.rate) {
			t.Errorf("%s in %s: %q, want a tbf qdisc at %s", c.dev, c.ns, s, c.rate)
		}
		// Its bucket holds a segmentation-offloaded packet whole (64 KiB of IP packet and an
		// Ethernet header): tbf cuts a larger packet into frames, which then cost the receiver's
		// CPU each, as on a NIC without offloads.
		out, err = exec.CommandContext(ctx, "tc", "-j", "-n", c.ns, "qdisc", "show", "dev", c.dev).Output()
		if err != nil {
			t.Fatal(err)
		}
		var qs []struct {
			Options struct{ Burst int } `json:"options"`
		}
		if err := json.Unmarshal(out, &qs); err != nil || len(qs) != 1 {
			t.Fatalf("tc -j qdisc show %s in %s: %q: %v", c.dev, c.ns, out, err)
		}
		if b := qs[0].Options.Burst; b < 64<<10+14 {
			t.Errorf("%s in %s: a bucket of %d bytes, want at least %d", c.dev, c.ns, b, 64<<10+14)
		}
	}
	// A node routes only the lab's network, and has no default route: no traffic can leave it.
	for _, n := range l.nodes {
		for _, family := range []string{"-4", "-6"} {
			out, err := exec.CommandContext(ctx, "ip", family, "-n", n.NS, "route", "show", "table", "all", "default").Output()
			if err != nil {
				t.Fatal(err)
			}
			if s := strings.TrimSpace(string(out)); s != "" {
				t.Errorf("node %s has a default route: %q", n.Name, s)
			}
		}
		out, err := exec.CommandContext(ctx, "ip", "-4", "-n", n.NS, "route", "show").Output()
		if err != nil {
			t.Fatal(err)
		}
		if s, want := strings.Fields(string(out)), netLabNet+"0/24"; len(s) == 0 || s[0] != want || strings.Count(string(out), "\n") != 1 {
			t.Errorf("node %s's routes: %q, want only %s", n.Name, out, want)
		}
		// It carries the congestion control asked for (reno: neither the kernel's default nor
		// this machine's).
		if !strings.Contains(string(out), "congctl reno") {
			t.Errorf("node %s's route: %q, want congctl reno", n.Name, out)
		}
	}

	// a reaches b: a listener in b's namespace, a connection from a's, bytes across.
	var ln net.Listener
	if err := b.do(func() (err error) { ln, err = net.Listen("tcp", b.Addr+":0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() { // ends with the connection or the listener
		c, err := ln.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		msg, _ := io.ReadAll(c)
		got <- string(msg) + " from " + c.RemoteAddr().(*net.TCPAddr).IP.String()
	}()
	c, err := a.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	before, err := a.counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tcp0, err := a.tcpCounters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stopTrace := traceLinks(l)
	if _, err := c.Write([]byte(strings.Repeat("x", 100_000))); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if s, want := <-got, strings.Repeat("x", 100_000)+" from "+a.Addr; s != want {
		t.Fatalf("b received %d bytes (%.40q...), want 100000 from %s", len(s), s, a.Addr)
	}
	after, err := a.counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := after.sub(before); d.tx < 100_000 {
		t.Errorf("a's counters show %d bytes sent, want at least the 100000 written", d.tx)
	}
	// 100000 bytes are at least 70 segments of 1448 bytes.
	if tcp1, err := a.tcpCounters(ctx); err != nil || tcp1.sub(tcp0).segs < 70 {
		t.Errorf("a's TCP counters: %+v then %+v (%v), want at least 70 segments more", tcp0, tcp1, err)
	}
	// The trace, read at the switch's ports, saw a send them and b receive them.
	tr, err := stopTrace()
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		node   string
		rx, tx bool
	}{{"a", false, true}, {"b", true, false}} {
		ss := tr.samples[i]
		if tr.nodes[i] != want.node || len(ss) < 2 {
			t.Fatalf("trace of %s: %d samples", tr.nodes[i], len(ss))
		}
		rx, tx := ss[len(ss)-1].rx-ss[0].rx, ss[len(ss)-1].tx-ss[0].tx
		if (rx >= 100_000) != want.rx || (tx >= 100_000) != want.tx {
			t.Errorf("trace of %s: %d bytes in, %d out while a sent b 100000", want.node, rx, tx)
		}
	}
	// The host cannot reach the lab: its address is only in the lab's namespaces.
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), 200*time.Millisecond); err == nil {
		c.Close()
		t.Errorf("the host's namespace reached %s", ln.Addr())
	}
	ln.Close()

	closed = true
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	if names, err = netLabNames(); err != nil {
		t.Fatal(err)
	}
	for _, ns := range l.namespaces() {
		if slices.Contains(names, ns) {
			t.Errorf("namespace %s left after close", ns)
		}
	}
	if r := hostRoutes(t); r != routes0 {
		t.Errorf("the host's routes changed:\nbefore:\n%s\nafter:\n%s", routes0, r)
	}
}

// TestNetLabFailureLeavesNothing: a lab that cannot be made (its second node's rate is invalid)
// removes what it made before failing.
func TestNetLabFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	if err := netLabAvailable(); err != nil {
		t.Skip(err)
	}
	before, err := netLabNames()
	if err != nil {
		t.Fatal(err)
	}
	l, err := newNetLab(context.Background(), []nodeSpec{{"a", 100}, {"b", 0}}, clusterTCPCC)
	if l == nil {
		t.Fatalf("newNetLab with a 0 Mbit/s node returned no lab to name its namespaces (err %v)", err)
	}
	if err == nil || !strings.Contains(err.Error(), `node "b": link rate 0 Mbit/s`) {
		t.Fatalf("newNetLab with a 0 Mbit/s node: %v, want the rate refused", err)
	}
	after, err := netLabNames()
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range after {
		if !slices.Contains(before, ns) && strings.HasPrefix(ns, l.name+"-") {
			t.Errorf("namespace %s left by a failed lab", ns)
		}
	}
}

// TestSweepNetLabs: the namespaces of a bench that died are removed by the next one; those of a
// running process are not.
func TestSweepNetLabs(t *testing.T) {
	t.Parallel()
	if err := netLabAvailable(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	gone := netLabPrefix + strconv.Itoa(dead.Process.Pid) + "-1-sw"
	alive := netLabPrefix + strconv.Itoa(os.Getppid()) + "-1-sw"
	for _, ns := range []string{gone, alive} {
		if err := ipRun(ctx, "netns", "add", ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ipRun(ctx, "netns", "delete", ns) })
	}
	removed, err := sweepNetLabs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names, err := netLabNames()
	if err != nil {
		t.Fatal(err)
	}
	// (Another bench's sweep may have removed it first: that it is gone is what counts.)
	if slices.Contains(names, gone) {
		t.Errorf("the namespace of exited process %d: removed %v, left %v", dead.Process.Pid, removed, names)
	}
	if slices.Contains(removed, alive) || !slices.Contains(names, alive) {
		t.Errorf("the namespace of running process %d: removed %v, left %v", os.Getppid(), removed, names)
	}
}

// hostRoutes is the host's default routes, IPv4 and IPv6, every table.
func hostRoutes(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, family := range []string{"-4", "-6"} {
		out, err := exec.Command("ip", family, "route", "show", "table", "all", "default").Output()
		if err != nil {
			t.Fatal(err)
		}
		b.Write(out)
	}
	return b.String()
}

// TestMeasureHeld runs held processes on a lab's nodes as the cluster scenario runs its workers:
// each reports after it was released, and one that fails during its warm-up ends the others and
// the measurement, naming it, instead of leaving them waiting.
func TestMeasureHeld(t *testing.T) {
	t.Parallel()
	if err := netLabAvailable(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := newNetLab(ctx, []nodeSpec{{"a", 100}, {"b", 100}}, clusterTCPCC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.close(); err != nil {
			t.Error(err)
		}
	})
	held := func(n *netNode, script string) *heldProc {
		return &heldProc{name: "proc " + n.Name, cmd: n.command(ctx, "sh", "-c", script)}
	}
	// Each prints its node's address after the release: they ran in their namespaces.
	report := `echo ready; read go; echo "{\"after\": \"$go\", \"addr\": \"$(ip -4 -o addr show dev eth0 | grep -o '10\.99\.0\.[0-9]*' | head -1)\"}"`
	m, err := measureHeld(ctx, l, []*heldProc{held(l.nodes[0], report), held(l.nodes[1], report)}, nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range l.nodes {
		if got, want := string(m.outputs[i]), fmt.Sprintf(`{"after": "go", "addr": "%s"}`, n.Addr); got != want {
			t.Errorf("node %s's process reported %s, want %s", n.Name, got, want)
		}
		if _, ok := m.bytes[n.Name]; !ok {
			t.Errorf("no counters for node %s: %v", n.Name, m.bytes)
		}
	}
	if len(m.cpu) != 2 || m.cpu[0].name != "proc a" || m.cpu[1].name != "proc b" {
		t.Errorf("CPU of %v, want proc a and proc b", m.cpu)
	}

	_, err = measureHeld(ctx, l, []*heldProc{held(l.nodes[0], "echo ready; read go; echo done"), held(l.nodes[1], "echo failing >&2; exit 3")}, nil, 2)
	if err == nil || !strings.Contains(err.Error(), "proc b: ended during its warm-up") || !strings.Contains(err.Error(), "failing") {
		t.Fatalf("measureHeld with a process failing in its warm-up: %v, want its failure and its output", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("measureHeld waited until the test's deadline")
	}
}

func TestParseTCPCounts(t *testing.T) {
	const text = `Ip: Forwarding DefaultTTL
Ip: 1 64
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 10 8 0 1 3 5000 6100 17 0 2 0
Udp: InDatagrams
Udp: 4
TcpExt: SyncookiesSent SyncookiesRecv TCPTimeouts TCPLossProbes
TcpExt: 0 0 3 9
`
	got, err := parseTCPCounts(text)
	if want := (tcpCounts{segs: 6100, retrans: 17, timeouts: 3}); err != nil || got != want {
		t.Errorf("parseTCPCounts = %+v, %v; want %+v", got, err, want)
	}
	if _, err := parseTCPCounts("Tcp: OutSegs\nTcp: 5\n"); err == nil {
		t.Error("parseTCPCounts without RetransSegs and TCPTimeouts: no error")
	}
	if _, err := parseTCPCounts("Tcp: OutSegs RetransSegs\nTcp: 5 x\nTcpExt: TCPTimeouts\nTcpExt: 1\n"); err == nil {
		t.Error("parseTCPCounts with a value that is no number: no error")
	}
}
