//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

// clusterPlan is how long each measurement runs.
func (rs *runState) clusterPlan() e2ePlan {
	if rs.cfg.Quick {
		return e2ePlan{warmup: 1, steps: 2, reps: 1}
	}
	return e2ePlan{warmup: 2, steps: 5, reps: 1}
}

// clusterEnv is what every measurement of the scenario uses.
type clusterEnv struct {
	mbit                         int    // every worker node's link, each way
	cc                           string // the nodes' TCP congestion control
	exe, natsServer, natsVersion string
	python, script, torch        string
	dir                          string
	load                         string // the machine's load average at the start
	w                            workload
	plan                         e2ePlan
}

func runCluster(ctx context.Context, rs *runState) ([]Result, error) {
	skip := func(why string) ([]Result, error) {
		return []Result{{Scenario: "cluster", Case: fmt.Sprintf("N=%d,%dMbit", clusterWorkers, rs.cfg.linkMbit()), Metric: "steps/s", Baseline: glooRingBaseline, Skipped: why}}, nil
	}
	if err := netLabAvailable(); err != nil {
		return skip(err.Error())
	}
	if removed, err := sweepNetLabs(ctx); err != nil {
		return nil, fmt.Errorf("remove the namespaces of benches that died: %w", err)
	} else if len(removed) > 0 {
		rs.printf("   removed namespaces left by benches that died: %s", strings.Join(removed, ", "))
	}
	env := &clusterEnv{mbit: rs.cfg.linkMbit(), cc: rs.cfg.tcpCC(), w: workload{Ranks: clusterWorkers, Elements: clusterElements, ShardSize: clusterShardSize}, plan: rs.clusterPlan(), load: loadAverage()}
	var err error
	if env.python, err = findTorch(ctx); err != nil {
		return skip(err.Error())
	}
	if env.exe, err = os.Executable(); err != nil {
		return nil, err
	}
	if env.dir, err = os.MkdirTemp("", "fanin-bench-cluster-"); err != nil {
		return nil, err
	}
	defer os.RemoveAll(env.dir)
	if env.natsServer, env.natsVersion, err = findNATSServer(ctx, env.dir); err != nil {
		return skip(err.Error())
	}
	env.script = filepath.Join(env.dir, "gloo.py")
	if err := os.WriteFile(env.script, []byte(glooScript), 0o644); err != nil {
		return nil, err
	}

	cases := clusterCases
	if len(rs.cfg.Cases) > 0 {
		cases = nil
		for _, name := range rs.cfg.Cases {
			i := slices.IndexFunc(clusterCases, func(c clusterCase) bool { return c.name == name })
			if i < 0 {
				names := make([]string, len(clusterCases))
				for j, c := range clusterCases {
					names[j] = c.name
				}
				return nil, fmt.Errorf("bench: unknown cluster case %q (known: %s)", name, strings.Join(names, "; "))
			}
			cases = append(cases, clusterCases[i])
		}
	}

	var glooRuns []clusterRun
	gloo := func() error {
		rs.printf("   cluster gloo run %d ...", len(glooRuns)+1)
		start := time.Now()
		r, err := runGlooCluster(ctx, env)
		if err != nil {
			return fmt.Errorf("gloo: %w", err)
		}
		rs.printf("   cluster gloo: %.3f steps/s (run in %.0f s)", r.stepsPerSec, time.Since(start).Seconds())
		glooRuns = append(glooRuns, r)
		if err := rs.writeLinkTrace(r, fmt.Sprintf("gloo-%d", len(glooRuns))); err != nil {
			return err
		}
		env.torch = r.torch
		return nil
	}
	// A case that fails is a row of its own; the others still run.
	faninRuns := make([]clusterRun, len(cases))
	var errs []error
	for i, c := range cases {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if i%2 == 0 {
			if err := gloo(); err != nil {
				return nil, err
			}
		}
		rs.printf("   cluster fanin %s ...", c.name)
		start := time.Now()
		r, err := runFaninCluster(ctx, rs, env, c)
		if err != nil {
			r.err = fmt.Errorf("fanin %s: %w", c.name, err)
			errs = append(errs, r.err)
			rs.printf("   cluster fanin %s FAILED: %v", c.name, err)
		} else {
			rs.printf("   cluster fanin %s: %.3f steps/s (run in %.0f s)", c.name, r.stepsPerSec, time.Since(start).Seconds())
			if err := rs.writeLinkTrace(r, c.name); err != nil {
				return nil, err
			}
		}
		faninRuns[i] = r
	}
	// The same job ends with the same parameters wherever its service runs.
	for i, c := range cases {
		for j := range i {
			a, b := faninRuns[i], faninRuns[j]
			if a.err == nil && b.err == nil && cases[j].bf16 == c.bf16 && cases[j].spec == nil && c.spec == nil && a.sum != b.sum {
				err := fmt.Errorf("fanin %s ended with parameters %.12s, %s with %.12s", c.name, a.sum, cases[j].name, b.sum)
				faninRuns[i].err = err
				errs = append(errs, err)
			}
		}
	}
	return clusterResults(env, cases, glooRuns, faninRuns), errors.Join(errs...)
}

