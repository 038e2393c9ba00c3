package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// TestMain lets the test binary stand in for fanin as the elastic scenario's worker process (the
// bench runs os.Executable with ElasticWorkerCommand and ElasticWorkerEnv set) and as the Go worker
// process of the gloo, python and service-cost scenarios (WorkersCommand, WorkersEnv), and as the
// service-cost scenario's runtime processes (RuntimeCommand, RuntimeEnv), and as the broker-copies
// scenario's NATS server process (NATSCommand, NATSEnv).
func TestMain(m *testing.M) {
	if os.Getenv(RuntimeEnv) != "" && len(os.Args) > 1 && os.Args[1] == RuntimeCommand {
		cfg, err := ParseRuntime(os.Args[2:])
		if err == nil {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			err = RunRuntime(ctx, cfg, os.Stdin, os.Stdout)
			stop()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(NATSEnv) != "" && len(os.Args) > 1 && os.Args[1] == NATSCommand {
		if err := RunNATS(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(ElasticWorkerEnv) != "" && len(os.Args) > 1 && os.Args[1] == ElasticWorkerCommand {
		cfg, err := ParseElasticWorker(os.Args[2:])
		if err == nil {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			err = RunElasticWorker(ctx, cfg, os.Stdout)
			stop()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(WorkersEnv) != "" && len(os.Args) > 1 && os.Args[1] == WorkersCommand {
		cfg, err := ParseWorkers(os.Args[2:])
		var rep *WorkersReport
		if err == nil {
			rep, err = RunWorkers(context.Background(), cfg)
		}
		if err == nil {
			err = json.NewEncoder(os.Stdout).Encode(rep)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
