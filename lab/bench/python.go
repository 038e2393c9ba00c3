package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fanin-ml/fanin/lab/devstack"
)

// The python scenario compares a Python worker process (sdk/python: numpy, and fanin.torch) with a
// Go SDK worker process (`fanin bench-workers`) on the same job, the same gradients and a fresh
// fanin each run (secured, as `fanin dev`): both are one process holding every rank, one NATS
// connection per rank, stepped in BSP lockstep. Both must end with the same parameters.
const goWorkersBaseline = "Go SDK worker process (fanin bench-workers), same ranks, connections and gradients"

// pythonEnv is what running the Python side needs: the interpreter, the package's folder, and
// libfanin built for it.
type pythonEnv struct {
	python, pkg, lib, fanin string
}

// findPython locates Python with numpy (FANIN_PYTHON, else /usr/bin/python3, else python3 on PATH),
// the repository's sdk/python from the working directory up, and builds libfanin into dir.
func findPython(ctx context.Context, dir string) (*pythonEnv, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	env := &pythonEnv{fanin: exe}
	for _, p := range []string{os.Getenv("FANIN_PYTHON"), "/usr/bin/python3", "python3"} {
		if p == "" {
			continue
		}
		if exec.CommandContext(ctx, p, "-c", "import numpy").Run() == nil {
			env.python = p
			break
		}
	}
	if env.python == "" {
		return nil, errors.New("no Python with numpy (set FANIN_PYTHON)")
	}
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	root := wd
	for ; ; root = filepath.Dir(root) {
		if _, err := os.Stat(filepath.Join(root, "sdk", "python", "fanin", "__init__.py")); err == nil {
			break
		}
		if filepath.Dir(root) == root {
			return nil, fmt.Errorf("run from fanin's repository: no sdk/python above %s", wd)
		}
	}
	env.pkg = filepath.Join(root, "sdk", "python")
	env.lib = filepath.Join(dir, "libfanin.so")
	build := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-o", env.lib, "./sdk/libfanin")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build libfanin: %v: %s", err, out)
	}
	return env, nil
}

// runWorkerProcess brings up a fresh secured fanin for w, and runs one worker process against it:
// mode "go" (fanin bench-workers), "numpy" or "torch" (python -m fanin._bench).
func runWorkerProcess(ctx context.Context, rs *runState, env *pythonEnv, mode string, w workload, warmup, steps int) (*WorkersReport, error) {
	rep, _, err := workerProcess(ctx, rs, env, mode, w, warmup, steps, true)
	return rep, err
}

// workerProcess is runWorkerProcess with security on or off. It also returns the CPU time this
// process (the NATS server, gateway and runtimes: the service, without its workers) used while
// the worker process ran.
func workerProcess(ctx context.Context, rs *runState, env *pythonEnv, mode string, w workload, warmup, steps int, secured bool, extra ...string) (*WorkersReport, time.Duration, error) {
	dir, err := os.MkdirTemp("", "fanin-bench-py-")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	st, err := devstack.Start(ctx, devstack.Config{DataDir: dir, NATSPort: -1, Runtimes: w.Runtimes, Logger: rs.stackLog, Auth: secured})
	if err != nil {
		return nil, 0, fmt.Errorf("start fanin: %w", err)
	}
	defer st.Close()
	created, err := st.Gateway.SubmitJob(ctx, w.spec("bench"))
	if err != nil {
		return nil, 0, fmt.Errorf("create job: %w", err)
	}
	args := []string{"--nats", st.URL, "--job", created.Spec.ID,
		"--ranks", strconv.Itoa(w.Ranks), "--warmup", strconv.Itoa(warmup), "--steps", strconv.Itoa(steps)}
	if created.Credentials != nil {
		creds := filepath.Join(dir, "creds.json")
		b, _ := json.Marshal(created.Credentials)
		if err := os.WriteFile(creds, b, 0o600); err != nil {
			return nil, 0, err
		}
		args = append(args, "--creds", creds)
	}
	var cmd *exec.Cmd
	if mode == "go" {
		cmd = command(ctx, env.fanin, append(append([]string{WorkersCommand}, args...), extra...)...)
		cmd.Env = append(os.Environ(), WorkersEnv+"=1")
	} else {
		cmd = command(ctx, env.python, append([]string{"-m", "fanin._bench", "--mode", mode}, args...)...)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+env.pkg, "FANIN_LIB="+env.lib)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cpu0 := processCPU()
	if err := cmd.Run(); err != nil {
		return nil, 0, fmt.Errorf("%s workers: %v: %s", mode, err, tail(errOut.Bytes(), 2000))
	}
	service := processCPU() - cpu0
	var rep WorkersReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return nil, 0, fmt.Errorf("%s workers printed %q: %w", mode, tail(out.Bytes(), 500), err)
	}
	return &rep, service, nil
}