// writeLinkTrace writes a run's trace of the links to the directory Config.LinkTrace names, if
// any, as cluster-name.tsv.
func (rs *runState) writeLinkTrace(r clusterRun, name string) error {
	if rs.cfg.LinkTrace == "" {
		return nil
	}
	path := filepath.Join(rs.cfg.LinkTrace, "cluster-"+fileName(name)+".tsv")
	if err := r.links.write(path); err != nil {
		return fmt.Errorf("bench: the links' trace: %w", err)
	}
	rs.printf("   wrote %s", path)
	return nil
}

// fileName is a file name of a case's: "service node,4x link" is service-node-4x-link.
func fileName(name string) string {
	return strings.Join(strings.FieldsFunc(name, func(r rune) bool { return r == ' ' || r == ',' }), "-")
}

// linkUseNote says how a run used the worker nodes' links through its timed steps.
func (r clusterRun) linkUseNote() string {
	u, ok := r.links.use("w", linkUseBin)
	if !ok {
		return "not traced"
	}
	return u.String()
}

// linkUseBin is the time over which the trace's rates are taken when it tells a busy link from an
// idle one.
const linkUseBin = 50 * time.Millisecond

// clusterRun is one measurement of the timed steps.
type clusterRun struct {
	stepsPerSec float64
	runs        []float64            // every worker process's (or gloo rank's) steps/s
	bytes       map[string]linkBytes // per node, per step
	cpu         []procCPU            // per process, per step
	sum         string               // the parameters at the end (sha256)
	torch       string               // gloo: torch's version
	observed    string               // what explains the figure
	links       linkTrace            // the links through the timed steps
	tcp         tcpCounts            // every node's TCP counters through the timed steps
	err         error                // why the run failed
}

type procCPU struct {
	name string
	cpu  time.Duration
}

func (r clusterRun) totalCPU() time.Duration {
	var d time.Duration
	for _, p := range r.cpu {
		d += p.cpu
	}
	return d
}

// cpuList prints the processes' CPU per step.
func (r clusterRun) cpuList() string {
	var parts []string
	for _, p := range r.cpu {
		parts = append(parts, fmt.Sprintf("%s %.0f", p.name, ms(p.cpu)))
	}
	return strings.Join(parts, ", ")
}

