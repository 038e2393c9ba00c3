package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	goruntime "runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/runtime"
	"github.com/fanin-ml/fanin/sim"
)

// The service-cost scenario measures what the simulator charges the service with (sim.ServiceCost):
// the CPU each part of the service spends per byte, by process. This process runs the NATS server
// (and the gateway and an autoscaler that only places shards, both idle while the job steps); each
// runtime is a process of its own (RuntimeCommand), and the job's ranks run in a worker process
// (WorkersCommand), so that the CPU of the broker, of the runtimes and of the workers are told
// apart by their processes' CPU times.
const serviceCostBaseline = bytepsBaseline

// RuntimeCommand is the fanin command of a runtime process of the service-cost scenario (cmd/fanin's
// hidden bench-runtime); RuntimeEnv is set in its environment, so that a test binary standing in for
// fanin (TestMain) runs RunRuntime when it sees it.
const (
	RuntimeCommand = "bench-runtime"
	RuntimeEnv     = "FANIN_BENCH_RUNTIME"
)

// RuntimeConfig is a runtime process of the service-cost scenario.
type RuntimeConfig struct {
	URL, ID string
	Cores   int
	// NIC is the node's link rate each way in bytes per second (runtime.WithNICBandwidth): the
	// autoscaler places by bytes when runtimes report it. 0: unknown, not a limit.
	NIC float64
	// NATSConfig, if set, is a nats-server configuration file: the process runs that server
	// and connects the runtime to it in-process (`fanin runtime --nats-config`), URL unused.
	NATSConfig string
	// Log, if set, has the runtime log its events at info level to standard error (the cluster
	// scenario keeps them with Config.Logs); otherwise it logs nothing.
	Log bool
}

// RuntimeSample is what a runtime process prints, one JSON line each time it reads a line: its
// counters so far.
type RuntimeSample struct {
	CPU      time.Duration `json:"cpu_ns"`        // the process's CPU time, user and system
	WorkTime time.Duration `json:"work_ns"`       // its shards' fold and function (runtime.StatsSnapshot.WorkTime)
	BytesIn  int64         `json:"bytes_in"`      // gradient bytes it accepted
	Shards   int           `json:"shards"`        // shards it serves now
	Rejected int64         `json:"rejected_msgs"` // inputs it refused
}

// ParseRuntime reads a runtime process's flags (those of `fanin bench-runtime`).
func ParseRuntime(args []string) (RuntimeConfig, error) {
	var cfg RuntimeConfig
	f := flag.NewFlagSet(RuntimeCommand, flag.ContinueOnError)
	f.StringVar(&cfg.URL, "nats", "", "NATS URL")
	f.StringVar(&cfg.ID, "id", "", "runtime id")
	f.IntVar(&cfg.Cores, "cores", 0, "cores the runtime reports and uses (default GOMAXPROCS)")
	f.Float64Var(&cfg.NIC, "nic-bytes", 0, "the node's link rate each way, bytes per second (0: unknown)")
	f.StringVar(&cfg.NATSConfig, "nats-config", "", "run the NATS server of this configuration file in this process and connect to it in-process")
	f.BoolVar(&cfg.Log, "log", false, "log the runtime's events at info level to standard error")
	if err := f.Parse(args); err != nil {
		return cfg, err
	}
	if (cfg.URL == "") == (cfg.NATSConfig == "") || cfg.ID == "" || cfg.Cores < 0 || cfg.NIC < 0 {
		return cfg, fmt.Errorf("%s: one of --nats and --nats-config, and --id, are required; --cores and --nic-bytes must be >= 0", RuntimeCommand)
	}
	return cfg, nil
}

