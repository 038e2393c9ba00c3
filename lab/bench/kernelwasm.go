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
const wasmSGDDir = "functions/wasmfn/testdata/sgd"

// runKernelWasm measures a user-written SGD in WebAssembly against the built-in sgd kernel on the
// same bytes: the runtime's path for a user function (the ranks summed with SumLE, then the
// module's fanin_apply, with its copies in and out of the module's memory and the NaN check)
// against FoldApply's fused pass.
func runKernelWasm(ctx context.Context, round time.Duration, rounds int) (Result, error) {
	res := Result{Scenario: "kernel", Case: fmt.Sprintf("Func=sgd,N=%d,Shard=1MiB,WebAssembly", kernelRanks),
		Metric: "GB/s of gradient", Baseline: "the built-in sgd kernel (FoldApply) on the same bytes", Goal: 0.5}
	root, err := moduleRoot(ctx)
	if err != nil {
		res.Skipped = "the Go toolchain and fanin's source are needed to build the module: " + err.Error()
		return res, nil
	}
	tmp, err := os.MkdirTemp("", "fanin-bench-wasm-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	file := filepath.Join(tmp, "sgd.wasm")
	if err := wasmbuild.Build(ctx, filepath.Join(root, wasmSGDDir), file); err != nil {
		res.Skipped = err.Error()
		return res, nil
	}
	code, err := os.ReadFile(file)
	if err != nil {
		return res, err
	}
	e, err := wasmfn.NewEngine(ctx, wasmfn.Limits{})
	if err != nil {
		return res, err
	}
	defer e.Close(context.Background())
	m, err := e.Load(ctx, code)
	if err != nil {
		return res, err
	}
	hyper := map[string]float64{"lr": 0.01}
	user, err := m.New("bench/sgd@1", hyper, false)
	if err != nil {
		return res, err
	}
	builtin, err := newKernelBench("sgd", hyper, false)
	if err != nil {
		return res, err
	}
	n := kernelShard / 4
	params, acc := make([]float32, n), make([]float32, n)
	var step int64
	var callErr error
	wasmPass := func() {
		step++
		functions.SumLE(acc, builtin.grads)
		u := &functions.Update{Params: params, Grad: acc, Step: step, Ranks: kernelRanks, WeightSum: kernelRanks}
		if err := user.TryApply(u); err != nil && callErr == nil {
			callErr = err
		}
	}
	var wasm, base []float64
	var wasmCPU, baseCPU []time.Duration
	for range rounds {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		r, c := rate(round, wasmPass)
		wasm, wasmCPU = append(wasm, r), append(wasmCPU, c)
		r, c = rate(round, builtin.aggregate)
		base, baseCPU = append(base, r), append(baseCPU, c)
	}
	if callErr != nil {
		return res, callErr
	}
	gb := float64(builtin.bytes()) / 1e9
	res.Fanin, res.Base = median(wasm)*gb, median(base)*gb
	res.FaninCPU, res.BaseCPU = medianDur(wasmCPU), medianDur(baseCPU)
	res.Setup = fmt.Sprintf("one pass: SumLE of the 8 ranks' 1 MiB, then the module's SGD (%s, built with %q, %d bytes, run by wazero's compiler) with its copies in and out of the module's memory; the baseline is the built-in sgd kernel's FoldApply on the same bytes; median of %d rounds of %v, alternating",
		wasmSGDDir, wasmbuild.Command, len(code), rounds, round)
	res.Notes = "the user function's SGD is bit for bit the built-in's (TestSameBitsAsBuiltIn); the gap is WebAssembly's scalar loop against AVX2, and two copies of 1 MiB per pass"
	return throughput(res), nil
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