// runFaninCluster measures fanin in case c: a fresh lab, servers, runtimes, job and workers.
func runFaninCluster(ctx context.Context, rs *runState, env *clusterEnv, c clusterCase) (_ clusterRun, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	specs := workerNodes(env.mbit)
	if c.layout == onServiceNode {
		specs = append(specs, nodeSpec{"svc", env.mbit * c.link})
	}
	lab, err := newNetLab(ctx, specs, env.cc)
	if err != nil {
		return clusterRun{}, err
	}
	defer func() { err = errors.Join(err, lab.close()) }()
	dir, err := os.MkdirTemp(env.dir, "fanin-")
	if err != nil {
		return clusterRun{}, err
	}
	// Where the processes' logs go: beside the servers' stores, or kept in Config.Logs. The files
	// close after every process ended (this defer runs after theirs).
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}()
	logs := dir
	if rs.cfg.Logs != "" {
		if err := os.MkdirAll(rs.cfg.Logs, 0o755); err != nil {
			return clusterRun{}, err
		}
		if logs, err = os.MkdirTemp(rs.cfg.Logs, "cluster-"+fileName(c.name)+"-"+time.Now().UTC().Format("20060102-150405")+"-"); err != nil {
			return clusterRun{}, err
		}
		rs.printf("   logs in %s", logs)
	}
	logFile := func(name string) (*os.File, error) {
		f, err := os.Create(filepath.Join(logs, name+".log"))
		if err == nil {
			closers = append(closers, f)
		}
		return f, err
	}

	// The NATS servers: one on the service node, or one cluster over the worker nodes.
	servers := lab.nodes[:clusterWorkers]
	if c.layout == onServiceNode {
		servers = []*netNode{lab.node("svc")}
	}
	var procs []*tracked // every process of the service, for its CPU
	var natsProcs []*exec.Cmd
	defer func() {
		for _, p := range natsProcs { // SIGTERM: it shuts down; SIGKILL if it has not in 10 s
			_ = p.Process.Signal(syscall.SIGTERM)
			t := time.AfterFunc(10*time.Second, func() { _ = p.Process.Kill() })
			_ = p.Wait()
			t.Stop()
		}
	}()
	// The runtimes, stopped before the NATS servers (deferred after them).
	var rts []*runtimeProc
	defer func() {
		for _, p := range rts {
			_ = p.stop()
		}
	}()
	local := fmt.Sprintf("nats://127.0.0.1:%d", clusterNATSPort)
	// startRuntime starts runtime i on node n with the runtime process's arguments before its
	// own (the NATS server it connects to).
	startRuntime := func(n *netNode, i int, natsArgs ...string) error {
		id := fmt.Sprintf("rt-%s-%d", n.Name, i)
		// The runtime tells the autoscaler its node's link rate, so that a job's shards are placed
		// by the bytes each node's link can carry (a node's NATS server names the node).
		args := append([]string{RuntimeCommand, "--id", id, "--cores", strconv.Itoa(runtimeCores)}, natsArgs...)
		args = append(args, "--nic-bytes", strconv.Itoa(n.Mbit*1_000_000/8))
		var log io.Writer
		if rs.cfg.Logs != "" {
			f, err := logFile(id)
			if err != nil {
				return err
			}
			args, log = append(args, "--log"), f
		}
		p, err := startRuntimeCmd(id, n.command(ctx, env.exe, args...), log)
		if err != nil {
			return err
		}
		rts = append(rts, p)
		name := id
		if len(natsArgs) > 0 && natsArgs[0] == "--nats-config" {
			name = "nats-server + " + id
		}
		procs = append(procs, &tracked{name: name, pid: p.cmd.Process.Pid})
		return nil
	}
	for i, n := range servers {
		conf := natsServerConf(n, servers, filepath.Join(dir, n.Name))
		path := filepath.Join(dir, n.Name+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return clusterRun{}, err
		}
		if c.embedded { // the node's server runs in its first runtime's process
			if err := startRuntime(n, i, "--nats-config", path); err != nil {
				return clusterRun{}, err
			}
			continue
		}
		cmd := n.command(ctx, env.natsServer, "-c", path)
		logf, err := logFile("nats-" + n.Name)
		if err != nil {
			return clusterRun{}, err
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			return clusterRun{}, fmt.Errorf("nats-server on %s: %w", n.Name, err)
		}
		natsProcs = append(natsProcs, cmd)
		procs = append(procs, &tracked{name: "nats-server " + n.Name, pid: cmd.Process.Pid})
	}
	conns := map[*netNode]*nats.Conn{}
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	for _, n := range servers {
		if err := waitFor(ctx, 30*time.Second, func() error {
			if conns[n] == nil {
				nc, err := nats.Connect(n.URL(clusterNATSPort), nats.Name("fanin-bench"), nats.SetCustomDialer(n), nats.MaxReconnects(-1))
				if err != nil {
					return err
				}
				conns[n] = nc
			}
			return jetStreamAnswers(ctx, conns[n])
		}); err != nil {
			log, _ := os.ReadFile(filepath.Join(logs, "nats-"+n.Name+".log"))
			return clusterRun{}, fmt.Errorf("nats-server on %s: %w: %s", n.Name, err, tail(log, 1000))
		}
	}

	// The control plane, in this process, connected to the first server from its node.
	ctl := servers[0]
	var ctlLog *slog.Logger
	if rs.cfg.Logs != "" {
		f, err := logFile("control")
		if err != nil {
			return clusterRun{}, err
		}
		ctlLog = slog.New(slog.NewMultiHandler(slog.NewTextHandler(f, nil), rs.stackLog.Handler()))
	}
	cp, err := startControlPlane(ctx, rs, func(name string) (*nats.Conn, error) {
		return nats.Connect(ctl.URL(clusterNATSPort), nats.Name(name), nats.SetCustomDialer(ctl), nats.MaxReconnects(-1))
	}, clusterRuntimes(c), ctlLog)
	if err != nil {
		return clusterRun{}, err
	}
	defer cp.close()

	// The runtimes, each connected to its own node's server (those in a server's process are).
	for i := len(rts); i < clusterRuntimes(c); i++ {
		if err := startRuntime(servers[i%len(servers)], i, "--nats", local); err != nil {
			return clusterRun{}, err
		}
	}
	if err := cp.waitRuntimes(ctx, len(rts)); err != nil {
		return clusterRun{}, err
	}
	// The gateway and the autoscaler are this process (which also reads the counters meanwhile).
	procs = append(procs, &tracked{name: "the bench: gateway, autoscaler, link sampler", pid: os.Getpid()})

	spec := env.w.spec("bench")
	if c.bf16 {
		spec.ParamDtype = "bf16"
	}
	if c.spec != nil {
		c.spec(&spec)
	}
	spec.Normalize()
	created, err := cp.gw.SubmitJob(ctx, spec)
	if err != nil {
		return clusterRun{}, fmt.Errorf("create job: %w", err)
	}

	// One worker process per worker node, one rank each.
	var workers []*heldProc
	for i, n := range lab.nodes[:clusterWorkers] {
		url := local
		if c.layout == onServiceNode {
			url = servers[0].URL(clusterNATSPort)
		}
		args := []string{WorkersCommand, "--nats", url, "--job", created.Spec.ID, "--ranks", "1", "--first-rank", strconv.Itoa(i),
			"--warmup", strconv.Itoa(env.plan.warmup), "--steps", strconv.Itoa(env.plan.steps), "--hold"}
		if c.bf16 {
			args = append(args, "--dtype", "bf16")
		}
		cmd := n.command(ctx, env.exe, args...)
		cmd.Env = append(os.Environ(), WorkersEnv+"=1")
		w := &heldProc{name: "worker " + n.Name, cmd: cmd}
		if rs.cfg.Logs != "" {
			if w.log, err = logFile("worker-" + n.Name); err != nil {
				return clusterRun{}, err
			}
		}
		workers = append(workers, w)
	}
	m, err := measureHeld(ctx, lab, workers, procs, env.plan.steps)
	if err != nil {
		return clusterRun{}, err
	}
	run := clusterRun{bytes: m.bytes, cpu: m.cpu, links: m.links, tcp: m.tcp}
	var fetched []string // per worker: shards fetched rather than pushed / gradients sent again
	for i, out := range m.outputs {
		var rep WorkersReport
		if err := json.Unmarshal(out, &rep); err != nil {
			return run, fmt.Errorf("worker w%d printed %q: %w", i, tail(out, 300), err)
		}
		if i > 0 && rep.Sha256 != run.sum {
			return run, fmt.Errorf("worker w%d ended with parameters %.12s, w0 with %.12s", i, rep.Sha256, run.sum)
		}
		run.sum = rep.Sha256
		run.runs = append(run.runs, rep.StepsPerSec)
		f := fmt.Sprintf("w%d %d/%d", i, rep.Fetches, rep.Resends)
		if by := rep.ResendsBy; by.Total() > 0 {
			f += fmt.Sprintf(" (timeout %d, stall %d, notice %d, no responders %d)", by.Timeout, by.Stall, by.Notice, by.NoResponders)
		}
		fetched = append(fetched, f)
	}
	run.stepsPerSec = slices.Min(run.runs)

	// What explains the figure: where the shards ran and where the job's streams are.
	var notes []string
	for _, p := range rts {
		s, err := p.sample()
		if err != nil {
			return run, err
		}
		if s.Rejected > 0 {
			return run, fmt.Errorf("runtime %s refused %d inputs", p.id, s.Rejected)
		}
		notes = append(notes, fmt.Sprintf("%s %d", p.id, s.Shards))
	}
	run.observed = "shards per runtime: " + strings.Join(notes, ", ") +
		"; parameters fetched / gradients sent again, timed steps: " + strings.Join(fetched, ", ")
	if c.layout == spreadOverWorkers {
		run.observed += "; " + streamLeaders(ctx, conns[ctl], created.Spec.ID)
		if n := created.Spec.GradStreams(); n > 1 {
			run.observed += "; " + shardsAway(ctx, conns[ctl], cp, &created.Record)
		}
	}
	return run, nil
}