// RunRuntime runs one runtime until in ends (the bench closes the process's stdin) or ctx is done;
// for every line it reads from in it writes a RuntimeSample line to out.
func RunRuntime(ctx context.Context, cfg RuntimeConfig, in io.Reader, out io.Writer) error {
	nopts := []nats.Option{nats.Name("fanin-runtime-" + cfg.ID), nats.MaxReconnects(-1)}
	if cfg.NATSConfig != "" {
		ns, err := embed.FromFile(cfg.NATSConfig)
		if err != nil {
			return err
		}
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}()
		cfg.URL = ns.ClientURL()
		nopts = append(nopts, nats.InProcessServer(ns))
	}
	nc, err := nats.Connect(cfg.URL, nopts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	if cfg.NATSConfig != "" {
		// A cluster's JetStream answers once its servers elected a meta leader: until then the
		// runtime would size its buckets' replicas for a server alone.
		if err := waitFor(ctx, time.Minute, func() error { return jetStreamAnswers(ctx, nc) }); err != nil {
			return fmt.Errorf("JetStream of %s: %w", cfg.NATSConfig, err)
		}
	}
	log := slog.New(slog.DiscardHandler)
	if cfg.Log {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	opts := []runtime.Option{runtime.WithID(cfg.ID), runtime.WithLogger(log), runtime.WithProcessCPU(runtime.ProcessCPU)}
	if cfg.Cores > 0 {
		opts = append(opts, runtime.WithCores(cfg.Cores))
	}
	if cfg.NIC > 0 {
		opts = append(opts, runtime.WithNICBandwidth(cfg.NIC))
	}
	rt, err := runtime.New(nc, opts...)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }() // owned here: cancelled and waited for below
	lines := make(chan struct{})
	go func() { // owned by the process: it ends when stdin does
		defer close(lines)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			lines <- struct{}{}
		}
	}()
	enc := json.NewEncoder(out)
	for {
		select {
		case <-ctx.Done():
			return <-done
		case err := <-done:
			return err
		case _, ok := <-lines:
			if !ok {
				cancel()
				return <-done
			}
			st := rt.Stats()
			var rejected int64
			for _, n := range st.Rejects {
				rejected += n
			}
			if err := enc.Encode(RuntimeSample{CPU: processCPU(), WorkTime: st.WorkTime, BytesIn: st.BytesIn,
				Shards: len(rt.Shards()), Rejected: rejected}); err != nil {
				cancel()
				<-done
				return err
			}
		}
	}
}

// runtimeProc is a runtime process the scenario started and talks to.
type runtimeProc struct {
	id     string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  *bufio.Scanner
	stderr bytes.Buffer
}

func startRuntimeProc(ctx context.Context, exe, url, id string, cores int) (*runtimeProc, error) {
	return startRuntimeCmd(id, command(ctx, exe, runtimeArgs(url, id, cores)...), nil)
}

// runtimeArgs are the arguments of a runtime process after the fanin binary's name.
func runtimeArgs(url, id string, cores int) []string {
	return []string{RuntimeCommand, "--nats", url, "--id", id, "--cores", strconv.Itoa(cores)}
}

// startRuntimeCmd starts cmd, a runtime process of id's (runtimeArgs), however it is run; what it
// writes to standard error also goes to log, if not nil.
func startRuntimeCmd(id string, cmd *exec.Cmd, log io.Writer) (*runtimeProc, error) {
	p := &runtimeProc{id: id, cmd: cmd}
	p.cmd.Env = append(os.Environ(), RuntimeEnv+"=1")
	p.cmd.Stderr = &p.stderr
	if log != nil {
		p.cmd.Stderr = io.MultiWriter(&p.stderr, log)
	}
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.lines = bufio.NewScanner(stdout)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("runtime %s: %w", id, err)
	}
	return p, nil
}

// sample asks the process for its counters.
func (p *runtimeProc) sample() (RuntimeSample, error) {
	var s RuntimeSample
	if _, err := io.WriteString(p.stdin, "sample\n"); err != nil {
		return s, fmt.Errorf("runtime %s: %w: %s", p.id, err, tail(p.stderr.Bytes(), 1000))
	}
	if !p.lines.Scan() {
		return s, fmt.Errorf("runtime %s ended: %v: %s", p.id, p.lines.Err(), tail(p.stderr.Bytes(), 1000))
	}
	if err := json.Unmarshal(p.lines.Bytes(), &s); err != nil {
		return s, fmt.Errorf("runtime %s printed %q: %w", p.id, p.lines.Text(), err)
	}
	return s, nil
}

