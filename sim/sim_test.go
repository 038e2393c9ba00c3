package sim

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/autoscaler"
)

// tracesDir is ../shared/traces from the repository root, seen from this package's directory.
const tracesDir = "../../shared/traces"

func traces(t *testing.T) *Traces {
	t.Helper()
	tr, err := LoadTraces(tracesDir)
	if err != nil {
		t.Skipf("the shared traces are not at %s (they live next to the repository): %v", tracesDir, err)
	}
	return tr
}

// short is a small multi-job scenario: 20 simulated minutes, 2 jobs a minute.
func short() Config {
	c := DefaultConfig()
	c.Duration = 20 * time.Minute
	c.Rate = 2
	c.MaxJob = 10 * time.Minute
	return c
}

func TestLoadTraces(t *testing.T) {
	tr := traces(t)
	if got := tr.PAINames(); !slices.Equal(got, []string{"pai-1", "pai-2", "pai-3"}) {
		t.Fatalf("PAI traces %v", got)
	}
	for name, its := range tr.PAI {
		if len(its) < 200 {
			t.Errorf("%s: %d iterations", name, len(its))
		}
		for i, row := range its {
			if len(row) != 10 {
				t.Fatalf("%s iteration %d: %d workers, want 10", name, i, len(row))
			}
			for _, v := range row {
				if v <= 0 || v > 1000 {
					t.Fatalf("%s iteration %d: time %v outside (0, 1000]", name, i, v)
				}
			}
		}
	}
	if len(tr.Philly) != 83154 {
		t.Errorf("%d Philly run times, want 83154", len(tr.Philly))
	}
	var read []string
	for _, f := range tr.Files {
		read = append(read, f.Name+"="+f.Trace)
	}
	if want := []string{"pai-minibatch-job_1_norm.csv=pai-1", "pai-minibatch-job_2_norm.csv=pai-2",
		"pai-minibatch-job_3_norm.csv=pai-3", "philly-job-runtime.csv="}; !slices.Equal(read, want) {
		t.Errorf("files read %v, want %v", read, want)
	}
	if _, err := LoadTraces(t.TempDir()); err == nil {
		t.Errorf("no error from an empty directory")
	}
}

func TestGenerate(t *testing.T) {
	tr := traces(t)
	c := short()
	a, err := Generate(c, tr)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Generate(c, tr)
	if !bytes.Equal(a.MarshalIndent(), b.MarshalIndent()) {
		t.Fatalf("the same seed gives different workloads")
	}
	if n := len(a.Jobs); n < 20 || n > 65 {
		t.Errorf("%d jobs at 2/min for 20 minutes", n)
	}
	for _, j := range a.Jobs {
		if j.Arrival < 0 || j.Arrival >= c.Duration.Seconds() || j.Duration < c.MinJob.Seconds() || j.Duration > c.MaxJob.Seconds() {
			t.Errorf("job %+v outside the config", j)
		}
	}
	c.Seed = 2
	other, _ := Generate(c, tr)
	if bytes.Equal(a.MarshalIndent(), other.MarshalIndent()) {
		t.Errorf("seeds 1 and 2 give the same workload")
	}
	c.Rate, c.Jobs = 0, 7
	seven, _ := Generate(c, tr)
	if len(seven.Jobs) > 7 {
		t.Errorf("--jobs 7 gave %d jobs", len(seven.Jobs))
	}
}

func simulate(t *testing.T, o Options) *Report {
	t.Helper()
	rep, err := Simulate(o)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func files(t *testing.T, rep *Report) map[string][]byte {
	t.Helper()
	dir := t.TempDir()
	if err := rep.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = data
	}
	return out
}