// shardsAway counts the shards of a job with several gradient streams that a runtime on another
// server than their stream's serves: each of their gradients crosses the network twice.
func shardsAway(ctx context.Context, nc *nats.Conn, cp *controlPlane, rec *job.Record) string {
	js, err := jetstream.New(nc)
	if err != nil {
		return "placement: " + err.Error()
	}
	pool, err := cp.gw.Pool(ctx)
	if err != nil {
		return "placement: " + err.Error()
	}
	server := map[string]string{}
	for _, rt := range pool.Runtimes {
		server[rt.ID] = rt.Server
	}
	kv, err := js.KeyValue(ctx, wire.PlacementBucket)
	if err != nil {
		return "placement: " + err.Error()
	}
	n, leaders := rec.Spec.GradStreams(), map[int]string{}
	var away []string
	for _, sh := range rec.Layout.Shards {
		g := sh.ID % n
		if _, ok := leaders[g]; !ok {
			if st, err := js.Stream(ctx, wire.GradGroupStream(rec.Spec.ID, g)); err == nil && st.CachedInfo().Cluster != nil {
				leaders[g] = st.CachedInfo().Cluster.Leader
			}
		}
		e, err := kv.Get(ctx, wire.PlacementKey(rec.Spec.ID, sh.ID))
		if err != nil {
			return "placement: " + err.Error()
		}
		var p wire.Placement
		if err := json.Unmarshal(e.Value(), &p); err != nil {
			return "placement: " + err.Error()
		}
		if server[p.Runtime] != leaders[g] {
			away = append(away, fmt.Sprintf("%d on %s, its stream on %s", sh.ID, p.Runtime, leaders[g]))
		}
	}
	if len(away) == 0 {
		return "every shard served on its gradient stream's server"
	}
	return fmt.Sprintf("%d shards served away from their gradient stream's server (%s)", len(away), strings.Join(away, "; "))
}

