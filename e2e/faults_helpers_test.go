package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

var serverReady = regexp.MustCompile(`Server is ready`)

// natsNodes are nats-server processes (the binary of the version fanin embeds) with JetStream on
// file storage: one server, or a cluster routed on loopback. A node can be killed with SIGKILL and
// started again on its ports and store, as after a crash.
type natsNodes struct {
	t      *testing.T
	confs  []string
	ports  []int
	mon    []int // monitoring ports (/stacksz, /jsz)
	routes []int // cluster ports (n > 1)
	procs  []*natsProc
}

type natsProc struct {
	p *proc
}

// startNATS starts n nats-server processes; n > 1 routes them into one cluster.
func startNATS(t *testing.T, n int) *natsNodes {
	t.Helper()
	return startNATSIn(t, n, t.TempDir())
}

// startNATSIn is startNATS with the servers' stores and configurations in dir.
func startNATSIn(t *testing.T, n int, dir string) *natsNodes {
	t.Helper()
	return startNATSWith(t, n, dir, nil)
}

// startNATSWith is startNATSIn with extra(i) appended to server i's configuration (nil: nothing).
func startNATSWith(t *testing.T, n int, dir string, extra func(i int) string) *natsNodes {
	t.Helper()
	nn := &natsNodes{t: t, procs: make([]*natsProc, n)}
	routes := make([]int, n)
	for i := range n {
		nn.ports = append(nn.ports, testutil.FreePort(t))
		nn.mon = append(nn.mon, testutil.FreePort(t))
		routes[i] = testutil.FreePort(t)
	}
	if n > 1 {
		nn.routes = routes
	}
	for i := range n {
		conf := fmt.Sprintf("server_name: n%d\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\nmax_payload: 8MB\nmax_pending: 256MB\n"+
			"jetstream { store_dir: %q }\n", i, nn.ports[i], nn.mon[i], filepath.Join(dir, fmt.Sprintf("n%d", i)))
		if n > 1 {
			var rs []string
			for _, r := range routes {
				rs = append(rs, fmt.Sprintf("nats://127.0.0.1:%d", r))
			}
			conf += fmt.Sprintf("cluster { name: fanin-e2e, listen: 127.0.0.1:%d, routes: [%s] }\n", routes[i], strings.Join(rs, ", "))
		}
		if extra != nil {
			conf += extra(i)
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

// stop stops node i with SIGTERM: it hands over the leaderships it holds, then exits.
func (nn *natsNodes) stop(i int) {
	nn.procs[i].p.stop(syscall.SIGTERM)
}

// restart starts node i again and waits until JetStream answers.
func (nn *natsNodes) restart(i int) {
	nn.t.Helper()
	nn.start(i)
	nn.waitJetStream()
}

// waitCurrent waits until every replica of every stream is current: a node just restarted has
// caught up, so that losing another one next is the loss of one node, not of two.
func (nn *natsNodes) waitCurrent() {
	nn.t.Helper()
	testutil.CheckFor(nn.t, 60*time.Second, 200*time.Millisecond, func() error {
		nc, err := nats.Connect(nn.url(), nats.Timeout(time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lister := js.ListStreams(ctx)
		for info := range lister.Info() {
			if cl := info.Cluster; cl != nil {
				if cl.Leader == "" {
					return fmt.Errorf("stream %s has no leader", info.Config.Name)
				}
				for _, r := range cl.Replicas {
					if !r.Current || r.Offline {
						return fmt.Errorf("stream %s: replica %s is not current", info.Config.Name, r.Name)
					}
				}
			}
		}
		return lister.Err()
	})
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

// elected measures, in the background, how long after since the JetStream meta group and every
// stream of streams have a leader other than the dead node: the part of a node loss's gap that is
// nats-server's raft elections (4-9 s after a SIGKILL) and not fanin's. It reports 0 if that takes
// over a minute.
func (nn *natsNodes) elected(since time.Time, dead string, streams ...string) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	go func() {
		for time.Since(since) < time.Minute {
			if nn.ledElsewhere(dead, streams) {
				out <- time.Since(since)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		out <- 0
	}()
	return out
}

func (nn *natsNodes) ledElsewhere(dead string, streams []string) bool {
	if meta := nn.metaLeader(dead); meta == "" || meta == dead {
		return false
	}
	nc, err := nats.Connect(nn.url(), nats.Timeout(time.Second))
	if err != nil {
		return false
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for _, name := range streams {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		st, err := js.Stream(ctx, name)
		cancel()
		if err != nil {
			return false
		}
		if cl := st.CachedInfo().Cluster; cl == nil || cl.Leader == "" || cl.Leader == dead {
			return false
		}
	}
	return true
}

// metaLeader is the JetStream meta leader a live node other than dead knows of, from its /jsz.
func (nn *natsNodes) metaLeader(dead string) string {
	for i, mon := range nn.mon {
		if fmt.Sprintf("n%d", i) == dead {
			continue
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/jsz", mon))
		if err != nil {
			continue
		}
		var jsz struct {
			Meta struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		err = json.NewDecoder(resp.Body).Decode(&jsz)
		resp.Body.Close()
		if err == nil {
			return jsz.Meta.Leader
		}
	}
	return ""
}

// dumpJob logs what each live node says of job's gradient and parameter streams and of their
// consumers: run when a step stalls, it tells a stream without a leader or a replica that lags
// from a consumer that stopped delivering. With FANIN_TEST_LOG set it also SIGQUITs the runtime
// processes, whose goroutine dumps then show in the test's output.
func (nn *natsNodes) dumpJob(rec *job.Record) {
	t, id := nn.t, rec.Spec.ID
	for i, port := range nn.ports {
		nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port), nats.Timeout(time.Second), nats.NoReconnect())
		if err != nil {
			t.Logf("n%d: %v", i, err)
			continue
		}
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for _, name := range []string{wire.GradStream(id), wire.ParamsStream(id)} {
			st, err := js.Stream(ctx, name)
			if err != nil {
				t.Logf("n%d: stream %s: %v", i, name, err)
				continue
			}
			info := st.CachedInfo()
			var cl []string
			if c := info.Cluster; c != nil {
				cl = append(cl, "leader="+c.Leader)
				for _, r := range c.Replicas {
					cl = append(cl, fmt.Sprintf("%s(current=%v,offline=%v,lag=%d)", r.Name, r.Current, r.Offline, r.Lag))
				}
			}
			t.Logf("n%d: stream %s: msgs=%d last_seq=%d %s", i, name, info.State.Msgs, info.State.LastSeq, strings.Join(cl, " "))
			if name == wire.GradStream(id) && info.State.Msgs > 0 {
				if si, err := st.Info(ctx, jetstream.WithSubjectFilter(">")); err == nil {
					var subj []string
					for s, n := range si.State.Subjects {
						subj = append(subj, fmt.Sprintf("%s=%d", s, n))
					}
					slices.Sort(subj)
					t.Logf("n%d:   messages by subject: %s", i, strings.Join(subj, " "))
				}
			}
			for ci := range st.ListConsumers(ctx).Info() {
				leader := ""
				if ci.Cluster != nil {
					leader = ci.Cluster.Leader
				}
				t.Logf("n%d:   consumer %s on %s: filter=%s delivered_stream=%d ack_floor=%d pending=%d waiting=%d ack_pending=%d",
					i, ci.Name, leader, ci.Config.FilterSubject+strings.Join(ci.Config.FilterSubjects, ","), ci.Delivered.Stream, ci.AckFloor.Stream, ci.NumPending, ci.NumWaiting, ci.NumAckPending)
			}
		}
		if st, err := js.Stream(ctx, wire.ParamsStream(id)); err == nil {
			var steps []string
			for _, sh := range rec.Layout.Shards {
				for _, subj := range []string{wire.ParamsSubject(id, sh.ID), wire.CkptSubject(id, sh.ID)} {
					if m, err := st.GetLastMsgForSubject(ctx, subj); err == nil {
						step, _ := wire.ParseStep(m.Header)
						steps = append(steps, fmt.Sprintf("%s@%d(seq %d)", subj[strings.LastIndexByte(subj[:strings.LastIndexByte(subj, '.')], '.')+1:], step, m.Sequence))
					}
				}
			}
			t.Logf("n%d: stored snapshots: %s", i, strings.Join(steps, " "))
		}
		cancel()
		nc.Close()
	}
	if os.Getenv("FANIN_TEST_LOG") != "" {
		for i, port := range nn.mon {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/stacksz", port))
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			path := filepath.Join(os.TempDir(), fmt.Sprintf("fanin-e2e-stacks-n%d.txt", i))
			if os.WriteFile(path, b, 0o600) == nil {
				t.Logf("n%d: goroutines written to %s", i, path)
			}
		}
		for id, pids := range runtimePids() { // one at a time: they share the autoscaler's stderr
			for _, pid := range pids {
				t.Logf("goroutines of runtime %s (pid %d):", id, pid)
				_ = syscall.Kill(pid, syscall.SIGQUIT)
				time.Sleep(2 * time.Second)
			}
		}
	}
}

// burnCores starts n processes that keep the cores busy until the test ends, as on a loaded node.
func burnCores(t *testing.T, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = orphanGuard()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
}
