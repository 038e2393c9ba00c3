package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/fanin-ml/fanin/functions"
)

// The kernel scenario: what a runtime does with one shard per step, on bytes already in memory.
const (
	kernelRanks = 8
	kernelShard = 1 << 20 // bytes per rank
)

// kernelBench is the aggregation of one shard: the ranks' little-endian gradients summed in rank
// order and the function applied, in one pass (functions.FoldApply), or as the runtime does it
// (incremental: CopyLE and AddLE as the ranks arrive, the last rank with the update,
// functions.AddApply); and, as the baseline, a copy of the same bytes into a float32 buffer.
type kernelBench struct {
	grads  [][]byte // per rank, kernelShard bytes each
	acc    []float32
	params []float32
	state  [][]float32
	fn     functions.Func
	step   int64
	dst    []byte // the copy's destination: acc's memory, as bytes
	incr   bool   // the runtime's incremental fold instead of FoldApply
}

// newKernelBench prepares the aggregation of one shard. With unaligned, each rank's payload
// starts at an odd address, as a NATS message's payload does when it follows the headers in the
// same buffer: the kernels then take their unaligned path.
func newKernelBench(fnName string, hyper map[string]float64, unaligned bool) (*kernelBench, error) {
	fn, err := functions.New(fnName, hyper)
	if err != nil {
		return nil, err
	}
	n := kernelShard / 4
	k := &kernelBench{
		grads:  make([][]byte, kernelRanks),
		acc:    make([]float32, n),
		params: make([]float32, n),
		state:  make([][]float32, fn.Slots()),
		fn:     fn,
	}
	g := make([]float32, n)
	for r := range k.grads {
		fillGradient(g, r)
		off := 0
		if unaligned {
			off = 1
		}
		k.grads[r] = make([]byte, kernelShard+off)[off:]
		functions.EncodeLE(k.grads[r], g)
	}
	for i := range k.state {
		k.state[i] = make([]float32, n)
	}
	fn.InitState(k.state)
	k.dst = asBytes(make([]float32, n))
	return k, nil
}

// aggregate is one invocation of the runtime's hot path for one shard and step.
func (k *kernelBench) aggregate() {
	k.step++
	u := &functions.Update{Params: k.params, Grad: k.acc, State: k.state, Step: k.step, Ranks: kernelRanks, WeightSum: kernelRanks}
	if !k.incr {
		functions.FoldApply(k.fn, u, k.grads)
		return
	}
	functions.CopyLE(k.acc, k.grads[0])
	for _, g := range k.grads[1 : kernelRanks-1] {
		functions.AddLE(k.acc, g)
	}
	functions.AddApply(k.fn, u, k.grads[kernelRanks-1])
}

// copyAll is the baseline: every rank's bytes copied once, nothing computed.
func (k *kernelBench) copyAll() {
	for _, g := range k.grads {
		copy(k.dst, g)
	}
}

// bytes is how many gradient bytes one aggregate or copyAll processes.
func (k *kernelBench) bytes() int64 { return kernelRanks * kernelShard }

// rate runs f for about d and returns its passes per second and the process CPU per pass.
func rate(d time.Duration, f func()) (perSec float64, cpu time.Duration) {
	f() // warm: page faults, caches
	n := 0
	c0 := processCPU()
	start := time.Now()
	for time.Since(start) < d || n < 3 {
		f()
		n++
	}
	el := time.Since(start)
	return float64(n) / el.Seconds(), (processCPU() - c0) / time.Duration(n)
}

func runKernel(ctx context.Context, rs *runState) ([]Result, error) {
	round, rounds := 300*time.Millisecond, 7
	if rs.cfg.Quick {
		round, rounds = 100*time.Millisecond, 3
	}
	fns := []struct {
		name      string
		hyper     map[string]float64
		unaligned bool
		incr      bool
	}{
		{"sgd", map[string]float64{"lr": 0.01}, false, false},
		{"adam", map[string]float64{"lr": 0.001}, false, false},
		{"sgd", map[string]float64{"lr": 0.01}, true, true}, // as the runtime folds NATS payloads
	}
	var out []Result
	for _, f := range fns {
		k, err := newKernelBench(f.name, f.hyper, f.unaligned)
		if err != nil {
			return out, err
		}
		k.incr = f.incr
		// Alternate the two in rounds, so that a disturbance of the machine hits both alike; keep
		// the median round of each.
		var agg, cp []float64
		var aggCPU, cpCPU []time.Duration
		for range rounds {
			if err := ctx.Err(); err != nil {
				return out, err
			}
			r, c := rate(round, k.aggregate)
			agg, aggCPU = append(agg, r), append(aggCPU, c)
			r, c = rate(round, k.copyAll)
			cp, cpCPU = append(cp, r), append(cpCPU, c)
		}
		gb := float64(k.bytes()) / 1e9
		c := fmt.Sprintf("Func=%s,N=%d,Shard=1MiB", f.name, kernelRanks)
		notes := fmt.Sprintf("FoldApply: the %d ranks' 1 MiB summed in one pass with the %s update fused (256 Ki float32)", kernelRanks, f.name)
		if f.incr {
			c += ",Incremental"
			notes = fmt.Sprintf("the runtime's fold: CopyLE + %d x AddLE as ranks arrive, the last rank with the %s update (AddApply)", kernelRanks-2, f.name)
		}
		if f.unaligned {
			c += ",Unaligned"
			notes += "; payloads at odd addresses (a NATS payload that follows headers may be), read in place"
		}
		out = append(out, throughput(Result{
			Scenario: "kernel",
			Case:     c,
			Metric:   "GB/s of gradient",
			Baseline: "copy() of the same 8 MiB into a float32 buffer",
			Fanin:    median(agg) * gb,
			Base:     median(cp) * gb,
			Goal:     1.0,
			FaninCPU: medianDur(aggCPU),
			BaseCPU:  medianDur(cpCPU),
			Setup: fmt.Sprintf("one pass folds 8 ranks' 1 MiB little-endian gradients in rank order and applies the function, on bytes already in memory (no NATS); GB/s counts the 8 MiB of gradient per pass; median of %d rounds of %v, fanin and baseline alternating",
				rounds, round),
			Notes: notes,
		}))
	}
	r, err := runKernelWasm(ctx, round, rounds)
	if err != nil {
		return out, err
	}
	return append(out, r...), nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianDur(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
