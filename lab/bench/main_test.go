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
// process of the gloo and python scenarios (WorkersCommand, WorkersEnv).
func TestMain(m *testing.M) {
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
