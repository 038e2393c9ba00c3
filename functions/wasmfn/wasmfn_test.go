package wasmfn_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/functions"
	"github.com/fanin-ml/fanin/functions/wasmfn"
	"github.com/fanin-ml/fanin/lab/wasmbuild"
)

var (
	engineOnce sync.Once
	engine     *wasmfn.Engine
	engineErr  error
)

// testEngine is one engine for the package's tests, with a short call limit so that the
// infinite loop is stopped quickly.
func testEngine(t testing.TB) *wasmfn.Engine {
	t.Helper()
	engineOnce.Do(func() {
		engine, engineErr = wasmfn.NewEngine(context.Background(), wasmfn.Limits{
			CallTimeout: 500 * time.Millisecond, MaxMemoryPages: 2048})
	})
	if engineErr != nil {
		t.Fatal(engineErr)
	}
	return engine
}

var (
	roomyOnce sync.Once
	roomy     *wasmfn.Engine
)

// roomyEngine has a minute per call and 64 MiB of memory.
func roomyEngine(t *testing.T) *wasmfn.Engine {
	roomyOnce.Do(func() {
		roomy, engineErr = wasmfn.NewEngine(context.Background(), wasmfn.Limits{CallTimeout: time.Minute, MaxMemoryPages: 1024})
	})
	if roomy == nil {
		t.Fatal(engineErr)
	}
	return roomy
}

