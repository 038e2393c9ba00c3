package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// The broker-copies scenario measures what the NATS server spends per gradient byte on each way a
// gradient can reach its aggregator, with nothing of fanin's own code on the path: the bare
// aggregator of natsbase.go, its parameters stored in a JetStream stream in every case (as fanin
// keeps them), its gradients
//
//	stored+pull: published into a stream and delivered by a pull consumer per shard (fanin's path);
//	stored+sub:  published into a stream, kept for replay only, and received by the aggregator's
//	             core subscription on the same subjects (no consumer, no load for delivery);
//	direct:      core NATS requests to the aggregator, whose reply is the receipt (nothing stored).
//
// The server runs in a process of its own (NATSCommand), so that its CPU is its process's.

// NATSCommand is the fanin command of the broker-copies scenario's NATS server process (cmd/fanin's
// hidden bench-nats); NATSEnv is set in its environment, so that a test binary standing in for
// fanin (TestMain) runs RunNATS when it sees it.
const (
	NATSCommand = "bench-nats"
	NATSEnv     = "FANIN_BENCH_NATS"
)

// NATSSample is what the NATS server process prints: its URL first, then, each time it reads a
// line, its CPU and byte counters so far.
type NATSSample struct {
	URL      string        `json:"url,omitempty"`
	CPU      time.Duration `json:"cpu_ns"`
	InBytes  int64         `json:"in_bytes"`
	OutBytes int64         `json:"out_bytes"`
	Slow     int64         `json:"slow_consumers"`
}

// RunNATS runs the baseline NATS server (startBaselineNATS) until in ends, printing a NATSSample
// line at start and for every line it reads.
func RunNATS(in io.Reader, out io.Writer) error {
	dir, err := os.MkdirTemp("", "fanin-bench-nats-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ns, err := startBaselineNATS(dir)
	if err != nil {
		return err
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	enc := json.NewEncoder(out)
	if err := enc.Encode(NATSSample{URL: ns.ClientURL()}); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		v, err := ns.Varz(nil)
		if err != nil {
			return err
		}
		if err := enc.Encode(NATSSample{CPU: processCPU(), InBytes: v.InBytes, OutBytes: v.OutBytes, Slow: ns.NumSlowConsumers()}); err != nil {
			return err
		}
	}
	return sc.Err()
}

// natsProc is a NATS server process the scenario started.
type natsProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  *bufio.Scanner
	stderr bytes.Buffer
	url    string
}

func startNATSProc(ctx context.Context) (*natsProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	p := &natsProc{}
	p.cmd = command(ctx, exe, NATSCommand)
	p.cmd.Env = append(os.Environ(), NATSEnv+"=1")
	p.cmd.Stderr = &p.stderr
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.lines = bufio.NewScanner(stdout)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("NATS server process: %w", err)
	}
	first, err := p.read()
	if err != nil {
		_ = p.stop()
		return nil, err
	}
	p.url = first.URL
	return p, nil
}

func (p *natsProc) read() (NATSSample, error) {
	var s NATSSample
	if !p.lines.Scan() {
		return s, fmt.Errorf("NATS server process ended: %v: %s", p.lines.Err(), tail(p.stderr.Bytes(), 1000))
	}
	if err := json.Unmarshal(p.lines.Bytes(), &s); err != nil {
		return s, fmt.Errorf("NATS server process printed %q: %w", p.lines.Text(), err)
	}
	return s, nil
}

func (p *natsProc) sample() (NATSSample, error) {
	if _, err := io.WriteString(p.stdin, "sample\n"); err != nil {
		return NATSSample{}, fmt.Errorf("NATS server process: %w: %s", err, tail(p.stderr.Bytes(), 1000))
	}
	return p.read()
}

func (p *natsProc) stop() error {
	_ = p.stdin.Close()
	if err := p.cmd.Wait(); err != nil {
		return fmt.Errorf("NATS server process: %w: %s", err, tail(p.stderr.Bytes(), 1000))
	}
	return nil
}

// copiesRun is one measurement of one mode.
type copiesRun struct {
	mode        bareMode
	serverCPU   time.Duration
	gradBytes   float64 // summed in the timed steps
	in, out     float64 // the server's own byte counters over the timed steps
	stepsPerSec float64
	sum         uint32
}

func (r copiesRun) nsPerByte() float64 { return float64(r.serverCPU.Nanoseconds()) / r.gradBytes }