// workerNodes are the lab's worker nodes, w0 to w(clusterWorkers-1), with links of mbit.
func workerNodes(mbit int) []nodeSpec {
	var specs []nodeSpec
	for i := range clusterWorkers {
		specs = append(specs, nodeSpec{fmt.Sprintf("w%d", i), mbit})
	}
	return specs
}

// clusterRuntimes is the pool of case c.
func clusterRuntimes(c clusterCase) int {
	if c.layout == onServiceNode {
		return clusterServiceRuntimes
	}
	return clusterWorkers
}

// natsServerConf is the configuration of the NATS server on node n: JetStream, fanin's payload
// limit, the tag of its node (a direct job's checkpoints are kept in a stream on the node of the
// runtime that writes them, placed by it), and a route to every other server of servers.
func natsServerConf(n *netNode, servers []*netNode, store string) string {
	conf := fmt.Sprintf("server_name: %s\nserver_tags: [%q]\nlisten: 0.0.0.0:%d\nmax_payload: %d\nmax_pending: 1GB\nwrite_deadline: \"10s\"\njetstream { store_dir: %q }\n",
		n.Name, wire.NodeTag(n.Name), clusterNATSPort, 32<<20, store)
	if len(servers) > 1 {
		var routes []string
		for _, s := range servers {
			routes = append(routes, fmt.Sprintf("nats://%s:%d", s.Addr, clusterRoutePort))
		}
		conf += fmt.Sprintf("cluster { name: fanin-bench, listen: 0.0.0.0:%d, routes: [%s] }\n", clusterRoutePort, strings.Join(routes, ", "))
	}
	return conf
}

// streamLeaders names the servers that hold a job's streams.
func streamLeaders(ctx context.Context, nc *nats.Conn, jobID string) string {
	js, err := jetstream.New(nc)
	if err != nil {
		return "streams: " + err.Error()
	}
	var parts []string
	names := []string{wire.GradStream(jobID), wire.ParamsStream(jobID)}
	for _, filter := range []string{wire.GradWildcard(jobID), wire.NodeCkptFilter(jobID)} {
		more := js.StreamNames(ctx, jetstream.WithStreamListSubject(filter))
		for name := range more.Name() {
			if name != wire.GradStream(jobID) {
				names = append(names, name)
			}
		}
	}
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound) && name == wire.GradStream(jobID):
			if len(names) == 2 { // nor any gradient group's
				parts = append(parts, "no gradient stream (direct gradients)")
			}
		case err != nil:
			parts = append(parts, name+": "+err.Error())
		case s.CachedInfo().Cluster == nil:
			parts = append(parts, name+" on ?")
		default:
			parts = append(parts, name+" on "+s.CachedInfo().Cluster.Leader)
		}
	}
	return "streams: " + strings.Join(parts, ", ")
}

