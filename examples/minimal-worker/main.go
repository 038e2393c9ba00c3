// Command minimal-worker is the smallest Go worker of a fanin job: it connects, joins the job as
// one rank and steps, its gradient that of the loss sum(p²)/2 (the parameters themselves). It
// links what any worker links and nothing more: the SDK's size test builds it (docs/BENCHMARKS.md,
// "Binary sizes").
//
//	fanin dev --no-auth &
//	fanin jobs create -f spec.yaml   # a job "mini" with ranks: 1
//	go run ./examples/minimal-worker -job mini -rank 0 -steps 10
//
// With authentication on, a worker also passes sdk.WithCredentialsFile (or sdk.WithJobCredentials).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fanin-ml/fanin/sdk"
)

func main() {
	url := flag.String("nats", envOr("NATS_URL", "nats://127.0.0.1:4222"), "NATS server URL")
	id := flag.String("job", "", "the job's id")
	rank := flag.Int("rank", 0, "the logical rank this worker computes")
	steps := flag.Int64("steps", 10, "steps to train, counted from step 0")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *url, *id, *rank, *steps); err != nil {
		fmt.Fprintln(os.Stderr, "minimal-worker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url, id string, rank int, steps int64) error {
	if id == "" {
		return fmt.Errorf("no job: give -job")
	}
	c, err := sdk.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close()
	w, err := c.Worker(ctx, id, rank)
	if err != nil {
		return err
	}
	defer w.Close()
	step, params, err := w.Params(ctx)
	if err != nil {
		return err
	}
	grads := make([]float32, len(params))
	for ; step < steps; step++ {
		copy(grads, params) // the gradient of sum(p²)/2
		if params, err = w.Step(ctx, grads); err != nil {
			return fmt.Errorf("step %d: %w", step+1, err)
		}
	}
	fmt.Printf("rank %d of job %q: %d steps\n", rank, id, w.StepCount())
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