// copiesMeasure runs one mode on a fresh server process: warmup steps, then steps timed, with the
// server's CPU over the timed steps.
func copiesMeasure(ctx context.Context, rs *runState, w workload, mode bareMode, warmup, steps int) (copiesRun, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	np, err := startNATSProc(ctx)
	if err != nil {
		return copiesRun{}, err
	}
	defer func() { _ = np.stop() }()
	sys, err := startBareOn(ctx, w, np.url, mode, nil)
	if err != nil {
		return copiesRun{}, err
	}
	defer sys.close()
	c := newCluster(sys, rs.gradients(w))
	for range warmup {
		if err := c.step(ctx); err != nil {
			return copiesRun{}, err
		}
	}
	s0, err := np.sample()
	if err != nil {
		return copiesRun{}, err
	}
	start := time.Now()
	for range steps {
		if err := c.step(ctx); err != nil {
			return copiesRun{}, err
		}
	}
	el := time.Since(start)
	s1, err := np.sample()
	if err != nil {
		return copiesRun{}, err
	}
	run := copiesRun{mode: mode, serverCPU: s1.CPU - s0.CPU, gradBytes: float64(steps) * float64(w.Ranks) * 4 * float64(w.Elements),
		in: float64(s1.InBytes - s0.InBytes), out: float64(s1.OutBytes - s0.OutBytes), stepsPerSec: float64(steps) / el.Seconds()}
	if run.sum, err = c.agree(); err != nil {
		return run, err
	}
	if err := sys.check(); err != nil {
		return run, fmt.Errorf("invalid run: %w", err)
	}
	if s1.Slow > 0 {
		return run, fmt.Errorf("invalid run: the NATS server cut %d slow consumers", s1.Slow)
	}
	return run, nil
}

// copiesBaseline names what the other modes are compared with.
const copiesBaseline = "gradients stored in a stream and delivered by a pull consumer per shard (fanin's stored path, bare)"

func runBrokerCopies(ctx context.Context, rs *runState) ([]Result, error) {
	n, model := rs.e2eElements()
	p := rs.e2ePlan()
	p.reps = max(p.reps, 3) // alternating is what makes the modes comparable: --quick too
	w := workload{Ranks: 8, Elements: n, ShardSize: securedShardSize, Runtimes: e2eRuntimes}
	modes := []bareMode{bareStoredPull, bareStoredSub, bareDirect}
	runs := map[bareMode][]copiesRun{}
	var sum uint32
	for i := range p.reps {
		for _, mode := range modes { // alternating: one run of each, reps times
			rs.printf("   broker-copies %s %s run %d/%d ...", w.name(), mode, i+1, p.reps)
			r, err := copiesMeasure(ctx, rs, w, mode, p.warmup, p.steps)
			if err != nil {
				return nil, fmt.Errorf("broker-copies %s: %w", mode, err)
			}
			if len(runs) > 0 && r.sum != sum {
				return nil, fmt.Errorf("broker-copies %s: parameters (crc32c %08x) differ from the other modes' (%08x)", mode, r.sum, sum)
			}
			sum = r.sum
			rs.printf("   broker-copies %s: server %.3g ns per gradient byte (%.1f s of CPU), %.3f steps/s, server in %.2f GB, out %.2f GB",
				mode, r.nsPerByte(), r.serverCPU.Seconds(), r.stepsPerSec, r.in/1e9, r.out/1e9)
			runs[mode] = append(runs[mode], r)
		}
	}
	median := func(m bareMode) copiesRun {
		rr := slices.Clone(runs[m])
		slices.SortFunc(rr, func(a, b copiesRun) int { return cmp.Compare(a.nsPerByte(), b.nsPerByte()) })
		return rr[len(rr)/2]
	}
	base := median(bareStoredPull)
	setup := fmt.Sprintf("%s, %d ranks each with its own connection, sgd, shards of %s; the bare aggregator (no fanin code) with its parameters in a JetStream memory stream; the NATS server in a process of its own, its CPU (user and system) over %d timed steps after %d warm-up steps; %d runs of each mode, alternating; the median by CPU per byte",
		model, w.Ranks, mib(w.ShardSize), p.steps, p.warmup, p.reps)
	var out []Result
	for _, m := range modes {
		r := median(m)
		var all []string
		for _, x := range runs[m] {
			all = append(all, fmt.Sprintf("%.3g", x.nsPerByte()))
		}
		out = append(out, latencyGoal(Result{Scenario: "broker-copies", Case: m.String() + "," + w.name(), Metric: "NATS server CPU ns per gradient byte",
			Baseline: copiesBaseline, Fanin: r.nsPerByte(), Base: base.nsPerByte(), Setup: setup,
			Notes: fmt.Sprintf("%.3f steps/s; the server's bytes per gradient byte: %.2f in, %.2f out; every run: %s ns/B", r.stepsPerSec, r.in/r.gradBytes, r.out/r.gradBytes, strings.Join(all, ", "))}))
	}
	return out, nil
}
