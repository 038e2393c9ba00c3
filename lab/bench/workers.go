package bench

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// WorkersConfig is a worker process of the python scenario: Ranks ranks of Job in one process,
// each over its own connection, stepped in BSP lockstep with the bench's gradients.
type WorkersConfig struct {
	URL, CredsFile, Job  string
	Ranks, Warmup, Steps int
	FirstRank            int    // the process holds ranks FirstRank..FirstRank+Ranks-1 (several worker processes share a job)
	Dtype                string // of the gradients: f32 (default), bf16 or f16
	// Hold: after the warm-up, write "ready" and a newline to Ready (default standard output) and
	// wait for a line from Go (default standard input) before the timed steps, so that the bench
	// reads its counters between the two while every worker process waits.
	Hold  bool
	Ready io.Writer
	Go    io.Reader
}

// holdReady is the line a held worker process writes after its warm-up.
const holdReady = "ready"

// WorkersReport is what a worker process of the python scenario prints, as JSON: the Go one
// (RunWorkers) and the Python one (sdk/python/fanin/_bench.py) print the same fields.
type WorkersReport struct {
	StepsPerSec float64   `json:"steps_per_sec"`
	P50ms       float64   `json:"p50_ms"`            // the median step, ms
	P99ms       float64   `json:"p99_ms"`            // the 99th percentile step (nearest rank), ms
	StepMs      []float64 `json:"step_ms,omitempty"` // every timed step, ms, in order (Go side only)
	Sha256      string    `json:"sha256"`            // of rank 0's parameters at the end
	BytesCopied int64     `json:"bytes_copied"`      // per step, by the worker's language (Python: numpy/torch copies)
	Elements    int       `json:"elements"`          // parameters of the job
	Mode        string    `json:"mode,omitempty"`    // python: numpy or torch
	// Over the timed steps (Go side only): the shards' parameters fetched from the stream because
	// their push was late or lost, and the gradient requests of a direct-gradients job sent again
	// (sdk.Worker.DirectResends).
	Fetches int64 `json:"fetches,omitempty"`
	Resends int64 `json:"resends,omitempty"`
	// ResendsBy are the same re-sends by what made the worker send again.
	ResendsBy sdk.Resends `json:"resends_by"`
}

// fetchCounter is a sdk.Meter that counts the parameters fetched rather than pushed.
type fetchCounter struct{ n atomic.Int64 }

func (f *fetchCounter) Worker(string, int) sdk.WorkerMeter { return f }
func (f *fetchCounter) Published(time.Duration, int)       {}
func (f *fetchCounter) Stepped(time.Duration)              {}
func (f *fetchCounter) Fetched()                           { f.n.Add(1) }
func (f *fetchCounter) Failed(string)                      {}

// WorkersCommand is the fanin command of a Go worker process (cmd/fanin's hidden bench-workers).
// WorkersEnv is set in its environment: a test binary standing in for fanin (TestMain) runs
// RunWorkers when it sees it.
const (
	WorkersCommand = "bench-workers"
	WorkersEnv     = "FANIN_BENCH_WORKERS"
)

// ParseWorkers reads a worker process's flags (those of `fanin bench-workers`).
func ParseWorkers(args []string) (WorkersConfig, error) {
	var cfg WorkersConfig
	f := flag.NewFlagSet(WorkersCommand, flag.ContinueOnError)
	f.StringVar(&cfg.URL, "nats", "", "NATS URL")
	f.StringVar(&cfg.CredsFile, "creds", "", "the job's credentials as the gateway returns them (JSON)")
	f.StringVar(&cfg.Job, "job", "", "job id")
	f.IntVar(&cfg.Ranks, "ranks", 8, "ranks")
	f.IntVar(&cfg.FirstRank, "first-rank", 0, "the first of the ranks")
	f.BoolVar(&cfg.Hold, "hold", false, `after the warm-up, print "ready" and wait for a line on standard input`)
	f.IntVar(&cfg.Warmup, "warmup", 2, "warm-up steps")
	f.IntVar(&cfg.Steps, "steps", 10, "timed steps")
	f.StringVar(&cfg.Dtype, "dtype", "", "gradient dtype: f32 (default), bf16 or f16")
	if err := f.Parse(args); err != nil {
		return cfg, err
	}
	if cfg.URL == "" || cfg.Job == "" || cfg.Ranks < 1 || cfg.Steps < 1 || cfg.Warmup < 0 || cfg.FirstRank < 0 {
		return cfg, fmt.Errorf("%s: --nats, --job, --ranks >= 1, --steps >= 1, --warmup >= 0 and --first-rank >= 0 are required", WorkersCommand)
	}
	return cfg, nil
}