func TestSimWritesReportAndPlots(t *testing.T) {
	traces(t)
	rep := simulate(t, Options{Config: short(), Policy: autoscaler.DefaultPolicy(), TracesDir: tracesDir,
		SweepKnob: "target_utilization", SweepValues: []string{"0.6", "1"}})
	fs := files(t, rep)
	if len(fs) != 3 {
		t.Fatalf("wrote %v", slices.Sorted(maps.Keys(fs)))
	}
	md := string(fs["report.md"])
	for _, want := range []string{"# fanin sim report", "| (a) per-job reservation, 1 core(s) per worker |", "| (b) hindsight-tightest static, on fanin |",
		"| (c) realistic oracle, on fanin |", "| (d) per-job parameter server at 0.75 GB/s per core, sized to its peak |",
		"counted: the runtimes at ", "the NATS broker at ", "core-s per GB summed", "mean step slowdown", "| job-time stretch (actual / ideal duration) mean / p99 / max |",
		"| normal | ", "| small models | ", "| large models | ", "Goals: ",
		"## Sweep: target_utilization", "| 0.6 |", "| 1 |", "![pool size against load](pool.svg)",
		"![cost against slowdown](frontier.svg)", "target_utilization: 0.8", "## Jobs", "| j001 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	for name, want := range map[string][]string{
		"pool.svg":     {"pool (reserved)", "decider demand", "mean load", "static provisioning", "realistic oracle", "time (minutes)", "cores", "<polyline"},
		"frontier.svg": {"goal", "x the realistic oracle", "mean step slowdown", "<circle", ">0.6<", ">1<"},
	} {
		svg := string(fs[name])
		if !strings.HasPrefix(svg, `<svg xmlns="http://www.w3.org/2000/svg"`) || !strings.HasSuffix(svg, "</svg>\n") {
			t.Errorf("%s is not an SVG document", name)
		}
		for _, w := range want {
			if !strings.Contains(svg, w) {
				t.Errorf("%s lacks %q", name, w)
			}
		}
	}
	// A point per value, in order.
	if len(rep.Sweep.Points) != 2 || rep.Sweep.Points[0].Value != "0.6" {
		t.Errorf("sweep points %+v", rep.Sweep.Points)
	}
}

func TestSimDeterministic(t *testing.T) {
	traces(t)
	o := Options{Config: short(), Policy: autoscaler.DefaultPolicy(), TracesDir: tracesDir}
	a, b := files(t, simulate(t, o)), files(t, simulate(t, o))
	for name := range a {
		if !bytes.Equal(a[name], b[name]) {
			t.Errorf("%s differs between two runs with seed %d", name, o.Config.Seed)
		}
	}
	o.Config.Seed = 2
	c := files(t, simulate(t, o))
	if bytes.Equal(a["report.md"], c["report.md"]) || bytes.Equal(a["pool.svg"], c["pool.svg"]) {
		t.Errorf("seeds 1 and 2 give the same report")
	}
}

func TestSimSanity(t *testing.T) {
	traces(t)
	p := autoscaler.DefaultPolicy()
	p.MinRuntimes, p.MaxRuntimes = 2, 12
	rep := simulate(t, Options{Config: short(), Policy: p, TracesDir: tracesDir})
	r := rep.Base
	if r.Jobs < 20 || r.Steps < 5000 {
		t.Fatalf("a small run: %d jobs, %d steps", r.Jobs, r.Steps)
	}
	// Bursty jobs share a pool more cheaply than each reserving its peak.
	if r.ElasticCoreSeconds > r.StaticCoreSeconds {
		t.Errorf("elastic %.0f core-s > static %.0f", r.ElasticCoreSeconds, r.StaticCoreSeconds)
	}
	hitMax := false
	for _, s := range r.Pool {
		if s.Runtimes < p.MinRuntimes || s.Runtimes > p.MaxRuntimes {
			t.Fatalf("at %.0fs the pool has %d runtimes, outside [%d, %d]", s.T, s.Runtimes, p.MinRuntimes, p.MaxRuntimes)
		}
		hitMax = hitMax || s.Runtimes == p.MaxRuntimes
	}
	if !hitMax {
		t.Errorf("the load never reached max_runtimes %d: the bound was not exercised", p.MaxRuntimes)
	}
	if r.Slowdown.Mean < 0 || r.Slowdown.P50 > r.Slowdown.P99 || r.Slowdown.P99 > r.Slowdown.Max {
		t.Errorf("slowdown distribution %+v", r.Slowdown)
	}
	// Burst-blind sizing (packing off) costs more than burst-aware.
	p.Packing = false
	p.MaxRuntimes = 100
	blind := simulate(t, Options{Config: short(), Policy: p, TracesDir: tracesDir}).Base
	if blind.ElasticCoreSeconds <= r.ElasticCoreSeconds {
		t.Errorf("packing off %.0f core-s <= packing on %.0f", blind.ElasticCoreSeconds, r.ElasticCoreSeconds)
	}
}

func TestSimWorkloadFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "jobs.json")
	// Two identical jobs, 2 ranks, 1s steps, with no trace: no trace directory needed.
	wl := `{"jobs": [
  {"id": "a", "arrival_s": 0, "duration_s": 120, "params": 5000000, "step_times_s": [[0.8, 1.0], [0.85, 1.0]]},
  {"id": "b", "arrival_s": 30, "duration_s": 60, "params": 5000000, "step_times_s": [[0.9, 1.0]]}
]}`
	if err := os.WriteFile(path, []byte(wl), 0o644); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.Duration = 3 * time.Minute
	c.SlowFraction = 0
	rep := simulate(t, Options{Config: c, Policy: autoscaler.DefaultPolicy(), TracesDir: filepath.Join(dir, "none"), WorkloadFile: path})
	r := rep.Base
	if r.Jobs != 2 || len(r.JobRows) != 2 {
		t.Fatalf("jobs %d rows %+v", r.Jobs, r.JobRows)
	}
	// 5M params = 20 MB = 5 shards of 4 MiB; 2 ranks.
	if j := r.JobRows[0]; j.Shards != 5 || j.Ranks != 2 || j.Steps < 100 {
		t.Errorf("job a: %+v", j)
	}
	// Two small jobs on a warm runtime: hardly slowed.
	if r.Slowdown.Mean > 0.01 {
		t.Errorf("mean slowdown %.4f", r.Slowdown.Mean)
	}
	if !strings.Contains(string(rep.Markdown()), "read from jobs.json") {
		t.Errorf("report does not name the workload file")
	}
	// Unknown fields and bad jobs are rejected.
	for _, bad := range []string{
		`{"jobs": [{"id": "a", "arrival_s": 0, "duration_s": 1, "params": 1, "step_times_s": [[1]], "extra": 1}]}`,
		`{"jobs": [{"id": "a", "arrival_s": 0, "duration_s": 1, "params": 1}]}`,
		`{"jobs": [{"id": "a", "arrival_s": 0, "duration_s": 1, "params": 1, "step_times_s": [[1, 2], [1]]}]}`,
		`{"jobs": [{"id": "a", "arrival_s": 0, "duration_s": 1, "params": 1, "trace": "pai-9"}]}`,
	} {
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Simulate(Options{Config: c, Policy: autoscaler.DefaultPolicy(), TracesDir: tracesDir, WorkloadFile: path}); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func TestSimModel(t *testing.T) {
	// One job alone on a big pool: every step runs as on its static cores, so no slowdown; its
	// static reservation is ceil(work / median spread) cores.
	c := quiet(2 * time.Minute)
	p := autoscaler.DefaultPolicy()
	p.MinRuntimes, p.CoresPerRuntime = 4, 16
	wl := &Workload{Jobs: []JobSpec{{ID: "a", Arrival: 0, Duration: 120, Params: 25_600_000,
		StepTimes: [][]float64{{0.8, 0.9, 1.0, 1.0}}}}}
	r, err := Run(c, p, wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	// 102.4 MB x 4 ranks / 2 GB/s = 0.2048 core-s per step over a 0.2s spread: 2 cores.
	j := r.JobRows[0]
	if j.StaticCores != 2 || j.WorkPerStep < 0.2047 || j.WorkPerStep > 0.2049 {
		t.Errorf("static cores %d, work %.4f", j.StaticCores, j.WorkPerStep)
	}
	if r.Slowdown.Max > 1e-9 {
		t.Errorf("slowdown on an idle pool: %+v", r.Slowdown)
	}
	if want := 2.0 * 120; r.StaticCoreSeconds != want {
		t.Errorf("static %.1f core-s, want %.1f", r.StaticCoreSeconds, want)
	}
}

// writePAI writes a PAI mini-batch trace of iters iterations of 4 workers whose ranks arrive in two
// groups: workers 0 and 1 at about 500, workers 2 and 3 at about 900 (a spread of 80% of a step).
func writePAI(t *testing.T, path string, iters int) {
	t.Helper()
	var b strings.Builder
	b.WriteString(",worker,gpu,time,batch_time_norm\n")
	n := 0
	for it := 1; it <= iters; it++ {
		for w, base := range []int{500, 510, 900, 880} {
			fmt.Fprintf(&b, "%d,%d,25,%d,%d\n", n, w, it, base+(it*7+w*13)%40)
			n++
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Every trace file of the directory is read, whatever its name: a new PAI trace is drawn from like
// the others, a workload file can name it, and the report lists the files read and how many jobs
// follow each. A CSV file in neither format, or two files of one trace name, are errors.
func TestSimReadsEveryTraceFile(t *testing.T) {
	dir := t.TempDir()
	writePAI(t, filepath.Join(dir, "two-groups.csv"), 50)
	writePAI(t, filepath.Join(dir, "pai-minibatch-job_7_norm.csv"), 30)
	if err := os.WriteFile(filepath.Join(dir, "runtimes.csv"), []byte("runtime\n120\n300\n600\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("not a trace\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tr, err := LoadTraces(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := tr.PAINames(); !slices.Equal(got, []string{"pai-7", "two-groups"}) {
		t.Fatalf("PAI traces %v", got)
	}
	if its := tr.PAI["two-groups"]; len(its) != 50 || len(its[0]) != 4 || its[0][2] < 880 {
		t.Fatalf("two-groups: %d iterations, first %v", len(its), its[0])
	}
	if !slices.Equal(tr.Philly, []float64{120, 300, 600}) {
		t.Fatalf("run times %v", tr.Philly)
	}

	// Drawn: jobs follow both traces; the report names the files.
	c := short()
	c.Duration, c.Rate, c.SlowFraction = 5*time.Minute, 3, 0
	rep := simulate(t, Options{Config: c, Policy: autoscaler.DefaultPolicy(), TracesDir: dir})
	follow := map[string]int{}
	for _, j := range rep.Workload.Jobs {
		follow[j.Trace]++
	}
	if follow["two-groups"] == 0 || follow["pai-7"] == 0 || len(follow) != 2 {
		t.Fatalf("jobs by trace %v", follow)
	}
	md := string(rep.Markdown())
	for _, want := range []string{
		fmt.Sprintf("- two-groups.csv (two-groups: 50 iterations of 4 workers): %d of the workload's jobs", follow["two-groups"]),
		fmt.Sprintf("- pai-minibatch-job_7_norm.csv (pai-7: 30 iterations of 4 workers): %d of the workload's jobs", follow["pai-7"]),
		"- runtimes.csv (3 run times)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report does not say %q", want)
		}
	}

	// A workload file names the new trace; no run times are needed for it.
	if err := os.Remove(filepath.Join(dir, "runtimes.csv")); err != nil {
		t.Fatal(err)
	}
	wl := filepath.Join(t.TempDir(), "jobs.json")
	if err := os.WriteFile(wl, []byte(`{"jobs": [{"id": "g", "arrival_s": 0, "duration_s": 60, "params": 1000000, "trace": "two-groups", "offset": 3}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Duration = time.Minute
	rep = simulate(t, Options{Config: c, Policy: autoscaler.DefaultPolicy(), TracesDir: dir, WorkloadFile: wl})
	if j := rep.Base.JobRows[0]; j.Trace != "two-groups" || j.Ranks != 4 || j.Steps < 10 {
		t.Errorf("job g: %+v", j)
	}
	if !strings.Contains(string(rep.Markdown()), "two-groups.csv (two-groups: 50 iterations of 4 workers): 1 of the workload's jobs") {
		t.Errorf("the report does not name the trace file the job follows")
	}
	// Drawing needs run times.
	if _, err := Simulate(Options{Config: c, Policy: autoscaler.DefaultPolicy(), TracesDir: dir}); !errors.Is(err, ErrNoTraces) {
		t.Errorf("drawn without run times: %v", err)
	}

	for name, content := range map[string]string{
		"other.csv":      "a,b\n1,2\n",                                       // neither format
		"two-groups.CSV": ",worker,gpu,time,batch_time_norm\n0,0,25,1,500\n", // the same trace name again
	} {
		bad := t.TempDir()
		writePAI(t, filepath.Join(bad, "two-groups.csv"), 5)
		if err := os.WriteFile(filepath.Join(bad, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadTraces(bad); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("with %s: %v, want an error naming it", name, err)
		}
	}
}
