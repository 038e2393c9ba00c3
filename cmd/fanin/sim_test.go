package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fanin-ml/fanin/sim"
)

// fanin sim reads every trace file of --traces: a PAI trace added next to the shared ones is drawn
// from and named in the report, and a workload file (--workload) can follow it by its name.
func TestSimUsesAnExtraTraceFile(t *testing.T) {
	t.Parallel()
	shared := filepath.Join("..", "..", "..", "shared", "traces")
	names, _ := filepath.Glob(filepath.Join(shared, "*.csv"))
	if len(names) == 0 {
		t.Skipf("the shared traces are not at %s", shared)
	}
	traces := t.TempDir()
	for _, n := range names {
		abs, err := filepath.Abs(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(traces, filepath.Base(n))); err != nil {
			t.Fatal(err)
		}
	}
	// Four workers in two arrival groups, about 500 and 900 of 1000.
	var b strings.Builder
	b.WriteString(",worker,gpu,time,batch_time_norm\n")
	for it := range 40 {
		for w, base := range []int{500, 510, 900, 880} {
			fmt.Fprintf(&b, "%d,%d,25,%d,%d\n", 4*it+w, w, it+1, base+(it*7+w*13)%40)
		}
	}
	if err := os.WriteFile(filepath.Join(traces, "two-groups.csv"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	sim := func(args ...string) string {
		t.Helper()
		out := t.TempDir()
		cmd := simCmd()
		var stdout bytes.Buffer
		cmd.SetOut(&stdout)
		cmd.SetErr(&stdout)
		cmd.SetArgs(append([]string{"--traces", traces, "--out", out, "--slow-fraction", "0"}, args...))
		cmd.SilenceUsage = true
		if err := cmd.Execute(); err != nil {
			t.Fatalf("fanin sim %s: %v\n%s", strings.Join(args, " "), err, stdout.String())
		}
		report, err := os.ReadFile(filepath.Join(out, "report.md"))
		if err != nil {
			t.Fatal(err)
		}
		return string(report)
	}

	report := sim("--duration", "4m", "--rate", "5", "--max-job", "2m")
	for _, want := range []string{"two-groups.csv (two-groups: 40 iterations of 4 workers)", "pai-minibatch-job_1_norm.csv (pai-1:",
		"philly-job-runtime.csv ("} {
		if !strings.Contains(report, want) {
			t.Errorf("the report does not name %q", want)
		}
	}
	if !strings.Contains(report, "| two-groups |") || strings.Contains(report, "4 workers): 0 of") {
		t.Errorf("no drawn job follows the new trace:\n%s", report)
	}

	wl := filepath.Join(t.TempDir(), "jobs.json")
	if err := os.WriteFile(wl, []byte(`{"jobs": [{"id": "g", "arrival_s": 0, "duration_s": 30, "params": 1000000, "trace": "two-groups"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	report = sim("--duration", "30s", "--workload", wl)
	if !strings.Contains(report, "read from jobs.json") || !strings.Contains(report, "| g |  | two-groups |") ||
		!strings.Contains(report, "two-groups.csv (two-groups: 40 iterations of 4 workers): 1 of the workload's jobs") {
		t.Errorf("the workload's job does not follow the new trace:\n%s", report)
	}
}

// A trace file of the wrong format, or with a bad row, stops fanin sim with an error naming the
// file and the line: no trace is silently left out.
func TestSimRejectsABadTraceFile(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ content, want string }{
		"columns.csv": {"a,b\n1,2\n", "columns.csv: line 1: not a trace"},
		"badrow.csv":  {",worker,gpu,time,batch_time_norm\n0,0,25,1,500\n1,1,25,1,fast\n", "badrow.csv: line 3:"},
		"runtime.csv": {"runtime\n120\nlong\n", "runtime.csv: line 3:"},
	} {
		traces := t.TempDir()
		if err := os.WriteFile(filepath.Join(traces, name), []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := simCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		cmd.SetArgs([]string{"--traces", traces, "--out", t.TempDir(), "--duration", "1m"})
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.want)
		}
	}
}

// fanin sim --synth draws the jobs with synthesized step times of the spread and CoV asked for,
// and says so in the report; a bad description is refused.
func TestSimSynth(t *testing.T) {
	t.Parallel()
	shared := filepath.Join("..", "..", "..", "shared", "traces")
	if _, err := os.Stat(filepath.Join(shared, "philly-job-runtime.csv")); err != nil {
		t.Skipf("the shared traces are not at %s", shared)
	}
	out := t.TempDir()
	wl := filepath.Join(out, "wl.json")
	cmd := simCmd()
	var stdout bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	cmd.SetArgs([]string{"--traces", shared, "--out", out, "--duration", "5m", "--rate", "4", "--max-job", "2m",
		"--synth", "spread=0.6,cov=0.5,groups=2,steps=300", "--save-workload", wl, "--high-fraction", "0.3", "--low-fraction", "0.3"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(report), "step times synthesized (spread=0.6,cov=0.5,groups=2,ranks=10,steps=300,step=1.5s)") {
		t.Errorf("the report does not say the step times are synthesized")
	}
	w, err := sim.ReadWorkload(wl)
	if err != nil {
		t.Fatal(err)
	}
	classes := map[string]int{}
	for _, j := range w.Jobs {
		spread, cov := sim.MeasureSteps(j.StepTimes)
		if j.Trace != "" || len(j.StepTimes) != 300 || spread < 0.59 || spread > 0.61 || cov < 0.35 || cov > 0.65 {
			t.Errorf("job %s: trace %q, %d steps, spread %.3f, cov %.3f", j.ID, j.Trace, len(j.StepTimes), spread, cov)
		}
		classes[j.Priority]++
	}
	if len(w.Jobs) < 4 || classes["high"] == 0 || classes["low"] == 0 {
		t.Errorf("%d jobs, priorities %v", len(w.Jobs), classes)
	}
	for _, c := range []string{"| high | ", "| low | "} {
		if !strings.Contains(string(report), c) {
			t.Errorf("the report has no row %q", c)
		}
	}
	cmd = simCmd()
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	cmd.SetArgs([]string{"--traces", shared, "--out", out, "--synth", "spread=1.2"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "spread must be in [0, 1)") {
		t.Errorf("--synth spread=1.2: %v", err)
	}
}

// fanin sim --cost charges the service with the file's figures and the report says so; --broker,
// --oracle-period and --oracle-startup reach the model; a bad cost file is refused, named.
func TestSimCostFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wl := filepath.Join(dir, "jobs.json")
	if err := os.WriteFile(wl, []byte(`{"jobs": [{"id": "g", "arrival_s": 0, "duration_s": 30, "params": 1000000, "step_times_s": [[0.5, 0.6]]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cost := filepath.Join(dir, "cost.json")
	c := sim.ServiceCost{Date: "2026-11-26 19:00 UTC", Machine: "a test machine", Commit: "0123abc", BrokerCPUPerByteIn: 2e-9,
		BrokerCPUPerByteOut: 1e-9, RuntimeCPUPerByte: 4e-9, KernelCPUPerByte: 1e-9}
	if err := os.WriteFile(cost, c.MarshalIndent(), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		t.Helper()
		out := t.TempDir()
		cmd := simCmd()
		var stdout bytes.Buffer
		cmd.SetOut(&stdout)
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		cmd.SetArgs(append([]string{"--workload", wl, "--duration", "40s", "--out", out, "--slow-fraction", "0"}, args...))
		if err := cmd.Execute(); err != nil {
			return "", err
		}
		report, err := os.ReadFile(filepath.Join(out, "report.md"))
		return string(report), err
	}
	report, err := run("--cost", cost, "--broker", "pool", "--oracle-period", "2s", "--oracle-startup", "3s")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"the runtimes at 0.25 GB/s of gradient per core-second", "the NATS broker at 2 ns of CPU per byte in and 1 ns per byte out",
		"resized every interval to its demand", "measured 2026-11-26 19:00 UTC on a test machine at 0123abc", "resized every 2s to the most cores busy within it, asked for 3s ahead"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report does not say %q", want)
		}
	}
	report, err = run("--cost", cost, "--throughput", "1e9")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(report, "the runtimes at 1 GB/s of gradient per core-second (as given)") || !strings.Contains(report, "a fixed cluster sized at its peak") {
		t.Errorf("--throughput does not override the cost file's rate, or the broker is not fixed by default")
	}
	if err := os.WriteFile(cost, []byte(`{"broker_cpu_s_per_byte_in": -1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run("--cost", cost); err == nil || !strings.Contains(err.Error(), "--cost") || !strings.Contains(err.Error(), "broker_cpu_s_per_byte_in") {
		t.Errorf("a negative broker cost: %v", err)
	}
	if _, err := run("--broker", "elastic"); err == nil || !strings.Contains(err.Error(), `broker must be "fixed", "pool", "in-runtimes" or "none"`) {
		t.Errorf("--broker elastic: %v", err)
	}
}