func runPython(ctx context.Context, rs *runState) ([]Result, error) {
	n, model := rs.e2eElements()
	p := rs.e2ePlan()
	big := workload{Ranks: 8, Elements: n, ShardSize: securedShardSize, Runtimes: e2eRuntimes}
	small := workload{Ranks: 4, Elements: 1 << 18, ShardSize: 256 << 10, Runtimes: e2eRuntimes} // 1 MiB
	smallSteps := 200
	if rs.cfg.Quick {
		smallSteps = 50
	}
	dir, err := os.MkdirTemp("", "fanin-bench-lib-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	env, err := findPython(ctx, dir)
	if err != nil {
		return []Result{{Scenario: "python", Metric: "steps/s", Baseline: goWorkersBaseline, Skipped: err.Error()}}, nil
	}
	hasTorch := exec.CommandContext(ctx, env.python, "-c", "import torch").Run() == nil
	modes := []string{"go", "numpy"}
	if hasTorch {
		modes = append(modes, "torch")
	}

	// best runs each mode reps times, alternating, and keeps each mode's best report. The order
	// rotates from one round to the next, so that no mode always runs first (the machine's load
	// drifts during a run).
	best := func(w workload, warmup, steps int, better func(a, b *WorkersReport) bool) (map[string]*WorkersReport, map[string][]string, error) {
		top, all := map[string]*WorkersReport{}, map[string][]string{}
		var first *WorkersReport
		for i := range p.reps {
			for j := range modes {
				m := modes[(i+j)%len(modes)]
				rs.printf("   python %s %s run %d/%d ...", w.name(), m, i+1, p.reps)
				rep, err := runWorkerProcess(ctx, rs, env, m, w, warmup, steps)
				if err != nil {
					return nil, nil, err
				}
				rs.printf("   python %s %s: %.3f steps/s, p50 %.2f ms", w.name(), m, rep.StepsPerSec, rep.P50ms)
				all[m] = append(all[m], fmt.Sprintf("%s steps/s p50 %s ms", num(rep.StepsPerSec), num(rep.P50ms)))
				if top[m] == nil || better(rep, top[m]) {
					top[m] = rep
				}
				if first == nil {
					first = rep
				}
				if rep.Sha256 != first.Sha256 {
					return nil, nil, fmt.Errorf("python %s: %s workers ended with parameters %s, the first run with %s: they did not compute the same thing",
						w.name(), m, rep.Sha256[:12], first.Sha256[:12])
				}
			}
		}
		return top, all, nil
	}
	var out []Result
	top, all, err := best(big, p.warmup, p.steps, func(a, b *WorkersReport) bool { return a.StepsPerSec > b.StepsPerSec })
	if err != nil {
		return nil, err
	}
	for _, m := range modes[1:] {
		out = append(out, throughput(Result{
			Scenario: "python", Case: m + "," + big.name(), Metric: "steps/s", Baseline: goWorkersBaseline,
			Fanin: top[m].StepsPerSec, Base: top["go"].StepsPerSec, Goal: 0.95,
			Setup: fmt.Sprintf("%s, %d ranks in one worker process with a connection each, sgd, secured fanin (job credentials) with %d runtimes, fresh per run; best of %d runs of %d steps after %d warm-up steps, Go/numpy/torch alternating in a rotating order; every run ends with the Go run's parameters (sha256)",
				model, big.Ranks, big.Runtimes, p.reps, p.steps, p.warmup),
			Notes: fmt.Sprintf("bytes copied per step in Python: %d; runs: %s. Go runs: %s", top[m].BytesCopied, strings.Join(all[m], ", "), strings.Join(all["go"], ", ")),
		}))
	}
	if !hasTorch {
		out = append(out, Result{Scenario: "python", Case: "torch", Metric: "steps/s", Baseline: goWorkersBaseline, Skipped: "Python has no torch"})
		return out, nil
	}
	top, all, err = best(small, 10, smallSteps, func(a, b *WorkersReport) bool { return a.P50ms < b.P50ms })
	if err != nil {
		return nil, err
	}
	r := latency(Result{
		Scenario: "python", Case: "torch-step," + small.name(), Metric: "p50 step ms", Baseline: goWorkersBaseline,
		Fanin: top["torch"].P50ms, Base: top["go"].P50ms,
		Setup: fmt.Sprintf("1 MiB model, %d ranks of one process, %d steps after 10 warm-up; best p50 of %d runs", small.Ranks, smallSteps, p.reps),
	})
	r.Notes = fmt.Sprintf("goal: p50 within 1.2x of the Go SDK's: %s; bytes copied per step in Python: %d; torch runs: %s; numpy runs: %s; Go runs: %s",
		yesNo(r.Ratio <= 1.2), top["torch"].BytesCopied, strings.Join(all["torch"], ", "), strings.Join(all["numpy"], ", "), strings.Join(all["go"], ", "))
	return append(out, r), nil
}