func load(t testing.TB, dir string) *wasmfn.Module {
	t.Helper()
	m, err := testEngine(t).Load(context.Background(), wasmbuild.ForTest(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func randGrads(rng *rand.Rand, ranks, n int) [][]float32 {
	g := make([][]float32, ranks)
	for r := range g {
		g[r] = make([]float32, n)
		for i := range g[r] {
			g[r][i] = float32(rng.NormFloat64())
		}
	}
	return g
}

// TestSameBitsAsBuiltIn trains the same gradients through the built-in sgd and adam and through
// the modules that write their arithmetic in Go compiled to WebAssembly: every bit must agree,
// over several shards (one of an odd length) and steps.
func TestSameBitsAsBuiltIn(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		dir   string
		name  string
		hyper map[string]float64
	}{
		{"testdata/sgd", "sgd", map[string]float64{"lr": 0.05}},
		{"testdata/sgd", "sgd", map[string]float64{"lr": 0.05, "weight_decay": 0.01}},
		{"testdata/adam", "adam", map[string]float64{"lr": 0.01}},
		{"testdata/adam", "adam", map[string]float64{"lr": 0.01, "beta1": 0.8, "weight_decay": 0.001}},
	} {
		builtin, err := functions.New(c.name, c.hyper)
		if err != nil {
			t.Fatal(err)
		}
		user, err := load(t, c.dir).New("test/"+c.name+"@1", c.hyper, false)
		if err != nil {
			t.Fatal(err)
		}
		const n, ranks = 5000, 3
		shards := []functions.Range{{Off: 0, Len: 1000}, {Off: 1000, Len: 3001}, {Off: 4001, Len: 999}}
		rng := rand.New(rand.NewPCG(1, 2))
		init := make([]float32, n)
		for i := range init {
			init[i] = float32(rng.NormFloat64())
		}
		want := functions.NewReference(builtin, ranks, shards, init)
		got := functions.NewReference(user, ranks, shards, init)
		for step := range 20 {
			g := randGrads(rng, ranks, n)
			want.Step(g, nil)
			if err := got.TryStep(g, nil); err != nil {
				t.Fatalf("%s %v step %d: %v", c.name, c.hyper, step+1, err)
			}
			if !bitsEqual(want.Params(), got.Params()) {
				t.Fatalf("%s %v: step %d differs from the built-in at element %d", c.name, c.hyper, step+1, firstDiff(want.Params(), got.Params()))
			}
		}
	}
}

func bitsEqual(a, b []float32) bool { return firstDiff(a, b) < 0 }

func firstDiff(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

func TestDescribe(t *testing.T) {
	t.Parallel()
	info := load(t, "testdata/adam").Info()
	if info.ABI != wasmfn.ABI || !slices.Equal(info.State, []string{"m", "v"}) || len(info.Hyper) != 5 || info.Hyper[0].Name != "lr" || info.Hyper[1].Range != "[0, 1)" {
		t.Fatalf("info = %+v", info)
	}
}

func TestHyperValidated(t *testing.T) {
	t.Parallel()
	m := load(t, "testdata/adam")
	for _, c := range []struct {
		hyper map[string]float64
		want  string
	}{
		{map[string]float64{"lr": 0}, "lr: must be > 0, got 0"},
		{map[string]float64{"beta1": 1}, "beta1: must be in [0, 1), got 1"},
		{map[string]float64{"eps": math.Inf(1)}, "eps: must be > 0, got +Inf"},
		{map[string]float64{"lr_": 1}, `unknown hyper-parameter "lr_" (known: beta1, beta2, eps, lr, weight_decay)`},
	} {
		_, err := m.New("t/adam@1", c.hyper, false)
		if !errors.Is(err, functions.ErrBadHyper) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%v) = %v, want %q", c.hyper, err, c.want)
		}
	}
	if _, err := load(t, "testdata/sgd").New("t/sgd@1", nil, false); err == nil || !strings.Contains(err.Error(), "lr: required") {
		t.Errorf("sgd without lr: %v", err)
	}
}

// attack modes of testdata/attack.
const (
	modeSum = iota
	modeLoop
	modeGrow
	modeTrap
	modeNaN
	modeError
	modePanic
	modeSleep
	modeExit
	modeFile
	modeClock
	modeStateNaN
	modeStack
)

func attackFunc(t *testing.T, mode int, allowNonFinite bool) *wasmfn.Func {
	t.Helper()
	f, err := load(t, "testdata/attack").New("test/attack@1", map[string]float64{"mode": float64(mode)}, allowNonFinite)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func update(n int) *functions.Update {
	u := &functions.Update{Params: make([]float32, n), Grad: make([]float32, n), State: [][]float32{make([]float32, n)},
		Step: 1, Ranks: 1, WeightSum: 1}
	for i := range n {
		u.Params[i], u.Grad[i], u.State[0][i] = float32(i), float32(-i), float32(2*i)
	}
	return u
}

// TestAttacksContained runs each attack: the call fails with a specific error, the parameters
// and state are unchanged, and the same module keeps serving other functions afterwards.
func TestAttacksContained(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		mode int
		want string
	}{
		{"infinite loop", modeLoop, "ran past its time limit"},
		{"memory growth", modeGrow, "fatal error: out of memory"},
		{"trap", modeTrap, "out of bounds memory access"},
		{"NaN output", modeNaN, "output parameters[99] is NaN"},
		{"signalling NaN in state", modeStateNaN, "output state[0][0] is NaN"},
		{"error", modeError, "refusing on purpose"},
		{"panic", modePanic, "panic: assignment to entry in nil map"},
		{"exit", modeExit, "exited with code 3; output: leaving now"},
		{"stack overflow", modeStack, "out of memory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := attackFunc(t, c.mode, false)
			if c.mode == modeGrow || c.mode == modeStack {
				// On an engine whose time limit is far: the memory limit must stop them.
				m, err := roomyEngine(t).Load(context.Background(), wasmbuild.ForTest(t, "testdata/attack"))
				if err != nil {
					t.Fatal(err)
				}
				if f, err = m.New("test/attack@1", map[string]float64{"mode": float64(c.mode)}, false); err != nil {
					t.Fatal(err)
				}
			}
			u := update(100)
			before := [][]float32{slices.Clone(u.Params), slices.Clone(u.State[0])}
			err := f.TryApply(u)
			if !errors.Is(err, functions.ErrFunctionFailed) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("TryApply = %v, want ErrFunctionFailed with %q", err, c.want)
			}
			if !bitsEqual(u.Params, before[0]) || !bitsEqual(u.State[0], before[1]) {
				t.Fatal("a failed call changed the parameters or the state")
			}
			ok := attackFunc(t, modeSum, false)
			u = update(100)
			if err := ok.TryApply(u); err != nil || u.Params[7] != -7 {
				t.Fatalf("after the attack, a well-behaved call: %v, p[7] = %v", err, u.Params[7])
			}
		})
	}
}

