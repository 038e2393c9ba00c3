package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/functions/wasmfn"
	"github.com/fanin-ml/fanin/lab/wasmbuild"
)

// wasmSGDDir is the user-written SGD the kernel scenario runs in WebAssembly, relative to the
// module's root: it is built from source by the bench (no binary is kept in the repository).
// wasmSGDLoopDir is the same SGD written one element a loop turn, measured in the same rounds.
const (
	wasmSGDDir     = "functions/wasmfn/testdata/sgd"
	wasmSGDLoopDir = "functions/wasmfn/testdata/sgdloop"
)

// runKernelWasm measures a user-written SGD in WebAssembly against the built-in sgd kernel on the
// same bytes: the runtime's path for a user function (the ranks summed with SumLE, then the
// module's fanin_apply, with its copies in and out of the module's memory and the NaN check)
// against FoldApply's fused pass. The module with the plain loop (one element a turn) runs in the
// same rounds, as a second result.
func runKernelWasm(ctx context.Context, round time.Duration, rounds int) ([]Result, error) {
	res := Result{Scenario: "kernel", Case: fmt.Sprintf("Func=sgd,N=%d,Shard=1MiB,WebAssembly", kernelRanks),
		Metric: "GB/s of gradient", Baseline: "the built-in sgd kernel (FoldApply) on the same bytes", Goal: 0.5}
	loopRes := res
	loopRes.Case, loopRes.Goal = res.Case+",OneElementLoop", 0
	root, err := moduleRoot(ctx)
	if err != nil {
		res.Skipped = "the Go toolchain and fanin's source are needed to build the module: " + err.Error()
		return []Result{res}, nil
	}
	tmp, err := os.MkdirTemp("", "fanin-bench-wasm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	e, err := wasmfn.NewEngine(ctx, wasmfn.Limits{})
	if err != nil {
		return nil, err
	}
	defer e.Close(context.Background())
	hyper := map[string]float64{"lr": 0.01}
	var users []*wasmfn.Func
	var sizes []int
	for _, dir := range []string{wasmSGDDir, wasmSGDLoopDir} {
		file := filepath.Join(tmp, filepath.Base(dir)+".wasm")
		if err := wasmbuild.Build(ctx, filepath.Join(root, dir), file); err != nil {
			res.Skipped = err.Error()
			return []Result{res}, nil
		}
		code, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		m, err := e.Load(ctx, code)
		if err != nil {
			return nil, err
		}
		user, err := m.New("bench/"+filepath.Base(dir)+"@1", hyper, false)
		if err != nil {
			return nil, err
		}
		users, sizes = append(users, user), append(sizes, len(code))
	}
	builtin, err := newKernelBench("sgd", hyper, false)
	if err != nil {
		return nil, err
	}
	n := kernelShard / 4
	params, acc := make([]float32, n), make([]float32, n)
	var step int64
	var callErr error
	pass := func(user *wasmfn.Func) func() {
		return func() {
			step++
			functions.SumLE(acc, builtin.grads)
			u := &functions.Update{Params: params, Grad: acc, Step: step, Ranks: kernelRanks, WeightSum: kernelRanks}
			if err := user.TryApply(u); err != nil && callErr == nil {
				callErr = err
			}
		}
	}
	unrolled, plain := pass(users[0]), pass(users[1])
	var wasm, loop, base []float64
	var wasmCPU, loopCPU, baseCPU []time.Duration
	for range rounds {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r, c := rate(round, unrolled)
		wasm, wasmCPU = append(wasm, r), append(wasmCPU, c)
		r, c = rate(round, plain)
		loop, loopCPU = append(loop, r), append(loopCPU, c)
		r, c = rate(round, builtin.aggregate)
		base, baseCPU = append(base, r), append(baseCPU, c)
	}
	if callErr != nil {
		return nil, callErr
	}
	gb := float64(builtin.bytes()) / 1e9
	res.Fanin, res.Base = median(wasm)*gb, median(base)*gb
	res.FaninCPU, res.BaseCPU = medianDur(wasmCPU), medianDur(baseCPU)
	loopRes.Fanin, loopRes.Base = median(loop)*gb, res.Base
	loopRes.FaninCPU, loopRes.BaseCPU = medianDur(loopCPU), res.BaseCPU
	setup := "one pass: SumLE of the 8 ranks' 1 MiB, then the module's SGD (%s, built with %q, %d bytes, run by wazero's compiler) with its copies in and out of the module's memory; the baseline is the built-in sgd kernel's FoldApply on the same bytes; median of %d rounds of %v, the two modules and the baseline alternating"
	res.Setup = fmt.Sprintf(setup, wasmSGDDir, wasmbuild.Command, sizes[0], rounds, round)
	loopRes.Setup = fmt.Sprintf(setup, wasmSGDLoopDir, wasmbuild.Command, sizes[1], rounds, round)
	res.Notes = "the user function's SGD is bit for bit the built-in's (TestSameBitsAsBuiltIn); its loop takes 8 elements a turn, written out; the gap left is the scalar WebAssembly Go emits, run by wazero, against AVX2"
	loopRes.Notes = "the same SGD one element a loop turn, as Go code is usually written: each turn of a loop in Go's WebAssembly goes back through its function's br_table dispatch and wazero's deadline check"
	return []Result{throughput(res), throughput(loopRes)}, nil
}

// moduleRoot is the directory of fanin's go.mod, from the go command (the bench runs in the
// repository, as `go run ./cmd/fanin bench`).
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module")
	}
	root := filepath.Dir(gomod)
	if _, err := os.Stat(filepath.Join(root, wasmSGDDir, "main.go")); err != nil {
		return "", err
	}
	return root, nil
}