// runGlooCluster measures gloo's ring: one gloo.py rank per worker node, rank 0's node the
// rendezvous.
func runGlooCluster(ctx context.Context, env *clusterEnv) (_ clusterRun, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	specs := workerNodes(env.mbit)
	lab, err := newNetLab(ctx, specs, env.cc)
	if err != nil {
		return clusterRun{}, err
	}
	defer func() { err = errors.Join(err, lab.close()) }()
	w := env.w
	var ranks []*heldProc
	for i, n := range lab.nodes {
		cmd := n.command(ctx, env.python, env.script, "--rank", strconv.Itoa(i), "--world", strconv.Itoa(w.Ranks),
			"--master", lab.nodes[0].Addr, "--port", strconv.Itoa(clusterGlooPort), "--elements", strconv.Itoa(w.Elements),
			"--lr", strconv.FormatFloat(learningRate, 'g', -1, 64), "--warmup", strconv.Itoa(env.plan.warmup),
			"--steps", strconv.Itoa(env.plan.steps), "--mode", "throughput", "--hold")
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1", "GLOO_SOCKET_IFNAME="+netLabIf)
		ranks = append(ranks, &heldProc{name: "gloo " + n.Name, cmd: cmd})
	}
	m, err := measureHeld(ctx, lab, ranks, nil, env.plan.steps)
	if err != nil {
		return clusterRun{}, err
	}
	run := clusterRun{bytes: m.bytes, cpu: m.cpu, links: m.links, tcp: m.tcp}
	reps := make([]glooRank, len(m.outputs))
	var slowest float64
	for i, out := range m.outputs {
		if err := json.Unmarshal(out, &reps[i]); err != nil {
			return run, fmt.Errorf("gloo rank %d printed %q: %w", i, tail(out, 300), err)
		}
		if reps[i].Sha256 != reps[0].Sha256 {
			return run, fmt.Errorf("gloo rank %d ended with parameters %.12s, rank 0 with %.12s", i, reps[i].Sha256, reps[0].Sha256)
		}
		slowest = max(slowest, reps[i].ElapsedS)
		run.runs = append(run.runs, float64(reps[i].Steps)/reps[i].ElapsedS)
	}
	if err := checkGlooSample(reps[0], w); err != nil {
		return run, err
	}
	run.stepsPerSec = float64(env.plan.steps) / slowest
	run.sum, run.torch = reps[0].Sha256, reps[0].Torch
	return run, nil
}

// heldProc is a process that prints holdReady after its warm-up, waits for a line on its
// standard input, runs its timed steps and prints its report as its last line.
type heldProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr lockedBuffer
	log    io.Writer     // if not nil, gets what it writes to standard error too
	ready  chan struct{} // closed when it printed holdReady
	done   chan struct{} // closed when it ended
	last   []byte        // its last line but holdReady: read after done
}

// lockedBuffer is a bytes.Buffer that a process writes while the bench may read it.
type lockedBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// tail is the last n bytes written, trimmed.
func (b *lockedBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(tail(b.buf.Bytes(), n))
}

// tracked is a process of the service that runs through a measurement.
type tracked struct {
	name string
	pid  int
	cpu0 time.Duration
}

// heldMeasure is what a measurement of held processes gives: per step, every node's link bytes
// and every process's CPU (the held ones', then the tracked ones'); and each held process's report.
type heldMeasure struct {
	bytes   map[string]linkBytes
	tcp     tcpCounts // every node's, through the timed steps
	cpu     []procCPU
	outputs [][]byte
	links   linkTrace // the links through the timed steps
}