// stop ends the process: its stdin closes, it stops its runtime and exits.
func (p *runtimeProc) stop() error {
	_ = p.stdin.Close()
	err := p.cmd.Wait()
	if err != nil {
		return fmt.Errorf("runtime %s: %w: %s", p.id, err, tail(p.stderr.Bytes(), 1000))
	}
	return nil
}

// costRun is one measurement: the counters' differences over the worker process's run.
type costRun struct {
	steps                       int     // warm-up included
	load                        string  // the machine's load average before and after
	gradBytes                   float64 // summed in the steps
	accepted                    float64 // accepted by the runtimes, deliveries again included
	brokerIn, brokerOut         float64 // bytes, as the NATS server counts them
	brokerCPU, runtimeCPU, work time.Duration
	stepsPerSec                 float64
}

// serviceCostRun brings up the service as processes (see the scenario) for w, runs one worker
// process of warmup+steps steps against it, and returns what each process spent meanwhile. With
// embedded, each runtime process runs a NATS server of its own (`fanin runtime --nats-config`),
// the servers one cluster, and the workers connect to the first one's.
func serviceCostRun(ctx context.Context, rs *runState, w workload, embedded bool, warmup, steps int) (costRun, error) {
	dir, err := os.MkdirTemp("", "fanin-bench-cost-")
	if err != nil {
		return costRun{}, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		return costRun{}, err
	}
	var procs []*runtimeProc
	defer func() {
		for _, p := range procs {
			_ = p.stop()
		}
	}()
	var url string
	// brokerBytes reads the bytes in and out that every NATS server counted.
	var brokerBytes func() (in, out float64, err error)
	if embedded {
		monitors, err := startEmbeddedRuntimes(ctx, exe, dir, w.Runtimes, &procs)
		if err != nil {
			return costRun{}, err
		}
		url = monitors[0].client
		brokerBytes = func() (in, out float64, err error) {
			for _, m := range monitors {
				v, err := m.varz(ctx)
				if err != nil {
					return 0, 0, err
				}
				in, out = in+float64(v.InBytes), out+float64(v.OutBytes)
			}
			return in, out, nil
		}
	} else {
		ns, err := embed.Start(embed.Config{Port: -1, StoreDir: dir})
		if err != nil {
			return costRun{}, err
		}
		defer ns.Shutdown()
		url = ns.ClientURL()
		brokerBytes = func() (in, out float64, err error) {
			v, err := ns.Varz(nil)
			if err != nil {
				return 0, 0, err
			}
			return float64(v.InBytes), float64(v.OutBytes), nil
		}
	}
	cp, err := startControlPlane(ctx, rs, func(name string) (*nats.Conn, error) {
		return nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1))
	}, w.Runtimes, nil)
	if err != nil {
		return costRun{}, err
	}
	defer cp.close()
	gw := cp.gw

	for i := len(procs); i < w.Runtimes; i++ {
		p, err := startRuntimeProc(ctx, exe, url, fmt.Sprintf("rt-%d", i), runtimeCores)
		if err != nil {
			return costRun{}, err
		}
		procs = append(procs, p)
	}
	if err := cp.waitRuntimes(ctx, w.Runtimes); err != nil {
		return costRun{}, err
	}
	created, err := gw.SubmitJob(ctx, w.spec("bench"))
	if err != nil {
		return costRun{}, fmt.Errorf("create job: %w", err)
	}

	samples := func() ([]RuntimeSample, error) {
		var out []RuntimeSample
		for _, p := range procs {
			s, err := p.sample()
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	}
	rt0, err := samples()
	if err != nil {
		return costRun{}, err
	}
	in0, out0, err := brokerBytes()
	if err != nil {
		return costRun{}, err
	}
	load0 := loadAverage()
	cpu0 := processCPU()
	cmd := command(ctx, exe, WorkersCommand, "--nats", url, "--job", created.Spec.ID,
		"--ranks", strconv.Itoa(w.Ranks), "--warmup", strconv.Itoa(warmup), "--steps", strconv.Itoa(steps))
	cmd.Env = append(os.Environ(), WorkersEnv+"=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return costRun{}, fmt.Errorf("workers: %v: %s", err, tail(errOut.Bytes(), 2000))
	}
	brokerCPU := processCPU() - cpu0
	in1, out1, err := brokerBytes()
	if err != nil {
		return costRun{}, err
	}
	rt1, err := samples()
	if err != nil {
		return costRun{}, err
	}
	var rep WorkersReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return costRun{}, fmt.Errorf("workers printed %q: %w", tail(out.Bytes(), 500), err)
	}
	run := costRun{steps: warmup + steps, brokerCPU: brokerCPU, stepsPerSec: rep.StepsPerSec, load: load0 + " -> " + loadAverage(),
		brokerIn: in1 - in0, brokerOut: out1 - out0}
	for i := range procs {
		run.runtimeCPU += rt1[i].CPU - rt0[i].CPU
		run.work += rt1[i].WorkTime - rt0[i].WorkTime
		run.accepted += float64(rt1[i].BytesIn - rt0[i].BytesIn)
		if n := rt1[i].Rejected - rt0[i].Rejected; n > 0 {
			return run, fmt.Errorf("runtime %s refused %d inputs during the run", procs[i].id, n)
		}
	}
	run.gradBytes = float64(run.steps) * float64(w.Ranks) * 4 * float64(w.Elements)
	if run.accepted < run.gradBytes {
		return run, fmt.Errorf("the runtimes accepted %.0f gradient bytes, want at least %.0f (%d steps of %d ranks)", run.accepted, run.gradBytes, run.steps, w.Ranks)
	}
	return run, nil
}

