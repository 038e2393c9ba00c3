package bench

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// TestMain lets the test binary stand in for fanin as the elastic scenario's worker process: the
// bench runs os.Executable with ElasticWorkerCommand and ElasticWorkerEnv set.
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
	os.Exit(m.Run())
}