// measureHeld starts the held processes, waits until every one is ready, reads the counters,
// releases them, waits for them to end and reads the counters again. The first process that
// fails ends the others (they would wait for it in lockstep) and the measurement, with its error.
func measureHeld(ctx context.Context, lab *netLab, held []*heldProc, others []*tracked, steps int) (_ heldMeasure, err error) {
	failed := newTripwire()
	var wg sync.WaitGroup
	defer wg.Wait()
	killAll := func() {
		for _, p := range held {
			if p.cmd.Process != nil {
				_ = p.cmd.Process.Kill()
			}
		}
	}
	defer func() {
		if err != nil {
			killAll()
		}
	}()
	for _, p := range held {
		if err := p.start(&wg, func(err error) { failed.trip(err); killAll() }); err != nil {
			return heldMeasure{}, err
		}
	}
	// wait waits for every process's ch, or the first failure.
	wait := func(what string, ch func(*heldProc) <-chan struct{}) error {
		for _, p := range held {
			select {
			case <-ch(p):
			case <-failed.done():
				return failed.failed()
			case <-ctx.Done():
				return fmt.Errorf("%s: %s: %w: %s", p.name, what, ctx.Err(), p.stderr.tail(1500))
			}
		}
		return nil
	}
	if err := wait("warm-up", func(p *heldProc) <-chan struct{} { return p.ready }); err != nil {
		return heldMeasure{}, err
	}
	counters := func() (map[string]linkBytes, error) {
		m := map[string]linkBytes{}
		for _, n := range lab.nodes {
			b, err := n.counters(ctx)
			if err != nil {
				return nil, err
			}
			m[n.Name] = b
		}
		return m, nil
	}
	tcp := func() (tcpCounts, error) {
		var sum tcpCounts
		for _, n := range lab.nodes {
			c, err := n.tcpCounters(ctx)
			if err != nil {
				return tcpCounts{}, err
			}
			sum = sum.add(c)
		}
		return sum, nil
	}
	c0, err := counters()
	if err != nil {
		return heldMeasure{}, err
	}
	t0, err := tcp()
	if err != nil {
		return heldMeasure{}, err
	}
	cpu0 := make([]time.Duration, len(held))
	for i, p := range held {
		cpu0[i] = childCPU(p.cmd.Process.Pid)
	}
	for _, o := range others {
		o.cpu0 = childCPU(o.pid)
	}
	stopTrace := traceLinks(lab)
	traced := false
	defer func() {
		if !traced {
			_, _ = stopTrace()
		}
	}()
	for _, p := range held {
		if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
			return heldMeasure{}, fmt.Errorf("%s: release: %w", p.name, err)
		}
	}
	if err := wait("timed steps", func(p *heldProc) <-chan struct{} { return p.done }); err != nil {
		return heldMeasure{}, err
	}
	if err := failed.failed(); err != nil { // the last one failed as the others ended
		return heldMeasure{}, err
	}
	traced = true
	links, err := stopTrace()
	if err != nil {
		return heldMeasure{}, fmt.Errorf("the links' trace: %w", err)
	}
	othersCPU := make([]time.Duration, len(others)) // before reading the counters, which this process does
	for i, o := range others {
		othersCPU[i] = childCPU(o.pid) - o.cpu0
	}
	c1, err := counters()
	if err != nil {
		return heldMeasure{}, err
	}
	t1, err := tcp()
	if err != nil {
		return heldMeasure{}, err
	}
	per := time.Duration(steps)
	m := heldMeasure{bytes: map[string]linkBytes{}, links: links, tcp: t1.sub(t0)}
	for name, b := range c1 {
		d := b.sub(c0[name])
		m.bytes[name] = linkBytes{d.rx / uint64(steps), d.tx / uint64(steps)}
	}
	for i, p := range held {
		st := p.cmd.ProcessState
		m.cpu = append(m.cpu, procCPU{p.name, (st.UserTime() + st.SystemTime() - cpu0[i]) / per})
		m.outputs = append(m.outputs, p.last)
	}
	for i, o := range others {
		m.cpu = append(m.cpu, procCPU{o.name, othersCPU[i] / per})
	}
	return m, nil
}

// start starts the process and a goroutine (in wg) that reads its output until it ends; if it
// fails, or ends before it was ready, fail is called with why.
func (p *heldProc) start(wg *sync.WaitGroup, fail func(error)) error {
	p.ready, p.done = make(chan struct{}), make(chan struct{})
	p.cmd.Stderr = &p.stderr
	if p.log != nil {
		p.cmd.Stderr = io.MultiWriter(&p.stderr, p.log)
	}
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	wg.Go(func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		wasReady := false
		for sc.Scan() {
			if sc.Text() == holdReady && !wasReady {
				wasReady = true
				close(p.ready)
				continue
			}
			p.last = slices.Clone(sc.Bytes())
		}
		err := p.cmd.Wait()
		switch {
		case err != nil && !wasReady:
			fail(fmt.Errorf("%s: ended during its warm-up: %v: %s", p.name, err, p.stderr.tail(1500)))
		case err != nil:
			fail(fmt.Errorf("%s: %v: %s", p.name, err, p.stderr.tail(1500)))
		case !wasReady:
			fail(fmt.Errorf("%s: ended without its warm-up: %s", p.name, p.stderr.tail(1500)))
		}
	})
	return nil
}

// findNATSServer finds a nats-server binary for the nodes: FANIN_NATS_SERVER, else nats-server on
// PATH, else the version fanin embeds built once with `go install` into the user's cache
// directory. It returns its path and what it says of its version.
func findNATSServer(ctx context.Context, dir string) (path, version string, err error) {
	path = os.Getenv("FANIN_NATS_SERVER")
	if path == "" {
		path, _ = exec.LookPath("nats-server")
	}
	if path == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			cache = dir
		}
		bin := filepath.Join(cache, "fanin", "nats-server-v"+server.VERSION)
		path = filepath.Join(bin, "nats-server")
		if _, err := os.Stat(path); err != nil {
			install := exec.CommandContext(ctx, "go", "install", "github.com/nats-io/nats-server/v2@v"+server.VERSION)
			install.Dir, install.Env = dir, append(os.Environ(), "GOBIN="+bin)
			if out, err := install.CombinedOutput(); err != nil {
				return "", "", fmt.Errorf("no nats-server (set FANIN_NATS_SERVER or put one on PATH; building v%s with go install failed: %v: %s)", server.VERSION, err, tail(out, 500))
			}
		}
	}
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", "", fmt.Errorf("nats-server %s: %w", path, err)
	}
	return path, strings.TrimPrefix(strings.TrimSpace(string(out)), "nats-server: "), nil
}