// controlPlane is the gateway and an autoscaler that places shards on the runtimes there are (no
// pool driver, as `fanin autoscaler --driver none`), in this process: idle while a job steps.
type controlPlane struct {
	gw    *gateway.Server
	close func()
}

// startControlPlane starts a control plane over connections made by conn, its pool policy fixed
// at runtimes runtimes.
//
// log, if not nil, is the gateway's and autoscaler's logger; the bench's warnings otherwise.
func startControlPlane(ctx context.Context, rs *runState, conn func(name string) (*nats.Conn, error), runtimes int, log *slog.Logger) (_ *controlPlane, err error) {
	log = cmp.Or(log, rs.stackLog)
	var closers []func()
	cp := &controlPlane{close: func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}}
	defer func() {
		if err != nil {
			cp.close()
		}
	}()
	gwConn, err := conn("fanin-gateway")
	if err != nil {
		return nil, err
	}
	closers = append(closers, gwConn.Close)
	pol := autoscaler.DefaultPolicy()
	pol.MinRuntimes, pol.MaxRuntimes = runtimes, runtimes
	if cp.gw, err = gateway.New(ctx, gwConn, gateway.WithLogger(log), gateway.WithDefaultPolicy(pol)); err != nil {
		return nil, err
	}
	closers = append(closers, cp.gw.Close)
	asConn, err := conn("fanin-autoscaler")
	if err != nil {
		return nil, err
	}
	closers = append(closers, asConn.Close)
	as, err := autoscaler.NewController(asConn, nil, autoscaler.WithControllerLogger(log), autoscaler.WithPolicy(pol), autoscaler.WithInterval(250*time.Millisecond))
	if err != nil {
		return nil, err
	}
	asCtx, stopAS := context.WithCancel(ctx)
	asDone := make(chan struct{})
	go func() { defer close(asDone); _ = as.Run(asCtx) }() // owned by the control plane: stopped and waited for by close
	closers = append(closers, func() { stopAS(); <-asDone })
	return cp, nil
}

// waitRuntimes waits until n runtimes have registered and sent a load report: a job created
// before a runtime reports its node and NIC is placed without it.
func (cp *controlPlane) waitRuntimes(ctx context.Context, n int) error {
	return waitFor(ctx, 30*time.Second, func() error {
		pool, err := cp.gw.Pool(ctx)
		if err != nil {
			return err
		}
		reported := 0
		for _, rt := range pool.Runtimes {
			if rt.Reported != nil {
				reported++
			}
		}
		if len(pool.Runtimes) < n || reported < n {
			return fmt.Errorf("%d of %d runtimes registered, %d reported", len(pool.Runtimes), n, reported)
		}
		return nil
	})
}