// RunWorkers is the Go SDK side of the python scenario (`fanin bench-workers`).
func RunWorkers(ctx context.Context, cfg WorkersConfig) (*WorkersReport, error) {
	fetches := &fetchCounter{}
	opts := []sdk.Option{sdk.WithMeter(fetches)}
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
	var wopts []sdk.WorkerOption
	if cfg.Dtype != "" {
		dt, ok := wire.ParseDtype(cfg.Dtype)
		if !ok {
			return nil, fmt.Errorf("gradient dtype %q: want %s, %s or %s", cfg.Dtype, wire.DtypeF32, wire.DtypeBF16, wire.DtypeF16)
		}
		wopts = append(wopts, sdk.WithGradDtype(dt))
	}
	workers := make([]*sdk.Worker, cfg.Ranks)
	for r := range workers {
		c, err := sdk.Connect(ctx, cfg.URL, opts...)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		if workers[r], err = c.Worker(ctx, cfg.Job, cfg.FirstRank+r, wopts...); err != nil {
			return nil, err
		}
	}
	n := workers[0].Job().Layout.Elements
	grads := make([][]float32, cfg.Ranks)
	for r := range grads {
		grads[r] = make([]float32, n)
		fillGradient(grads[r], cfg.FirstRank+r)
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
	if cfg.Hold {
		if err := hold(cfg.Ready, cfg.Go); err != nil {
			return nil, err
		}
	}
	resends := func() (n sdk.Resends) {
		for _, w := range workers {
			r := w.DirectResends()
			n.Notice, n.Stall, n.Timeout, n.NoResponders = n.Notice+r.Notice, n.Stall+r.Stall, n.Timeout+r.Timeout, n.NoResponders+r.NoResponders
		}
		return n
	}
	fetched0, resent0 := fetches.n.Load(), resends()
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
	r := resends()
	by := sdk.Resends{Notice: r.Notice - resent0.Notice, Stall: r.Stall - resent0.Stall, Timeout: r.Timeout - resent0.Timeout,
		NoResponders: r.NoResponders - resent0.NoResponders}
	rep := &WorkersReport{Fetches: fetches.n.Load() - fetched0, Resends: by.Total(), ResendsBy: by}
	stepMs := make([]float64, len(took))
	for i, d := range took {
		stepMs[i] = ms(d)
	}
	slices.Sort(took)
	sum := sha256.Sum256(asBytes(last[0]))
	rep.StepsPerSec, rep.P50ms, rep.P99ms = float64(cfg.Steps)/el.Seconds(), ms(took[len(took)/2]), ms(percentile(took, 0.99))
	rep.StepMs, rep.Sha256, rep.Elements = stepMs, hex.EncodeToString(sum[:]), n
	return rep, nil
}

// hold writes holdReady to ready (default standard output) and waits for a line from release
// (default standard input).
func hold(ready io.Writer, release io.Reader) error {
	if ready == nil {
		ready = os.Stdout
	}
	if release == nil {
		release = os.Stdin
	}
	if _, err := fmt.Fprintln(ready, holdReady); err != nil {
		return err
	}
	if _, err := bufio.NewReader(release).ReadString('\n'); err != nil {
		return fmt.Errorf("held after the warm-up: no line to go on: %w", err)
	}
	return nil
}
