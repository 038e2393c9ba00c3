package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Config of a run.
type Config struct {
	Quick bool     // small sizes and iterations, for CI: the whole run takes less than a minute
	Only  []string // scenario names to run (see Scenarios); empty runs all
	// Cases, if set, keeps only the cases of the cluster scenario so named (clusterCases): for
	// looking into one case; a report of it leaves the others out.
	Cases []string
	Redis string // path of the redis-server binary; "" looks it up in PATH; without it, or without -tags redis, e2e-redis is skipped
	// CostOut, if set, is where the service-cost scenario writes the simulator's service cost
	// (sim.ServiceCost, JSON: fanin sim --cost).
	CostOut string
	// CostOutDirect, if set, is where it writes the same for the job with direct gradients.
	CostOutDirect string
	// CostOutEmbedded, if set, is where it writes the same for the direct job with a NATS server in
	// each runtime's process.
	CostOutEmbedded string
	// LinkTrace, if set, is a directory where the cluster scenario writes each run's trace of the
	// nodes' link counters through its timed steps (cluster-<case>.tsv, every 10 ms).
	LinkTrace string
	// Logs, if set, is a directory where the cluster scenario keeps each fanin run's logs, in a
	// directory of the run's (cluster-<case>-<time>): every NATS server's, runtime's and worker's,
	// and the gateway's and autoscaler's at info level (control.log).
	Logs string
	// LinkMbit, if set, is the cluster scenario's worker links' rate each way in Mbit/s
	// (clusterMbit otherwise; a service node's is a multiple of it).
	LinkMbit int
	// TCPCC, if set, is the TCP congestion control of the cluster scenario's nodes
	// (clusterTCPCC otherwise).
	TCPCC string
	Log   *slog.Logger
}

func (c Config) tcpCC() string {
	if c.TCPCC != "" {
		return c.TCPCC
	}
	return clusterTCPCC
}

func (c Config) linkMbit() int {
	if c.LinkMbit > 0 {
		return c.LinkMbit
	}
	return clusterMbit
}

// Result is one figure of fanin next to its baseline's, measured in the same run on the same bytes.
type Result struct {
	Scenario string // e.g. "e2e-resnet50"
	Case     string // the parameters, e.g. "N=8,Shard=4MiB"
	Metric   string // what Fanin and Baseline measure, with the unit, e.g. "steps/s"
	Baseline string // what fanin is compared with, e.g. "bare aggregator over core NATS"

	Fanin, Base float64 // the figures, in Metric's unit
	// LowerIsBetter is set for latencies. Ratio is Fanin/Base either way; for a throughput a higher
	// ratio is better, for a latency a lower one.
	LowerIsBetter bool
	Ratio         float64
	// Goal is the ratio the issue asks for, 0 for none: for a throughput a minimum (Ratio >= Goal),
	// for a latency a maximum (Ratio <= Goal).
	Goal float64
	Met  bool

	// CPU per unit of work (one step, or one kernel pass), when measured: the whole process (and
	// redis-server, for e2e-redis) for fanin and for the baseline, and the time fanin's runtimes
	// spent in the aggregation function.
	FaninCPU, BaseCPU, FuncTime time.Duration

	Setup   string // how the scenario ran: the same for all its cases
	Notes   string // what is particular to this case
	Skipped string // why the scenario did not run; the figures are then zero
	Err     string // why the scenario failed; the figures are then zero
}

// String is one line: the figures, the ratio and the goal.
func (r Result) String() string {
	head := r.Scenario
	if r.Case != "" {
		head += " " + r.Case
	}
	switch {
	case r.Skipped != "":
		return head + ": skipped: " + r.Skipped
	case r.Err != "":
		return head + ": FAILED: " + r.Err
	}
	s := fmt.Sprintf("%s: %s fanin %s, baseline %s, ratio %.2fx", head, r.Metric, num(r.Fanin), num(r.Base), r.Ratio)
	if r.LowerIsBetter {
		s += " (lower is better)"
	}
	if r.Goal > 0 {
		s += fmt.Sprintf(", goal %s %.2gx: %s", goalOp(r), r.Goal, yesNo(r.Met))
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "met"
	}
	return "NOT met"
}