// runtimeCores is the cores each runtime process of the scenario uses and reports.
const runtimeCores = 2

// waitFor polls cond every 20 ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %v: %w", timeout, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func runServiceCost(ctx context.Context, rs *runState) ([]Result, error) {
	n, model := rs.e2eElements()
	p := rs.e2ePlan()
	w := workload{Ranks: 8, Elements: n, ShardSize: securedShardSize, Runtimes: e2eRuntimes}
	wd := w
	wd.Gradients = job.GradientsDirect
	// One runtime holding the NATS server that the workers connect to: a service node whose
	// server and runtime are one process. (Three such runtimes, their servers one cluster and the
	// workers on one of them, cost more than wd: two thirds of the gradients cross a route, one
	// TCP hop more than wd's, and the cluster replicates fanin's buckets.)
	we := wd
	we.Runtimes = 1
	// The three modes, alternating: stored and direct gradients with runtime processes connected
	// to this process's NATS server, and direct with a NATS server in each runtime's process.
	modes := []struct {
		w        workload
		embedded bool
		runs     []costRun
	}{{w: w}, {w: wd}, {w: we, embedded: true}}
	for i := range p.reps {
		for k := range modes {
			x := &modes[k]
			name := x.w.name() + map[bool]string{true: ",embedded"}[x.embedded]
			rs.printf("   service-cost %s run %d/%d ...", name, i+1, p.reps)
			r, err := serviceCostRun(ctx, rs, x.w, x.embedded, p.warmup, p.steps)
			if err != nil {
				return nil, fmt.Errorf("service-cost %s: %w", name, err)
			}
			rs.printf("   service-cost %s: broker %.1f s, runtimes %.1f s (work %.1f s) of CPU for %.2f GB of gradient, %.3f steps/s",
				name, r.brokerCPU.Seconds(), r.runtimeCPU.Seconds(), r.work.Seconds(), r.gradBytes/1e9, r.stepsPerSec)
			x.runs = append(x.runs, r)
		}
	}
	out, m, err := costRows(rs, w, false, p, model, modes[0].runs)
	if err != nil {
		return out, err
	}
	dout, d, err := costRows(rs, wd, false, p, model, modes[1].runs)
	out = append(out, dout...)
	if err != nil {
		return out, err
	}
	eout, e, err := costRows(rs, we, true, p, model, modes[2].runs)
	out = append(out, eout...)
	if err != nil {
		return out, err
	}
	whole := func(r costRun) float64 { return r.gradBytes / 1e9 / (r.brokerCPU + r.runtimeCPU).Seconds() }
	out = append(out, throughput(Result{Scenario: "service-cost", Case: "whole service, direct vs stored," + w.name(), Metric: "GB of gradient per core-second",
		Baseline: storedBaseline, Fanin: whole(d), Base: whole(m), Setup: out[0].Setup,
		Notes: fmt.Sprintf("the medians of each mode's runs; NATS server alone: %.3g (direct) vs %.3g (stored) GB per core-second; steps/s %.3f vs %.3f",
			d.gradBytes/1e9/d.brokerCPU.Seconds(), m.gradBytes/1e9/m.brokerCPU.Seconds(), d.stepsPerSec, m.stepsPerSec)}))
	out = append(out, throughput(Result{Scenario: "service-cost", Case: "whole service, embedded vs not," + wd.name(), Metric: "GB of gradient per core-second",
		Baseline: fmt.Sprintf("the same direct job, %d runtime processes on TCP to the NATS server", wd.Runtimes), Fanin: whole(e), Base: whole(d), Setup: eout[0].Setup,
		Notes: fmt.Sprintf("the medians of each mode's runs; steps/s %.3f (one runtime with the NATS server in its process) vs %.3f", e.stepsPerSec, d.stepsPerSec)}))
	return out, nil
}

