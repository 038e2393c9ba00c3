package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/lab/bench"
)

func benchCmd() *cobra.Command {
	var quick bool
	var only, cases, out, redis, cpuProfile, costOut, costOutDirect, costOutEmbedded, linkTrace, logs, tcpCC string
	var linkMbit int
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the data plane against baselines measured in the same run (writes docs/BENCHMARKS.md)",
		Long: "Scenarios: " + strings.Join(bench.Scenarios(), ", ") + `.
Each reports fanin's figure, its baseline's on the same bytes, and the ratio. --out writes the
markdown report with the command that produced it, keeping the file's hand-written last section
("` + bench.HandWritten + `") and, with --only, the sections of the scenarios not run, marked with
the date of the run they come from. The e2e-redis scenario's baseline is built only with -tags redis
(go run -tags redis ./cmd/fanin bench): without it, the scenario is reported as skipped.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := bench.Config{Quick: quick, Redis: redis, CostOut: costOut, CostOutDirect: costOutDirect, CostOutEmbedded: costOutEmbedded, LinkTrace: linkTrace, Logs: logs, LinkMbit: linkMbit, TCPCC: tcpCC, Log: slog.Default()}
			limitBenchMemory()
			if only != "" {
				cfg.Only = strings.Split(only, ",")
			}
			for c := range strings.SplitSeq(cases, ";") {
				if c = strings.TrimSpace(c); c != "" {
					cfg.Cases = append(cfg.Cases, c)
				}
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			// A failed scenario is a row of the report: write it, then report the failure.
			results, runErr := bench.Run(cmd.Context(), cfg, cmd.ErrOrStderr())
			command := "go run ./cmd/fanin " + strings.Join(os.Args[1:], " ")
			if bench.RedisBuiltIn {
				command = "go run -tags redis ./cmd/fanin " + strings.Join(os.Args[1:], " ")
			}
			md := bench.Markdown(results, command, bench.Environment(cfg))
			if out == "" {
				fmt.Fprint(cmd.OutOrStdout(), md)
				return runErr
			}
			if old, err := os.ReadFile(out); err == nil {
				if len(cfg.Only) > 0 { // keep the figures of the scenarios not run, marked as older
					md = bench.KeepScenarios(md, string(old), cfg.Only)
				}
				md = bench.KeepHandWritten(md, string(old)) // and its hand-written section
			}
			if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
				return err
			}
			return runErr
		},
	}
	cmd.Flags().BoolVar(&quick, "quick", false, "small sizes and few iterations (under a minute)")
	cmd.Flags().StringVar(&only, "only", "", "comma-separated scenarios to run (default: all)")
	cmd.Flags().StringVar(&cases, "cases", "", `semicolon-separated cases of the cluster scenario to run, e.g. "spread,direct;spread,direct,bf16" (default: all)`)
	cmd.Flags().StringVar(&out, "out", "", "write the markdown report to this file (default: standard output)")
	cmd.Flags().StringVar(&redis, "redis", "", "redis-server binary for the Redis baseline, in a build with -tags redis (default: from PATH)")
	cmd.Flags().StringVar(&costOut, "cost-out", "", "the service-cost scenario writes what fanin sim charges the service with (its --cost file, JSON) to this file")
	cmd.Flags().StringVar(&costOutDirect, "cost-out-direct", "", "the same for the job with direct gradients (gradients: direct)")
	cmd.Flags().StringVar(&costOutEmbedded, "cost-out-embedded", "", "the same for the direct job with the NATS server in its one runtime's process (fanin runtime --nats-config; simulate it with --broker in-runtimes)")
	cmd.Flags().StringVar(&logs, "logs", "", "a directory where the cluster scenario keeps each fanin run's logs: every NATS server's, runtime's and worker's, and the gateway's and autoscaler's (a directory per run)")
	cmd.Flags().StringVar(&linkTrace, "link-trace", "", "a directory for the cluster scenario's traces of every node's link counters through the timed steps (one TSV per run, a line per node every 10 ms)")
	cmd.Flags().StringVar(&tcpCC, "tcp-cc", "", "the cluster scenario's nodes' TCP congestion control, as the kernel names it (default cubic, Linux's own default, whatever this machine's is)")
	cmd.Flags().IntVar(&linkMbit, "link-mbit", 0, "the cluster scenario's worker links' rate each way, in Mbit/s (default 100; a service node's is a multiple of it); its goals were set at 100")
	cmd.Flags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of this process to this file (with --only gloo: the service alone, its workers and gloo run in other processes)")
	return cmd
}

// benchWorkersCmd is the Go side of `fanin bench --only python`: a worker process that holds every
// rank of a job and prints its figures as JSON. Hidden: only the bench runs it.
func benchWorkersCmd() *cobra.Command {
	return &cobra.Command{
		Use:    bench.WorkersCommand,
		Short:  "Run the Go SDK worker process of the python bench scenario",
		Hidden: true,
		// bench.ParseWorkers reads the flags, as it does for the bench tests' own worker processes.
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := bench.ParseWorkers(args)
			if err != nil {
				return err
			}
			rep, err := bench.RunWorkers(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
		},
	}
}

// benchRuntimeCmd is a runtime process of `fanin bench --only service-cost`: it prints its CPU and
// counters each time it reads a line, and stops when its stdin ends. Hidden: only the bench runs it.
func benchRuntimeCmd() *cobra.Command {
	return &cobra.Command{
		Use:                bench.RuntimeCommand,
		Short:              "Run a runtime process of the service-cost bench scenario",
		Hidden:             true,
		DisableFlagParsing: true, // bench.ParseRuntime reads them, as a test binary does
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := bench.ParseRuntime(args)
			if err != nil {
				return err
			}
			return bench.RunRuntime(cmd.Context(), cfg, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
}

// benchNATSCmd is the NATS server process of `fanin bench --only broker-copies`: it prints its URL,
// then its CPU and counters each time it reads a line, and stops when its stdin ends. Hidden: only
// the bench runs it.
func benchNATSCmd() *cobra.Command {
	return &cobra.Command{
		Use:                bench.NATSCommand,
		Short:              "Run the NATS server process of the broker-copies bench scenario",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return bench.RunNATS(cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
}

// benchElasticWorkerCmd is one elastic worker process of `fanin bench --only elastic` (the
// absorb case SIGKILLs them). Hidden: only the bench runs it.
func benchElasticWorkerCmd() *cobra.Command {
	return &cobra.Command{
		Use:                bench.ElasticWorkerCommand,
		Short:              "Run an elastic worker process of the elastic bench scenario",
		Hidden:             true,
		DisableFlagParsing: true, // bench.ParseElasticWorker reads them, as a test binary does
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := bench.ParseElasticWorker(args)
			if err != nil {
				return err
			}
			return bench.RunElasticWorker(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
}

// limitBenchMemory gives this process a soft memory limit of three quarters of the machine's
// memory unless GOMEMLIMIT sets one. The bench runs servers, runtimes, workers and baselines in
// this one process, several ResNet-size models at once (10 GiB and more in use in e2e-resnet50); with
// only GOGC the heap may grow to twice that, and on a 24 GiB machine the kernel killed the run.
// Near the limit the collector runs more often instead.
func limitBenchMemory() {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return
	}
	var kib int64
	for _, line := range strings.Split(string(b), "\n") {
		if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kib); err == nil {
			break
		}
	}
	if kib > 0 {
		debug.SetMemoryLimit(kib << 10 / 4 * 3)
	}
}
