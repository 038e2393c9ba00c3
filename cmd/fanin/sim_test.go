package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fanin sim reads every trace file of --traces: a PAI trace added next to the shared ones is drawn
// from and named in the report, and a workload file (--workload) can follow it by its name.
func TestSimUsesAnExtraTraceFile(t *testing.T) {
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