// costRows are the service-cost rows of one workload's runs: the median run by the whole
// service's CPU per byte, which it also returns. The stored workload writes --cost-out, the
// direct one --cost-out-direct, the direct one with embedded servers --cost-out-embedded.
func costRows(rs *runState, w workload, embedded bool, p e2ePlan, model string, runs []costRun) ([]Result, costRun, error) {
	// The median run by the whole service's CPU per byte.
	slices.SortFunc(runs, func(a, b costRun) int {
		return cmp.Compare((a.brokerCPU+a.runtimeCPU).Seconds()/a.gradBytes, (b.brokerCPU+b.runtimeCPU).Seconds()/b.gradBytes)
	})
	m := runs[len(runs)/2]
	gb := func(cpu time.Duration) float64 { return m.gradBytes / 1e9 / cpu.Seconds() }
	var all []string
	for _, r := range runs {
		again := ""
		if r.accepted > r.gradBytes {
			again = fmt.Sprintf("; %.0f MB delivered again", (r.accepted-r.gradBytes)/1e6)
		}
		all = append(all, fmt.Sprintf("%s (broker %.1f s, runtimes %.1f s; load average %s%s)", num(r.gradBytes/1e9/(r.brokerCPU+r.runtimeCPU).Seconds()), r.brokerCPU.Seconds(), r.runtimeCPU.Seconds(), r.load, again))
	}
	setup := fmt.Sprintf("%s, %d ranks, sgd, shards of %s, JetStream memory storage; this process runs the NATS server, the gateway and an autoscaler placing shards (no pool driver); %d runtime processes (`fanin %s`, %d cores each) and one worker process holding the ranks; CPU is each process's user and system time over the worker process's run (%d warm-up and %d timed steps), the NATS server's bytes in and out are its own counters; the median of %d runs by the whole service's CPU per byte; gradients stored and direct alternating",
		model, w.Ranks, mib(w.ShardSize), w.Runtimes, RuntimeCommand, runtimeCores, p.warmup, p.steps, p.reps)
	name := w.name()
	if embedded {
		name += ",embedded"
		setup = fmt.Sprintf("%s, %d ranks, sgd, shards of %s, JetStream memory storage; %d runtime process (`fanin %s --nats-config`, %d cores) running the NATS server in its process and connected to it in-process, the worker process connected to that server; this process runs the gateway and an autoscaler placing shards, idle while the job steps; CPU is each process's user and system time over the worker process's run (%d warm-up and %d timed steps), the servers' bytes in and out their own counters, summed; the median of %d runs by the whole service's CPU per byte",
			model, w.Ranks, mib(w.ShardSize), w.Runtimes, RuntimeCommand, runtimeCores, p.warmup, p.steps, p.reps)
	}
	notes := "every run, whole service: " + strings.Join(all, ", ")
	row := func(part string, cpu time.Duration, note string) Result {
		return throughput(Result{Scenario: "service-cost", Case: part + "," + name, Metric: "GB of gradient per core-second",
			Baseline: serviceCostBaseline, Fanin: gb(cpu), Base: bytepsGBPerCoreSecond, Setup: setup, Notes: note})
	}
	var out []Result
	dst := rs.cfg.CostOut
	switch {
	case embedded:
		out = []Result{
			row("whole service", m.brokerCPU+m.runtimeCPU, notes),
			row("runtime with the NATS server", m.runtimeCPU, fmt.Sprintf("the process's whole CPU: %.3g ns per gradient byte; the server counted %.2f GB in, %.2f GB out",
				1e9*m.runtimeCPU.Seconds()/m.gradBytes, m.brokerIn/1e9, m.brokerOut/1e9)),
			row("runtimes' work", m.work, "fold and function (what the runtimes report as a shard's Work): the kernels alone"),
		}
		dst = rs.cfg.CostOutEmbedded
	default:
		out = []Result{
			row("whole service", m.brokerCPU+m.runtimeCPU, notes),
			row("NATS server", m.brokerCPU, fmt.Sprintf("with the gateway and the autoscaler, idle while the job steps: %.3g ns per byte it counted in or out (%.2f GB in, %.2f GB out)",
				1e9*m.brokerCPU.Seconds()/(m.brokerIn+m.brokerOut), m.brokerIn/1e9, m.brokerOut/1e9)),
			row("runtimes", m.runtimeCPU, fmt.Sprintf("the processes' whole CPU: %.3g ns per gradient byte", 1e9*m.runtimeCPU.Seconds()/m.gradBytes)),
			row("runtimes' work", m.work, "fold and function (what the runtimes report as a shard's Work): the kernels alone"),
		}
		if w.Gradients != "" {
			dst = rs.cfg.CostOutDirect
		}
	}
	if dst != "" {
		c := serviceCost(m, w, p, model)
		if embedded {
			c.Source += ", one runtime with the NATS server in its process (--nats-config)"
			c.Notes = "The runtime process ran the NATS server the workers connected to: runtime_cpu_s_per_byte is its whole CPU, the server's included; " +
				"the broker figures are this process's alone, the gateway and an autoscaler, idle while the job stepped. Simulate it with --broker in-runtimes: the broker is in the runtimes and grows with the pool. " +
				"All are per gradient byte summed in the steps."
		}
		if err := os.WriteFile(dst, c.MarshalIndent(), 0o644); err != nil {
			return out, m, fmt.Errorf("service-cost: %w", err)
		}
		rs.printf("   wrote %s", dst)
	}
	return out, m, nil
}