// clusterResults are the scenario's rows: per case, steps/s against gloo's median run and the
// bytes per worker node per step against the theory.
func clusterResults(env *clusterEnv, cases []clusterCase, glooRuns, faninRuns []clusterRun) []Result {
	w := env.w
	var gSteps []float64
	for _, g := range glooRuns {
		gSteps = append(gSteps, g.stepsPerSec)
	}
	base := percentileMs(gSteps, 0.5)
	g := glooRuns[len(glooRuns)/2]
	for _, r := range glooRuns {
		if r.stepsPerSec == base {
			g = r
		}
	}
	ring := ringTheory(w)
	setup := fmt.Sprintf("%d worker nodes, each a network namespace with one link to a bridge (in a namespace of its own) capped at %d Mbit/s each way with tc (tbf on both ends), TCP congestion control %s; "+
		"a %.2fM-parameter model (%.1f MB in float32) in shards of %s, %d ranks (one per worker node), sgd; "+
		"fanin: nats-server %s on the nodes (ip netns exec), runtime processes (`fanin %s`), one worker process per worker node (`fanin %s`, one rank), the gateway and an autoscaler placing shards in the bench's process, JetStream memory storage, no security; "+
		"gloo: one gloo.py rank per worker node (torch %s, one thread each); "+
		"%d timed steps after %d warm-up, every process held between the two while the links' counters (/sys/class/net/eth0/statistics in each namespace) and the processes' CPU are read; "+
		"gloo ran before each pair of cases (%d runs: %s steps/s), each case is one run compared with gloo's median run; "+
		"gloo's ring moved %s per worker node per step (in/out; theory 2(n-1)/n S = %.1f MB each way); "+
		"a link's counters include the Ethernet, IP and TCP headers (about 4%% more than the payload at MTU 1500); "+
		"the machine's load average %s at the start, %s at the end",
		clusterWorkers, env.mbit, env.cc, float64(w.Elements)/1e6, float64(w.Elements)*4/1e6, mib(w.ShardSize), w.Ranks,
		env.natsVersion, RuntimeCommand, WorkersCommand, env.torch,
		env.plan.steps, env.plan.warmup, len(glooRuns), nums(gSteps), nodeBytes(g.bytes, "w"), ring/1e6, env.load, loadAverage())
	var out []Result
	for i, c := range cases {
		f := faninRuns[i]
		if f.err != nil {
			out = append(out, Result{Scenario: "cluster", Case: c.name, Metric: "steps/s", Baseline: glooRingBaseline, Goal: c.goal, Setup: setup, Err: f.err.Error()})
			continue
		}
		theory := clusterTheory(c, w)
		notes := fmt.Sprintf("%s; CPU per step, ms: %s (gloo's median run: %s); workers' steps/s %s; the worker nodes' links, both ways, through the timed steps: %s (gloo's median run: %s); TCP on every node through the timed steps: %s (gloo's median run: %s)",
			f.observed, f.cpuList(), g.cpuList(), nums(f.runs), f.linkUseNote(), g.linkUseNote(), f.tcp, g.tcp)
		out = append(out, throughput(Result{
			Scenario: "cluster", Case: c.name, Metric: "steps/s", Baseline: glooRingBaseline,
			Fanin: f.stepsPerSec, Base: base, Goal: c.goal, Setup: setup, Notes: notes,
			FaninCPU: f.totalCPU(), BaseCPU: g.totalCPU(),
		}))
		var measured float64
		for i := range clusterWorkers {
			b := f.bytes[fmt.Sprintf("w%d", i)]
			measured += float64(b.rx+b.tx) / clusterWorkers
		}
		out = append(out, latencyGoal(Result{
			Scenario: "cluster", Case: c.name + ",bytes", Metric: "MB per worker node per step, in + out", Baseline: "theory: " + theory.name,
			Fanin: measured / 1e6, Base: (theory.workerIn + theory.workerOut) / 1e6, Goal: 1.1, Setup: setup,
			Notes: fmt.Sprintf("measured in/out per step: %s; theory: worker node %.1f/%.1f MB%s",
				nodeBytes(f.bytes, ""), theory.workerIn/1e6, theory.workerOut/1e6, theory.serviceNote),
		}))
	}
	return out
}

// nodeBytes lists the nodes' bytes per step in/out, in MB, those whose name starts with prefix.
func nodeBytes(b map[string]linkBytes, prefix string) string {
	var names []string
	for n := range b {
		if strings.HasPrefix(n, prefix) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.1f/%.1f MB", n, float64(b[n].rx)/1e6, float64(b[n].tx)/1e6))
	}
	return strings.Join(parts, ", ")
}