// TestNoFiles: the module's file system is empty, reads and writes fail inside the guest.
func TestNoFiles(t *testing.T) {
	t.Parallel()
	if err := attackFunc(t, modeFile, false).TryApply(update(10)); err != nil {
		t.Fatal(err)
	}
}

// TestClockAndSleepDeterministic: the clock reads the same at every call on every instance, and
// an hour's sleep returns at once.
func TestClockAndSleepDeterministic(t *testing.T) {
	t.Parallel()
	var seen []float32
	for range 2 {
		f := attackFunc(t, modeClock, false)
		for range 2 {
			u := update(4)
			if err := f.TryApply(u); err != nil {
				t.Fatal(err)
			}
			seen = append(seen, u.Params[0])
		}
	}
	if seen[0] != seen[1] || seen[0] != seen[2] || seen[0] != seen[3] {
		t.Fatalf("clock readings differ between calls: %v", seen)
	}
	start := time.Now()
	if err := attackFunc(t, modeSleep, false).TryApply(update(4)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Minute {
		t.Fatalf("an hour's sleep took %v", d) // it is not waited for at all: this only catches a real wait
	}
}

// TestNaNCanonicalWhenAllowed: a job that allows non-finite values gets the canonical NaN.
func TestNaNCanonicalWhenAllowed(t *testing.T) {
	t.Parallel()
	u := update(100)
	if err := attackFunc(t, modeStateNaN, true).TryApply(u); err != nil {
		t.Fatal(err)
	}
	if b := math.Float32bits(u.State[0][0]); b != 0x7fc00000 {
		t.Fatalf("state[0][0] = %#x, want the canonical NaN 0x7fc00000", b)
	}
}

func TestLoadRefuses(t *testing.T) {
	t.Parallel()
	e, err := wasmfn.NewEngine(context.Background(), wasmfn.Limits{MaxModuleBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	empty := []byte("\x00asm\x01\x00\x00\x00")
	for _, c := range []struct {
		name string
		code []byte
		want string
	}{
		{"forbidden import", wasmbuild.ForTest(t, "testdata/badimport"), "imports env.host_secret"},
		{"huge module", append(slices.Clone(empty), make([]byte, 4<<20)...), "more than the 4194304 a module may have"},
		{"not wasm", []byte("#!/bin/sh\nrm -rf /\n"), "not a WebAssembly module"},
		{"truncated", wasmbuild.ForTest(t, "testdata/sgd")[:100000], "bad function module"},
		{"no exports", empty, "exports no"},
	} {
		_, err := e.Load(context.Background(), c.code)
		if !errors.Is(err, wasmfn.ErrBadModule) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Load = %v, want ErrBadModule with %q", c.name, err, c.want)
		}
	}
}

// TestConcurrentCalls: one Func serves concurrent calls, each on an instance of its own.
func TestConcurrentCalls(t *testing.T) {
	t.Parallel()
	f, err := load(t, "testdata/sgd").New("t/sgd@1", map[string]float64{"lr": 1}, false)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for k := range 8 {
		wg.Go(func() {
			u := &functions.Update{Params: make([]float32, 1000+k), Grad: make([]float32, 1000+k), Step: 1, Ranks: 1, WeightSum: 1}
			for i := range u.Grad {
				u.Grad[i] = float32(k)
			}
			if err := f.TryApply(u); err != nil {
				errs <- err
				return
			}
			if want := float32(-k); u.Params[999] != want {
				errs <- errors.New("wrong result under concurrency")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