// num prints a figure with three significant digits.
func num(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	case v >= 1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// throughput fills the ratio and verdict of a higher-is-better result.
func throughput(r Result) Result {
	if r.Base > 0 {
		r.Ratio = r.Fanin / r.Base
	}
	r.Met = r.Goal == 0 || r.Ratio >= r.Goal
	return r
}

// latency fills the ratio of a lower-is-better result without a goal.
func latency(r Result) Result {
	r.Goal = 0
	return latencyGoal(r)
}

// latencyGoal fills the ratio and verdict of a lower-is-better result: met when Ratio <= Goal, or
// when there is no goal.
func latencyGoal(r Result) Result {
	r.LowerIsBetter = true
	if r.Base > 0 {
		r.Ratio = r.Fanin / r.Base
	}
	r.Met = r.Goal == 0 || (r.Base > 0 && r.Ratio <= r.Goal)
	return r
}

// goalOp is how Ratio compares with Goal when the goal is met.
func goalOp(r Result) string {
	if r.LowerIsBetter {
		return "<="
	}
	return ">="
}

// scenario is one entry of the menu.
type scenario struct {
	name string
	doc  string
	run  func(ctx context.Context, rs *runState) ([]Result, error)
}

var scenarios = []scenario{
	{"kernel", "aggregation kernel (rank-order sum of 8 ranks of 1 MiB, then sgd or adam) vs memory copy of the same bytes; a user-written SGD in WebAssembly vs the built-in sgd kernel", runKernel},
	{"e2e-resnet50", "BSP steps/s of 8 SDK workers on a ResNet-50-size model vs a bare aggregator over core NATS", runE2E},
	{"e2e-secured", "the cost of tenant isolation: BSP steps/s of 8 workers using their job's own NATS account (security on) vs the same fanin open (no security)", runSecured},
	{"e2e-redis", "the same workload vs workers and an aggregator exchanging shards through Redis keys", runRedis},
	{"gloo", "fanin against PyTorch's own all-reduce (gloo, one process per rank) on the same gradients: steps/s at ResNet-50 size with 8 ranks (fanin's gradients float32; bfloat16 on the wire; bfloat16 gradients and parameters) and step p50/p99 of 4 ranks on 1 MiB; and the service's cost, GB of gradient per core-second of the NATS server and runtimes, next to BytePS's published figure", runGloo},
	{"service-cost", "the service's CPU per byte of gradient, by process: the NATS server (with the gateway and an idle autoscaler) in this process, each runtime in a process of its own, 8 ranks at ResNet-50 size in a worker process; what `fanin sim` charges the service with (--cost-out writes it)", runServiceCost},
	{"broker-copies", "the NATS server's CPU per gradient byte, the server in a process of its own, for three ways a gradient reaches a bare aggregator: stored in a stream and pulled by a consumer (fanin's stored path), stored for replay only and received by a core subscription, and a core NATS request whose reply is the receipt (nothing stored); ResNet-50 size, 8 ranks, alternating", runBrokerCopies},
	{"latency-small", "step latency of 4 ranks on 1 MiB of parameters vs a 1 MiB NATS request-reply, the bare aggregator, and the bare aggregator on fanin's JetStream path", runLatency},
	{"elastic", "elastic jobs on the demo model: the time to absorb a lost worker, and a slow worker (2x) or jittery workers under ssp s=2 and asp vs bsp: steps/s and test accuracy after a fixed wall time", runElastic},
	{"cluster", "a NIC-bound cluster emulated with network namespaces: 4 worker nodes with links capped at 100 Mbit/s each way (tc; --link-mbit sets another rate), fanin's service on a node of its own (with a worker's bandwidth, and with 4x) or spread over the worker nodes (a NATS cluster member and a runtime on each), float32 and bfloat16 gradients and parameters, against PyTorch gloo's ring all-reduce on the same links: steps/s, bytes per node per step from the links' counters next to the theory, and the CPU of every process (needs root)", runCluster},
	{"python", "a Python worker process (numpy, and fanin.torch) vs a Go SDK worker process: steps/s at ResNet-50 size with 8 ranks, and the p50 step of 4 ranks on 1 MiB", runPython},
}

// Scenarios lists the scenario names, in the order Run runs them.
func Scenarios() []string {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.name
	}
	return names
}

// runState is what the scenarios of one Run share.
type runState struct {
	cfg      Config
	log      *slog.Logger // the bench's own events
	stackLog *slog.Logger // what the in-process stacks say: warnings and errors only
	progress io.Writer
	grads    map[int][][]float32 // per model size: the ranks' gradients, made once
}

func (rs *runState) printf(format string, args ...any) {
	fmt.Fprintf(rs.progress, format+"\n", args...)
}

// Run runs the configured scenarios one after another, each on fresh in-process servers, and
// returns their results. A scenario that fails is reported as a Result with Err, the others still
// run, and the error names every failure. A scenario whose baseline cannot run here (no
// redis-server) is reported with Skipped. Progress lines go to progress (may be nil).
func Run(ctx context.Context, cfg Config, progress io.Writer) ([]Result, error) {
	for _, name := range cfg.Only {
		if !slices.Contains(Scenarios(), name) {
			return nil, fmt.Errorf("bench: unknown scenario %q (known: %s)", name, strings.Join(Scenarios(), ", "))
		}
	}
	rs := newRunState(cfg, progress)
	var results []Result
	var errs []error
	for _, sc := range scenarios {
		if len(cfg.Only) > 0 && !slices.Contains(cfg.Only, sc.name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return results, errors.Join(append(errs, err)...)
		}
		rs.printf("== %s: %s", sc.name, sc.doc)
		start := time.Now()
		res, err := sc.run(ctx, rs)
		for _, r := range res {
			rs.printf("   %s", r)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("scenario %s: %w", sc.name, err))
			res = append(res, Result{Scenario: sc.name, Err: err.Error()})
			rs.printf("   FAILED: %v", err)
		}
		rs.printf("   (%s in %.1fs)", sc.name, time.Since(start).Seconds())
		results = append(results, res...)
	}
	return results, errors.Join(errs...)
}

func newRunState(cfg Config, progress io.Writer) *runState {
	if progress == nil {
		progress = io.Discard
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &runState{
		cfg: cfg, log: log, progress: progress,
		stackLog: slog.New(minLevel{log.Handler(), slog.LevelWarn}),
		grads:    map[int][][]float32{},
	}
}

// minLevel drops records below its level.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level && h.Handler.Enabled(ctx, l)
}
func (h minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(as), h.level}
}
func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.level}
}