// serviceCost is the simulator's input from a run. The NATS server's CPU is charged to the bytes
// of the simulator's traffic model (each rank's gradient in and out, the parameters in once and
// out to every rank), so that the simulator charges this job exactly the CPU measured: the
// server's other traffic (gradients delivered again, the workers' first parameters,
// acknowledgements) is in it. It is not split between bytes in and bytes out (one process does
// both): each is charged the same.
func serviceCost(m costRun, w workload, p e2ePlan, model string) sim.ServiceCost {
	in, out := m.gradBytes*(1+1/float64(w.Ranks)), 2*m.gradBytes
	through := m.brokerCPU.Seconds() / (in + out)
	return sim.ServiceCost{
		Date:                time.Now().UTC().Format("2006-01-02 15:04 MST"),
		Commit:              commit(),
		Machine:             fmt.Sprintf("%s, %d logical CPUs, %s/%s", cpuModel(), goruntime.NumCPU(), goruntime.GOOS, goruntime.GOARCH),
		Source:              fmt.Sprintf("fanin bench --only service-cost: %s, %d ranks, %d runtimes of %d cores, gradients %s, loopback", model, w.Ranks, w.Runtimes, runtimeCores, cmp.Or(w.Gradients, "stored")),
		BrokerCPUPerByteIn:  through,
		BrokerCPUPerByteOut: through,
		RuntimeCPUPerByte:   m.runtimeCPU.Seconds() / m.gradBytes,
		KernelCPUPerByte:    m.work.Seconds() / m.gradBytes,
		Measured: &sim.CostMeasurement{
			Scenario:      fmt.Sprintf("%s, %d warm-up and %d timed steps, the median of %d runs", w.name(), p.warmup, p.steps, p.reps),
			GradientBytes: m.gradBytes, RuntimeBytesIn: m.accepted, BrokerBytesIn: m.brokerIn, BrokerOut: m.brokerOut,
			BrokerCPU: m.brokerCPU.Seconds(), RuntimeCPU: m.runtimeCPU.Seconds(), KernelTime: m.work.Seconds(),
			LoadAverage: m.load,
		},
		Notes: "The NATS server's process also ran the gateway and an autoscaler (idle while the job stepped). Its CPU is charged equally to each byte in and out, " +
			"as one process does both, of the simulator's traffic model (per gradient byte: (ranks+1)/ranks in, 2 out); the bytes it counted itself are above. The runtimes' CPU is their processes' whole CPU; kernel_cpu_s_per_byte is their fold and function time. " +
			"All are per gradient byte summed in the steps: the CPU of gradients delivered again (runtime_bytes_in above gradient_bytes) is in them.",
	}
}

// loadAverage is the machine's 1-minute load average ("" where unknown).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// commit is the code's revision: from the build, else from git in the working directory.
func commit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		var rev, dirty string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "+changes"
				}
			}
		}
		if rev != "" {
			return rev[:min(12, len(rev))] + dirty
		}
	}
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	if err := exec.Command("git", "diff", "--quiet", "HEAD").Run(); errors.As(err, new(*exec.ExitError)) {
		rev += "+changes"
	}
	return rev
}
