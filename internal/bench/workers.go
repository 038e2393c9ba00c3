package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/sdk"
)

// WorkersConfig is a worker process of the python scenario: Ranks ranks of Job in one process,
// each over its own connection, stepped in BSP lockstep with the bench's gradients.
type WorkersConfig struct {
	URL, CredsFile, Job  string
	Ranks, Warmup, Steps int
}

// WorkersReport is what a worker process of the python scenario prints, as JSON: the Go one
// (RunWorkers) and the Python one (sdk/python/fanin/_bench.py) print the same fields.
type WorkersReport struct {
	StepsPerSec float64 `json:"steps_per_sec"`
	P50ms       float64 `json:"p50_ms"`         // the median step, ms
	Sha256      string  `json:"sha256"`         // of rank 0's parameters at the end
	BytesCopied int64   `json:"bytes_copied"`   // per step, by the worker's language (Python: numpy/torch copies)
	Elements    int     `json:"elements"`       // parameters of the job
	Mode        string  `json:"mode,omitempty"` // python: numpy or torch
}

// RunWorkers is the Go SDK side of the python scenario (`fanin bench-workers`).
func RunWorkers(ctx context.Context, cfg WorkersConfig) (*WorkersReport, error) {
	var opts []sdk.Option
	if cfg.CredsFile != "" {
		b, err := os.ReadFile(cfg.CredsFile)
		if err != nil {
			return nil, err
		}
		var cr api.Credentials
		if err := json.Unmarshal(b, &cr); err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.CredsFile, err)
		}
		opts = append(opts, sdk.WithJobCredentials(&cr))
	}
	workers := make([]*sdk.Worker, cfg.Ranks)
	for r := range workers {
		c, err := sdk.Connect(ctx, cfg.URL, opts...)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		if workers[r], err = c.Worker(ctx, cfg.Job, r); err != nil {
			return nil, err
		}
	}
	n := workers[0].Job().Layout.Elements
	grads := make([][]float32, cfg.Ranks)
	for r := range grads {
		grads[r] = make([]float32, n)
		fillGradient(grads[r], r)
	}
	last := make([][]float32, cfg.Ranks)
	step := func() error {
		ctx, cancel := context.WithTimeout(ctx, stepTimeout)
		defer cancel()
		errs := make([]error, cfg.Ranks)
		var wg sync.WaitGroup
		for r, w := range workers {
			wg.Go(func() { last[r], errs[r] = w.Step(ctx, grads[r]) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	for range cfg.Warmup {
		if err := step(); err != nil {
			return nil, err
		}
	}
	took := make([]time.Duration, cfg.Steps)
	start := time.Now()
	for i := range took {
		t0 := time.Now()
		if err := step(); err != nil {
			return nil, err
		}
		took[i] = time.Since(t0)
	}
	el := time.Since(start)
	slices.Sort(took)
	sum := sha256.Sum256(asBytes(last[0]))
	return &WorkersReport{
		StepsPerSec: float64(cfg.Steps) / el.Seconds(), P50ms: ms(took[len(took)/2]),
		Sha256: hex.EncodeToString(sum[:]), Elements: n,
	}, nil
}
